"""The cost ledger: one row per model call (every attempt, retries included).

Rows are appended as jsonl to `OUT/ledger/<run>.<pid>.<rand>.jsonl` (one file
per process, so threads, Dask and Ray workers never interleave a line; on a
remote output folder one object per row under that name + `.d/`, see
storage/fs.py). Totals
per task, per stage and per run are one polars query away:

    import polars as pl
    from evolforge.storage.ledger import read_ledger, totals
    df = read_ledger("out/")                  # every row
    totals(df, by=["stage"])                  # calls, tokens, USD, seconds per stage
    totals(df, by=["task_id"])                # per record / batch the calls served

`cost_usd` is null when the price of a model is unknown (never a silent 0);
`price_source` says where a price came from (genai-prices, config override,
embedded model = free).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from typing import Iterable

import polars as pl

from evolforge.storage.folder import StageFolder
from evolforge.storage.fs import AnyPath, location
from evolforge.storage.logs import AppendLog, json_line, json_loads, list_logs, read_log_lines

LEDGER_SCHEMA: dict[str, pl.DataType] = {
    "ts": pl.Float64,
    "run_id": pl.Utf8,
    "stage": pl.Utf8,
    "task_id": pl.Utf8,
    "model": pl.Utf8,
    "attempt": pl.Int64,
    "outcome": pl.Utf8,
    "http_status": pl.Int64,
    "prompt_tokens": pl.Int64,
    "completion_tokens": pl.Int64,
    "cost_usd": pl.Float64,
    "price_source": pl.Utf8,
    "latency_s": pl.Float64,
    "error": pl.Utf8,
}


class LedgerWriter:
    """Thread-safe appender; one per process and ledger folder."""

    def __init__(self, ledger_dir: AnyPath, run_id: str, flush_seconds: float = 1.0):
        self.dir = location(ledger_dir)
        self.run_id = run_id
        self.path = self.dir / f"{_safe(run_id)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.jsonl"
        self._log = AppendLog(self.path, flush_seconds)
        self._lock = threading.Lock()
        self.rows_written = 0

    def record(self, **row) -> None:
        full = {k: row.get(k) for k in LEDGER_SCHEMA}
        full["ts"] = full["ts"] or time.time()
        full["run_id"] = full["run_id"] or self.run_id
        line = json_line(full)
        with self._lock:
            self.rows_written += 1
        self._log.write(line)  # remote: raises LogFlushError after a failed background flush (the row is kept)

    def flush(self) -> None:
        """Push buffered rows to a remote ledger now (a no-op for a local one, which is written row by row).
        Raises `LogFlushError` when the store refuses them (they are kept and sent again by the next flush)."""
        self._log.flush()

    def close(self) -> None:
        with self._lock:
            self._log.close()


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in s)[:80] or "run"


FRAME_CHUNK_ROWS = 20_000


def ledger_frame(lines: Iterable[bytes]) -> pl.DataFrame:
    """Ledger lines as one columnar frame, parsed chunk by chunk (a chunk of rows is a list of dicts at a time,
    never the whole ledger); torn or junk lines skipped."""
    parts: list[pl.DataFrame] = []
    rows: list[dict] = []
    for raw in lines:
        try:
            rows.append(json_loads(raw))
        except ValueError:
            continue
        if len(rows) >= FRAME_CHUNK_ROWS:
            parts.append(pl.DataFrame(rows, schema=LEDGER_SCHEMA, strict=False))
            rows = []
    parts.append(pl.DataFrame(rows, schema=LEDGER_SCHEMA, strict=False))
    return parts[0] if len(parts) == 1 else pl.concat(parts, how="vertical", rechunk=True)


def read_ledger(out_dir: str | Path) -> pl.DataFrame:
    """Every ledger row of an output folder (all runs), torn last lines skipped."""
    return ledger_frame(read_log_lines(list_logs(StageFolder(out_dir).ledger_dir)))


class LedgerTail:
    """Reads only the ledger rows appended since its last read (the flow prices each round with it).

    Local ledgers are read from the byte offset reached last time, up to the last
    complete line; on a remote folder only objects not seen before are fetched.
    So pricing round after round costs I/O proportional to the new rows, not to
    the whole ledger.
    """

    def __init__(self, out_dir: str | Path):
        self.dir = StageFolder(out_dir).ledger_dir
        self._offsets: dict[str, int] = {}
        self._seen: set[str] = set()

    def new_rows(self) -> pl.DataFrame:
        return ledger_frame(self._new_lines())

    def _new_lines(self):
        from evolforge.storage.fs import is_remote

        if is_remote(self.dir):
            fs = self.dir.fs
            fs.invalidate_cache()
            fresh = sorted(set(fs.glob(f"{self.dir.path.rstrip('/')}/*.jsonl.d/*.jsonl")) - self._seen)
            if fresh:
                for name, data in sorted(fs.cat(fresh, on_error="omit").items()):
                    self._seen.add(name)
                    yield from data.splitlines()
            return
        for f in list_logs(self.dir):
            start = self._offsets.get(str(f), 0)
            with open(f, "rb") as fh:
                fh.seek(start)
                data = fh.read()
            end = data.rfind(b"\n") + 1  # a line still being written is read next time
            self._offsets[str(f)] = start + end
            yield from data[:end].splitlines()


def known_sum(column: str) -> pl.Expr:
    """The sum of a cost column, null (unknown) as soon as one value is null: an unknown cost never sums as 0."""
    return pl.when(pl.col(column).is_null().any()).then(None).otherwise(pl.col(column).sum())


def totals(df: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Calls, retries, tokens, USD and model seconds grouped by `by` columns; USD is null where any call in the
    group has no price (`unpriced_calls` counts them)."""
    return (
        df.group_by(by)
        .agg(
            pl.len().alias("calls"),
            (pl.col("outcome") != "ok").sum().alias("failed_attempts"),
            pl.col("prompt_tokens").sum().alias("prompt_tokens"),
            pl.col("completion_tokens").sum().alias("completion_tokens"),
            known_sum("cost_usd").alias("cost_usd"),
            pl.col("cost_usd").is_null().sum().alias("unpriced_calls"),
            pl.col("latency_s").sum().alias("model_seconds"),
        )
        .sort(by)
    )
