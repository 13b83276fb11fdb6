"""One batch of one evolution round: the unit of work, checkpoint and retry.

`run_evolve_batch` is the plain function (tests call it directly);
`evolve_batch_task` is its thin Prefect wrapper: one Prefect task per batch,
never per record. A batch:
  1. returns at once when its part file exists and is whole (resume);
  2. otherwise evolves its records with bounded concurrency, replaying finished
     calls from the batch journal (so a killed batch repeats at most the calls
     that were in flight);
  3. writes its part atomically and returns the part's path and counts.
A record whose request the endpoint rejects as bad (HTTP 400/422) is kept with
status `error`; transient failures that outlast the gateway's retries fail the
batch (its finished calls stay journaled) so Prefect retries it; auth, unknown
model and a down endpoint stop the run.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import pyarrow as pa

from ..config.settings import Settings
from ..storage import parts
from ..storage.fs import exists
from ..storage.journal import CallJournal
from ..storage.layout import RunLayout
from ..storage.ledger import LedgerWriter
from .evolution import LINEAGE_FIELDS, Evolution, evolve_record
from .gateway import EndpointDown, Gateway, GatewayError

log = logging.getLogger("evolforge.evolve_batch")

LINEAGE_SCHEMA = pa.schema(
    [
        ("id", pa.string()), ("parent_id", pa.string()), ("seed_id", pa.string()), ("round", pa.int32()),
        ("operation", pa.string()), ("direction", pa.string()), ("model", pa.string()), ("status", pa.string()),
        ("elimination_rule", pa.string()), ("instruction", pa.string()), ("answer", pa.string()),
        ("judge_verdict", pa.string()), ("domain", pa.string()), ("generation", pa.int32()), ("error", pa.string()),
        ("calls", pa.int32()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
        ("duplicate_of", pa.string()), ("dedup_similarity", pa.float64()),
    ]
)
assert tuple(LINEAGE_SCHEMA.names) == LINEAGE_FIELDS

_GATEWAYS: dict[tuple, Gateway] = {}
_GATEWAYS_LOCK = threading.Lock()


def gateway_for(settings: Settings, base_url: str, run_id: str, out_dir: str | Path) -> Gateway:
    """One gateway (client, semaphore, ledger file) per process, run and endpoint."""
    layout = RunLayout(out_dir)
    key = (base_url, run_id, str(layout.root), hashlib.sha1(settings.model_dump_json().encode()).hexdigest())
    with _GATEWAYS_LOCK:
        gw = _GATEWAYS.get(key)
        if gw is None:
            embedded = {settings.embedded.alias} if settings.uses_embedded_model else set()
            gw = Gateway(settings, base_url=base_url, run_id=run_id,
                         ledger=LedgerWriter(layout.ledger_dir, run_id, settings.storage.remote_log_flush_seconds),
                         embedded_models=embedded)
            _GATEWAYS[key] = gw
        return gw


@contextlib.contextmanager
def batch_journal(gw: Gateway, path, settings: Settings):
    """A batch's call journal; when the batch ends or fails, its journal and the ledger rows reach the store
    (on a remote output folder they are otherwise flushed within storage.remote_log_flush_seconds)."""
    try:
        with CallJournal(path, settings.storage.remote_log_flush_seconds) as journal:
            yield journal
    finally:
        if gw.ledger is not None:
            gw.ledger.flush()


def close_gateways(run_id: str) -> None:
    """Close the clients and ledger files of a run in this process (end of the flow)."""
    with _GATEWAYS_LOCK:
        for key in [k for k in _GATEWAYS if k[1] == run_id]:
            gw = _GATEWAYS.pop(key)
            gw.close()
            if gw.ledger is not None:
                gw.ledger.close()


def is_fatal(err: BaseException) -> bool:
    """The endpoint is down or refuses the request for good (auth, unknown model): retrying cannot help."""
    if isinstance(err, EndpointDown):
        return True
    return isinstance(err, GatewayError) and err.fatal


def run_records(fn: Callable, rows: list, workers: int, name: str,
                progress: Callable[[int, int], None] | None = None, progress_step: int = 1) -> list:
    """`fn(row)` for every row with `workers` in flight; results in row order.

    Every row finishes (and journals its calls) before a failure is raised; the
    error raised is the first fatal one, else the first one.
    """
    results: list = []
    first_error: BaseException | None = None
    with ThreadPoolExecutor(max(1, min(workers, len(rows))), thread_name_prefix=name) as pool:
        futures = [pool.submit(fn, r) for r in rows]
        for i, fut in enumerate(futures, 1):
            try:
                results.append(fut.result())
                if progress and (i % progress_step == 0 or i == len(rows)):
                    progress(i, len(rows))
            except BaseException as e:  # noqa: BLE001 - re-raised below
                if first_error is None or (is_fatal(e) and not is_fatal(first_error)):
                    first_error = e
    if first_error is not None:
        raise first_error
    return results


def _evolve_safely(row: dict, round_no: int, gw: Gateway, settings: Settings, journal: CallJournal) -> Evolution:
    try:
        return evolve_record(row, round_no, gw, settings.evol_instruct, journal)
    except GatewayError as e:
        if is_fatal(e) or e.retryable:
            raise
        # the endpoint rejected this record's request (400/422): keep it, visibly, as an error
        from .evolution import choose_operation, evolution_id
        from .prompts import DIRECTION

        op = choose_operation(settings.evol_instruct, row["id"], row.get("domain") or "general", round_no)
        return Evolution(
            id=evolution_id(row["id"], round_no, op), parent_id=row["id"], seed_id=row["seed_id"], round=round_no,
            operation=op, direction=DIRECTION[op], model=gw.model_for("evolve"), status="error",
            elimination_rule=None, instruction="", answer=None, judge_verdict=None,
            domain=row.get("domain") or "general", generation=int(row.get("generation") or 0) + 1, error=str(e)[:500],
        )


def run_evolve_batch(
    out_dir: str | Path, round_no: int, batch_index: int, settings: Settings, base_url: str, run_id: str,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    layout = RunLayout(out_dir)
    part = layout.part(round_no, batch_index)
    if exists(part):
        try:
            table = parts.read_part(part)
            return _batch_stats(part, table, skipped=True)
        except parts.CorruptPart as e:
            moved = parts.quarantine(part)
            log.warning("corrupt checkpoint %s (%s): moved to %s, redoing the batch", part, e, moved.name)
    rows = parts.read_row_group(layout.round_input(round_no), batch_index).to_pylist()
    gw = gateway_for(settings, base_url, run_id, out_dir)
    with batch_journal(gw, layout.journal(round_no, batch_index), settings) as journal:
        replay_before = gw.stats.replayed
        results: list[Evolution] = run_records(
            lambda r: _evolve_safely(r, round_no, gw, settings, journal), rows, settings.evol_instruct.concurrency,
            f"r{round_no}b{batch_index}", progress, progress_step=max(1, len(rows) // 10))
    table = pa.Table.from_pylist([r.to_row() for r in results], schema=LINEAGE_SCHEMA)
    parts.write_table_atomic(table, part)
    stats = _batch_stats(part, table, skipped=False)
    stats["replayed_calls"] = gw.stats.replayed - replay_before
    return stats


def _batch_stats(part: Path, table: pa.Table, skipped: bool) -> dict:
    status = table.column("status").to_pylist()
    return {
        "part": str(part),
        "rows": table.num_rows,
        "accepted": status.count("accepted"),
        "eliminated": status.count("eliminated"),
        "errors": status.count("error"),
        "skipped": skipped,
    }


# ----------------------------------------------------------------- Prefect wrapper
from prefect import task  # noqa: E402
from prefect.cache_policies import INPUTS, TASK_SOURCE  # noqa: E402
from prefect.tasks import exponential_backoff  # noqa: E402


_STORAGE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM}


def retry_transient(task, task_run, state) -> bool:
    """Retry a batch on transient failures only; a down endpoint, a bad key or a full disk stops at once."""
    try:
        state.result()
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            return False
        return not is_fatal(e)
    return True


# Every batch task of the project: retried on transient failures only, results persisted and cached
# on inputs + source so a retried flow run skips the batches that finished.
BATCH_TASK_OPTIONS = dict(
    retries=2,
    retry_delay_seconds=exponential_backoff(backoff_factor=5),
    retry_jitter_factor=0.5,
    retry_condition_fn=retry_transient,
    persist_result=True,
    cache_policy=INPUTS + TASK_SOURCE,
)


@task(name="evolve-batch", **BATCH_TASK_OPTIONS)
def evolve_batch_task(out_dir: str, round_no: int, batch_index: int, settings_json: str, base_url: str, run_id: str) -> dict:
    from prefect import get_run_logger

    settings = Settings.model_validate_json(settings_json)
    logger = get_run_logger()

    def progress(done: int, total: int) -> None:
        logger.info("round %d batch %d: %d/%d records evolved", round_no, batch_index, done, total)

    return run_evolve_batch(out_dir, round_no, batch_index, settings, base_url, run_id, progress)
