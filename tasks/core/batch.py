"""The one batch runtime: every stage's unit of work, checkpoint and retry.

A stage describes one batch as a `BatchSpec` (where its part and journal live, how to read its records,
the work for one record, the row to keep when the endpoint rejects a record, the part's schema);
`run_batch` does the rest, the same way for every stage:
  1. returns at once when the part exists and is whole (resume); a corrupt part is moved aside and redone;
  2. otherwise runs the records with `concurrency` in flight through the process's gateway, replaying
     finished calls from the batch journal (a killed batch repeats at most the calls that were in flight);
  3. writes the part atomically and returns its counts; when the batch raises instead, it leaves a failure
     marker where its part goes (storage/parts.py mark_failed: `evolforge status` shows it failed, not pending),
     removed when the batch runs again.
A record whose request the endpoint rejects as bad (HTTP 400/422) is kept as the stage's error row;
transient failures that outlast the gateway's retries fail the batch (its finished calls stay journaled),
so the orchestrator retries it; auth, unknown model and a down endpoint are fatal (`is_fatal`) and stop the run.

Also here: the gateway registry (one client, semaphore and ledger file per process, run and endpoint),
the batch journal context, and `run_records`, the bounded-concurrency record loop.
Nothing here imports Prefect: the batch tasks and their retry policy live in flows/_fanout.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from evolforge.config.settings import Settings
from evolforge.storage import parts
from evolforge.storage.folder import StageFolder
from evolforge.storage.fs import AnyPath, exists
from evolforge.storage.journal import CallJournal
from evolforge.storage.ledger import LedgerWriter
from evolforge.tasks.core import progress as live_progress
from evolforge.tasks.core import stopping
from evolforge.tasks.core.gateway import EndpointDown, Gateway, GatewayError

log = logging.getLogger("evolforge.batch")

Progress = Callable[[int, int], None]

_GATEWAYS: dict[tuple, Gateway] = {}
_GATEWAYS_LOCK = threading.Lock()


@lru_cache(maxsize=16)
def settings_from_json(settings_json: str) -> Settings:
    """Settings as a batch task receives them (a JSON string: a stable cache key), parsed once per process."""
    return Settings.model_validate_json(settings_json)


def gateway_for(settings: Settings, base_url: str, run_id: str, out_dir: str | Path) -> Gateway:
    """One gateway (client, semaphore, ledger file) per process, run and endpoint."""
    layout = StageFolder(out_dir)
    key = (base_url, run_id, str(layout.root), hashlib.sha1(settings.model_dump_json().encode()).hexdigest())
    with _GATEWAYS_LOCK:
        gw = _GATEWAYS.get(key)
        if gw is None:
            embedded = {settings.embedded.alias} if settings.uses_embedded_model else set()
            gw = Gateway(settings, base_url=base_url, run_id=run_id,
                         ledger=LedgerWriter(layout.ledger_dir, run_id, settings.storage.remote_log_flush_seconds),
                         embedded_models=embedded)
            gw._unregister_flush = stopping.on_exit(gw.ledger.flush)  # a forced exit keeps the ledger rows
            _GATEWAYS[key] = gw
        return gw


@contextlib.contextmanager
def batch_journal(gw: Gateway, path, settings: Settings):
    """A batch's call journal; when the batch ends or fails, its journal and the ledger rows reach the store
    (on a remote output folder they are otherwise flushed within storage.remote_log_flush_seconds).

    Entries the store refuses are kept and fail the batch with `LogFlushError` (transient: retried). When the
    batch failed already, its own error is raised (a fatal one must stay fatal) with the log error as a note."""
    journal = CallJournal(path, settings.storage.remote_log_flush_seconds)
    flushes = [journal.close] + ([gw.ledger.flush] if gw.ledger is not None else [])
    unregister = stopping.on_exit(journal.close)  # a forced exit (a stopped run) delivers its entries too
    try:
        yield journal
    except BaseException as e:
        unregister()
        for flush in flushes:
            try:
                flush()
            except Exception as log_error:  # noqa: BLE001 - reported on the batch's own error
                e.add_note(f"also: {log_error}")
        raise
    unregister()
    first: Exception | None = None
    for flush in flushes:  # both run even when the first fails
        try:
            flush()
        except Exception as log_error:  # noqa: BLE001 - raised below
            first = first or log_error
    if first is not None:
        raise first


def close_gateways(run_id: str) -> None:
    """Close the clients and ledger files of a run in this process (end of the flow)."""
    with _GATEWAYS_LOCK:
        for key in [k for k in _GATEWAYS if k[1] == run_id]:
            gw = _GATEWAYS.pop(key)
            getattr(gw, "_unregister_flush", lambda: None)()
            gw.close()
            if gw.ledger is not None:
                gw.ledger.close()


def is_fatal(err: BaseException) -> bool:
    """The endpoint is down or refuses the request for good (auth, unknown model): retrying cannot help."""
    if isinstance(err, EndpointDown):
        return True
    return isinstance(err, GatewayError) and err.fatal


def is_rejected_record(err: BaseException) -> bool:
    """The endpoint rejected this one record's request (400/422): keep the record as an error row."""
    return isinstance(err, GatewayError) and not err.fatal and not err.retryable


_LANES: dict[int, ThreadPoolExecutor] = {}  # pid -> the process's record threads (a forked child makes its own)
_LANES_LOCK = threading.Lock()
LANE_THREADS_MAX = 4096  # threads are made on demand: as many as lanes were ever in flight at once


