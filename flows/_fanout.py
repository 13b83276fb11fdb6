"""The batch task options and the one fan-out every batched stage uses.

`BATCH_TASK_OPTIONS`: every batch task is retried on transient failures only (a down endpoint, a bad key or
a full disk stops at once), and its result is persisted and cached on inputs + source, so a retried flow
run skips the batches that finished.

`run_batches`: submit one task per batch, publish live progress (records, accepted, calls/s, tokens/s,
cost, ETA: tasks/core/progress.py) to the terminal and a Prefect progress artifact, collect every result,
and when batches failed raise one clear error (a down endpoint is reported first) naming the failed batches and where the
finished ones are checkpointed.
"""

from __future__ import annotations

import errno
import queue
import threading
import time
from typing import Any, Callable, Sequence

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE
from prefect.futures import as_completed
from prefect.tasks import exponential_backoff

from evolforge.storage.ledger import LedgerTail
from evolforge.tasks.core import progress as live_progress
from evolforge.tasks.core import stopping
from evolforge.tasks.core.batch import is_fatal
from evolforge.tasks.core.gateway import EndpointDown

_STORAGE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM}


def retry_transient(task, task_run, state) -> bool:
    """Retry a batch on transient failures only; a down endpoint, a bad key or a full disk stops at once, and
    nothing is retried once a signal stops the run."""
    if stopping.requested() is not None:
        return False
    try:
        state.result()
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            return False
        return not is_fatal(e)
    return True


# The progress artifact is updated when a batch ends, at most every ARTIFACT_MIN_AGE seconds (each update is an
# API call from the flow's thread: 80 batches ending within seconds were 80 calls), at least every ARTIFACT_MAX_AGE,
# and when the last batch ends.
ARTIFACT_MIN_AGE, ARTIFACT_MAX_AGE = 2.0, 10.0

BATCH_TASK_OPTIONS = dict(
    retries=2,
    retry_delay_seconds=exponential_backoff(backoff_factor=5),
    retry_jitter_factor=0.5,
    retry_condition_fn=retry_transient,
    persist_result=True,
    cache_policy=INPUTS + TASK_SOURCE,
)


def _parts_of(result: Any) -> list[str]:
    """The checkpoint parts a batch task wrote (a batch result's `part`, and those of nested results)."""
    if not isinstance(result, dict):
        return []
    nested = [v["part"] for v in result.values() if isinstance(v, dict) and "part" in v]
    return [str(p) for p in ([result["part"]] if "part" in result else []) + nested]


class BatchesFailed(RuntimeError):
    """Some batches of a stage failed; the finished ones are checkpointed."""


def retry_options(retries: int, delay_seconds: float) -> dict:
    """A batch task's retry options from `runner.batch_retries` and `runner.retry_delay_seconds`: the delay doubles
    with each retry."""
    return dict(retries=retries, retry_delay_seconds=exponential_backoff(backoff_factor=delay_seconds)
                if retries and delay_seconds else 0)


def run_batches(runner, task, batches: Sequence[tuple[str, dict[str, Any]]], *, what: str, checkpoints,
                progress_key: str | None = None, poll_seconds: float = 1.0,
                after: tuple[str, Callable[[], int]] | None = None, retry: dict | None = None) -> list[dict]:
    """Run `task` once per (task run name, parameters) on `runner`; results in submission order.

    `what` names the batches in the error ("round 2", "reward-data"); `checkpoints` is where the finished
    batches are kept (their parts are under it). Live progress (tasks/core/progress.py): every
    `poll_seconds` the records done in finished and running batches, the accepted ones and the calls,
    tokens and cost of the ledger rows new since the start (the batches' `out_dir`) are published to the
    terminal listeners; with `progress_key`, a Prefect progress artifact shows the same line, updated
    when a batch ends (at most every 2 s, at least every 10 s, and when the last one ends).

    `after` = (step, fn): a step that runs once every batch succeeded and drops some of what they accepted (an
    evolve round's dedup); `fn()` runs it and returns the final accepted count. Until then the progress says
    "N accepted before <step>"; the stage is shown finished only after it, with the final count (the one the
    stage's summary gives) and how many the step dropped. `retry`: the tasks' retry options (retry_options), else
    the task's own.
    """
    total = len(batches)
    tally = live_progress.StageProgress(what, total, settles=after[0] if after else "")
    out_dir = next((p["out_dir"] for _, p in batches if p.get("out_dir")), None)
    ledger = LedgerTail(out_dir) if out_dir else None
    if ledger is not None:
        ledger.new_rows()  # calls made before this stage (other rounds, the pre-flight) are not its own
    artifact = None
    if progress_key:
        artifact = create_progress_artifact(progress=0.0, key=progress_key,
                                            description=f"{what}: batches done of {total}")
    futures = [runner.submit(task.with_options(task_run_name=name, **(retry or {})), parameters=params)
               for name, params in batches]
    position = {id(f): i for i, f in enumerate(futures)}
    results: list[Any] = [None] * total
    failed: list[tuple[int, BaseException]] = []
    ended: queue.Queue = queue.Queue()

    def collect() -> None:  # finished futures, in the order they finish, for the loop below
        try:
            for fut in as_completed(futures):
                ended.put(fut)
        except BaseException as e:  # noqa: BLE001 - handed to the flow's thread
            ended.put(e)

    threading.Thread(target=collect, name=f"batches-{what}", daemon=True).start()
    live_progress.publish(tally.snapshot())
    last_artifact, remaining = time.monotonic(), total
    while remaining:
        try:
            fut = ended.get(timeout=poll_seconds)
        except queue.Empty:
            fut = None
        if isinstance(fut, BaseException):
            raise fut
        stopping.check()  # a signal stops the run: no batch is waited for (tasks/core/stopping.py)
        if fut is not None:
            remaining -= 1
            i = position[id(fut)]
            try:
                results[i] = fut.result()
                tally.batch_finished(results[i])
                for part in _parts_of(results[i]):  # counted from its result now
                    live_progress.batch_ended(part)
            except BaseException as e:  # noqa: BLE001 - collected, reported once below
                failed.append((i, e))
                tally.batch_finished(None)
        tally.running(*live_progress.records_running(str(checkpoints)))
        if ledger is not None:
            tally.add_calls(ledger.new_rows())
        tally.finished = not remaining and after is None
        snap = tally.snapshot()
        live_progress.publish(snap)
        since = time.monotonic() - last_artifact
        if artifact is not None and (not remaining or since > ARTIFACT_MAX_AGE
                                     or (fut is not None and since > ARTIFACT_MIN_AGE)):
            update_progress_artifact(artifact, progress=round(100.0 * snap["fraction"], 2),
                                     description=live_progress.progress_line(snap))
            last_artifact = time.monotonic()
    if failed:
        failed.sort(key=lambda x: x[0])
        first = next((e for _, e in failed if isinstance(e, EndpointDown)), failed[0][1])
        names = ", ".join(batches[i][0] for i, _ in failed[:20]) + (", ..." if len(failed) > 20 else "")
        raise BatchesFailed(
            f"{what}: {len(failed)} of {total} batches failed ({names}). First error: {first}. "
            f"Finished batches are checkpointed in {checkpoints}; run again over the same output folder, "
            "or retry this flow run, to redo only the failed batches."
        ) from None
    if after is not None:
        tally.settled(after[1]())
        tally.finished = True
        snap = tally.snapshot()
        live_progress.publish(snap)
        if artifact is not None:
            update_progress_artifact(artifact, progress=round(100.0 * snap["fraction"], 2),
                                     description=live_progress.progress_line(snap))
    return results
