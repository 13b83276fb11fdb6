"""Live progress of a batched stage: the numbers, computed from the batch results, the records of the
batches in flight and the cost ledger; nothing here renders (flows/_fanout.py puts them in the Prefect
progress artifact, the CLI draws them in the terminal) and nothing imports Prefect or rich.

    StageProgress        one round or stage: records done / total, accepted, calls/s, tokens/s, cost, ETA;
                         with `settles` naming a step that runs after the batches and drops some of what they
                         accepted (an evolve round's dedup), the count is labelled "accepted before <step>" until
                         `settled(final)` gives the stage's own final count (the one its summary shows)
    progress_line(snap)  the same numbers as one line of text (the artifact's description, plain terminals)
    report_records(...)  `run_batch` reports a running batch's records here (this process's batches only:
                         batches on Dask / Ray workers count when they finish)
    listening(fn)        `fn(snapshot)` receives every snapshot published while the block runs (the CLI)
    StepProgress         a stage without batches, counted in its own unit (training steps, sessions,
                         conversations): done / total, the rate, ETA and a short detail (the loss, the reward);
                         its snapshot has the same keys (plus `unit`, `detail`), so the same views show it
    trainer_callback(p)  a transformers TrainerCallback reporting a Trainer's optimizer steps to `p`
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from evolforge.storage.status import ACCEPTED_STATUSES

log = logging.getLogger("evolforge.progress")

_lock = threading.Lock()
_running: dict[str, tuple[int, int]] = {}  # batch part path -> (records done, records in the batch)
_listeners: list[Callable[[dict], None]] = []


def report_records(part: str, done: int, total: int) -> None:
    with _lock:
        _running[part] = (done, total)


def batch_ended(part: str) -> None:
    """Forget a batch: it failed, or its result reached the flow (which counts its records from then on).
    A finished batch stays reported as all done until then, so no record drops out of the count between."""
    with _lock:
        _running.pop(part, None)


def records_running(prefix: str) -> tuple[int, int, int]:
    """(records done, records, batches) of the batches running in this process whose part is under `prefix`."""
    with _lock:
        rows = [v for k, v in _running.items() if k.startswith(prefix)]
    return sum(d for d, _ in rows), sum(t for _, t in rows), len(rows)


@contextlib.contextmanager
def listening(fn: Callable[[dict], None]):
    with _lock:
        _listeners.append(fn)
    try:
        yield fn
    finally:
        with _lock:
            _listeners.remove(fn)


def publish(snapshot: dict) -> None:
    with _lock:
        listeners = list(_listeners)
    for fn in listeners:
        try:
            fn(snapshot)
        except Exception:  # noqa: BLE001 - a broken display never stops a run
            log.debug("progress listener failed", exc_info=True)


@dataclass
class StageProgress:
    """The running numbers of one round or stage (`what`) of `batches` batches."""

    what: str
    batches: int
    started: float = field(default_factory=time.monotonic)
    batches_done: int = 0
    batches_failed: int = 0
    batch_rows: int = 0          # records in finished batches
    skipped_rows: int = 0        # ... of which were checkpointed by an earlier run (not this run's speed)
    accepted: int = 0
    running_done: int = 0        # records done in batches still running
    running_rows: int = 0        # records in batches still running
    running_batches: int = 0
    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    finished: bool = False
    settles: str = ""            # a step after the batches that changes the accepted count ("dedup"), if any
    settled_accepted: int | None = None  # the count after that step (None: not run yet)

    def batch_finished(self, result: dict | None) -> None:
        """A batch ended: its result (rows, by_status, skipped), or None when it failed."""
        if result is None:
            self.batches_failed += 1
            return
        self.batches_done += 1
        rows = int(result.get("rows") or 0)
        self.batch_rows += rows
        if result.get("skipped"):
            self.skipped_rows += rows
        self.accepted += sum(n for s, n in (result.get("by_status") or {}).items() if s in ACCEPTED_STATUSES)

    def settled(self, accepted: int) -> None:
        """The step after the batches ran: `accepted` is the final count (what the stage's summary says)."""
        self.settled_accepted = int(accepted)

    def running(self, done: int, rows: int, batches: int) -> None:
        self.running_done, self.running_rows, self.running_batches = done, rows, batches

    def add_calls(self, ledger_rows) -> None:
        """New cost-ledger rows (a polars DataFrame, storage/ledger.py schema)."""
        if ledger_rows is None or not ledger_rows.height:
            return
        self.calls += ledger_rows.height
        self.tokens += int((ledger_rows["prompt_tokens"].fill_null(0) + ledger_rows["completion_tokens"].fill_null(0)).sum())
        self.unpriced_calls += int(ledger_rows["cost_usd"].null_count())
        self.cost_usd += float(ledger_rows["cost_usd"].fill_null(0).sum())

    def snapshot(self) -> dict:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        done = self.batch_rows + self.running_done
        seen = self.batches_done + self.running_batches
        ended = self.batches_done + self.batches_failed
        if ended >= self.batches:
            total: int | None = done
        elif seen:  # batches not started yet are as large as the ones seen so far
            known = self.batch_rows + self.running_rows
            total = known + round(known / seen * (self.batches - ended - self.running_batches))
        else:
            total = None
        fresh = done - self.skipped_rows
        rate = fresh / elapsed if fresh > 0 else 0.0
        eta = None
        if total is not None and rate > 0:
            eta = max(total - done, 0) / rate
        elif self.finished:
            eta = 0.0
        return {
            "what": self.what, "finished": self.finished, "elapsed_s": round(elapsed, 1),
            "batches": self.batches, "batches_done": self.batches_done, "batches_failed": self.batches_failed,
            "records_done": done, "records_total": total,
            "accepted": self.accepted if self.settled_accepted is None else self.settled_accepted,
            "accepted_before": self.accepted, "settles": self.settles,
            "settled": bool(self.settles) and self.settled_accepted is not None,
            "fraction": (done / total) if total else (ended / self.batches if self.batches else 1.0),
            "calls": self.calls, "tokens": self.tokens,
            "calls_per_s": round(self.calls / elapsed, 2), "tokens_per_s": round(self.tokens / elapsed, 1),
            "cost_usd": None if self.unpriced_calls else round(self.cost_usd, 6),
            "unpriced_calls": self.unpriced_calls, "eta_s": None if eta is None else round(eta, 1),
        }


class StepProgress:
    """Progress of a stage without batches: `done` of `total` `unit`s, published on every `update` (the
    views throttle). `what` names the bar ("train irm", "GRPO"); the snapshot keeps StageProgress's keys."""

    def __init__(self, what: str, total: int | None, unit: str = "steps"):
        self.what, self.total, self.unit = what, total, unit
        self.done = 0
        self.detail = ""
        self.finished = False
        self.started = time.monotonic()

    def update(self, done: int | None = None, *, total: int | None = None, detail: str | None = None,
               advance: int = 0) -> None:
        if total is not None:
            self.total = total
        self.done = (self.done if done is None else done) + advance
        if detail is not None:
            self.detail = detail
        publish(self.snapshot())

    def finish(self, detail: str | None = None) -> None:
        self.finished = True
        if self.total is None or self.done > self.total:
            self.total = self.done
        self.update(detail=detail)

    def snapshot(self) -> dict:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = self.done / elapsed
        total = self.total
        eta = 0.0 if self.finished else (max(total - self.done, 0) / rate if total is not None and rate > 0 else None)
        return {
            "what": self.what, "unit": self.unit, "detail": self.detail, "finished": self.finished,
            "elapsed_s": round(elapsed, 1), "batches": 0, "batches_done": 0, "batches_failed": 0,
            "records_done": self.done, "records_total": total, "accepted": 0,
            "fraction": min(self.done / total, 1.0) if total else (1.0 if self.finished else 0.0),
            "per_s": round(rate, 3), "calls": 0, "tokens": 0, "calls_per_s": 0.0, "tokens_per_s": 0.0,
            "cost_usd": 0.0, "unpriced_calls": 0, "eta_s": None if eta is None else round(eta, 1),
        }


@contextlib.contextmanager
def counting(what: str, total: int | None, unit: str = "steps"):
    """A StepProgress published at the start and, when the block ends without an error, as finished."""
    p = StepProgress(what, total, unit)
    p.update()
    yield p
    p.finish()


def trainer_callback(progress: StepProgress):
    """A transformers TrainerCallback: each optimizer step of the Trainer (state.global_step of
    state.max_steps) and its logged loss / reward reach `progress`."""
    from transformers import TrainerCallback

    class ProgressCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            progress.update(state.global_step, total=state.max_steps or None)

        def on_step_end(self, args, state, control, **kw):
            progress.update(state.global_step, total=state.max_steps or None)

        def on_log(self, args, state, control, logs=None, **kw):
            shown = [(k, logs[k]) for k in ("loss", "reward", "kl")  # not a stage: TRL's logged metrics
                     if (logs or {}).get(k) is not None]
            if shown and "train_runtime" not in logs:
                progress.detail = ", ".join(f"{k} {float(v):.4g}" for k, v in shown)

    return ProgressCallback()


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def rate_text(snap: dict) -> str:
    """The speed of a StepProgress snapshot: units per second, or seconds per unit when slower than one a second."""
    rate, unit = snap["per_s"], snap["unit"]
    if rate <= 0:
        return f"0 {unit}/s"
    return f"{rate:.2f} {unit}/s" if rate >= 1 else f"{1 / rate:.1f} s per {unit.rstrip('s') or unit}"


def cost_text(snap: dict) -> str:
    return "unpriced" if snap["cost_usd"] is None else f"${snap['cost_usd']:.4f}"


def accepted_text(snap: dict) -> str:
    """"N accepted"; for a stage whose step after the batches drops some (`settles`): "N accepted before dedup"
    until it ran, then the final "N accepted (D dropped by dedup)" (D omitted when 0)."""
    step = snap.get("settles")
    if not step:
        return f"{snap['accepted']} accepted"
    if not snap.get("settled"):
        return f"{snap['accepted']} accepted before {step}"
    dropped = snap["accepted_before"] - snap["accepted"]
    return f"{snap['accepted']} accepted" + (f" ({dropped} dropped by {step})" if dropped > 0 else "")


def progress_line(snap: dict) -> str:
    """One line with every figure: what the progress artifact and a plain (non-terminal) output show."""
    if snap.get("unit"):  # a stage without batches (StepProgress)
        total = "?" if snap["records_total"] is None else snap["records_total"]
        detail = f", {snap['detail']}" if snap.get("detail") else ""
        return (f"{snap['what']}: {snap['records_done']}/{total} {snap['unit']} ({snap['fraction']:.0%}), "
                f"{rate_text(snap)}{detail}, " + ("done in " + duration(snap["elapsed_s"]) if snap["finished"]
                                                  else "ETA " + duration(snap["eta_s"])))
    total = "?" if snap["records_total"] is None else snap["records_total"]
    failed = f", {snap['batches_failed']} failed" if snap["batches_failed"] else ""
    return (f"{snap['what']}: {snap['records_done']}/{total} records ({snap['fraction']:.0%}), "
            f"{accepted_text(snap)}, batches {snap['batches_done']}/{snap['batches']}{failed}, "
            f"{snap['calls']} calls ({snap['calls_per_s']:.2f}/s), {snap['tokens_per_s']:.0f} tokens/s, "
            f"cost {cost_text(snap)}, " + ("done in " + duration(snap["elapsed_s"]) if snap["finished"]
                                            else "ETA " + duration(snap["eta_s"])))