def _lane_pool() -> ThreadPoolExecutor:
    """The threads every batch of this process runs its records on. They outlive a batch: a batch of 128
    records at 50 in flight used to start 50 threads of its own, a cost that grew with the GIL's contention."""
    pid = os.getpid()
    with _LANES_LOCK:
        pool = _LANES.get(pid)
        if pool is None:
            _LANES.clear()
            pool = _LANES[pid] = ThreadPoolExecutor(LANE_THREADS_MAX, thread_name_prefix="records")
        return pool


def run_records(fn: Callable, rows: list, workers: int, name: str,
                progress: Progress | None = None, progress_step: int = 1) -> list:
    """`fn(row)` for every row with `workers` in flight; results in row order.

    `workers` lanes on the process's record threads each take the next row not started, until none is left.
    Every row finishes (and journals its calls) before a failure is raised; the
    error raised is a stop (RunStopped: a row not started yet starts no work), else the first fatal one, else
    the first one.
    """
    results: list = []
    first_error: BaseException | None = None
    futures = [Future() for _ in rows]
    order = iter(range(len(rows)))
    take = threading.Lock()

    def lane() -> None:
        threading.current_thread().name = f"{name}-records"  # the batch it works for, in tracebacks and py-spy
        while True:
            with take:
                i = next(order, None)
            if i is None:
                return
            try:
                stopping.check()
                futures[i].set_result(fn(rows[i]))
            except BaseException as e:  # noqa: BLE001 - the row's error, raised to the batch below
                futures[i].set_exception(e)

    if rows:
        pool = _lane_pool()
        for _ in range(max(1, min(workers, len(rows)))):
            pool.submit(lane)
    for i, fut in enumerate(futures, 1):
        try:
            results.append(fut.result())
            if progress and (i % progress_step == 0 or i == len(rows)):
                progress(i, len(rows))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            if isinstance(first_error, stopping.RunStopped):
                continue
            if first_error is None or isinstance(e, stopping.RunStopped) or (
                    is_fatal(e) and not is_fatal(first_error)):
                first_error = e
    if first_error is not None:
        raise first_error
    return results


@dataclass
class BatchSpec:
    """One batch of one stage: what `run_batch` needs to know."""

    name: str                                            # short, for thread names and logs ("r2b7", "irm3")
    part: AnyPath                                        # the checkpoint: written once, atomically
    journal: AnyPath                                     # the batch's call journal
    schema: pa.Schema                                    # the part's schema
    load_rows: Callable[[], list[dict]]                  # the batch's input records
    work: Callable[[dict, Gateway, CallJournal], dict]   # one record -> one output row
    on_rejected: Callable[[dict, GatewayError], dict]    # the row kept when the endpoint rejects a record
    concurrency: int                                     # records in flight
    extra_stats: Callable[[list[str]], dict] | None = None  # stage-specific counts from the rows' statuses


def run_batch(spec: BatchSpec, settings: Settings, base_url: str, run_id: str, out_dir: str | Path,
              progress: Progress | None = None) -> dict:
    """Run (or skip, when checkpointed) one batch; returns part, rows, by_status, skipped, replayed_calls.
    `progress(done, total)` is called about ten times per batch; the same counts reach tasks/core/progress.py."""
    if exists(spec.part):
        try:
            return _stats(spec, parts.read_part(spec.part).column("status").to_pylist(), skipped=True)
        except parts.CorruptPart as e:
            moved = parts.quarantine(spec.part)
            log.warning("corrupt checkpoint %s (%s): moved to %s, redoing the batch", spec.part, e, moved.name)
    rows = spec.load_rows()
    gw = gateway_for(settings, base_url, run_id, out_dir)

    def one(row: dict) -> dict:
        try:
            return spec.work(row, gw, journal)
        except GatewayError as e:
            if not is_rejected_record(e):
                raise
            return spec.on_rejected(row, e)

    def tick(done: int, total: int) -> None:  # the live progress sees the records of running batches
        live_progress.report_records(str(spec.part), done, total)
        if progress:
            progress(done, total)

    replayed_before = gw.stats.replayed
    live_progress.report_records(str(spec.part), 0, len(rows))
    parts.clear_failed(spec.part)  # an earlier attempt's failure: this one runs now
    try:
        with batch_journal(gw, spec.journal, settings) as journal:
            results = run_records(one, rows, spec.concurrency, spec.name, tick, max(1, len(rows) // 10))
        table = pa.Table.from_pylist(results, schema=spec.schema)
        parts.write_table_atomic(table, spec.part)
    except BaseException as e:
        live_progress.batch_ended(str(spec.part))  # its records are not done
        _mark_failed(spec.part, e)
        raise
    stats = _stats(spec, table.column("status").to_pylist(), skipped=False)
    stats["replayed_calls"] = gw.stats.replayed - replayed_before
    return stats


def _mark_failed(part: AnyPath, error: BaseException) -> None:
    """The batch's failure marker (what `evolforge status` reads); never hides the batch's own error."""
    if not isinstance(error, Exception):
        return  # stopped (Ctrl-C, a cancelled run), not failed: the batch is pending
    try:
        parts.mark_failed(part, error)
    except Exception:  # noqa: BLE001 - the store may be what failed (a full disk)
        log.debug("could not write the failure marker of %s", part, exc_info=True)


def _stats(spec: BatchSpec, statuses: list[str], skipped: bool) -> dict[str, Any]:
    by_status: dict[str, int] = {}
    for s in statuses:
        by_status[s] = by_status.get(s, 0) + 1
    stats: dict[str, Any] = {"part": str(spec.part), "rows": len(statuses), "by_status": by_status,
                             "skipped": skipped}
    if spec.extra_stats:
        stats.update(spec.extra_stats(statuses))
    return stats
