"""Atomic parquet part files: a batch's output exists completely or not at all.

A part is written to a temporary file in the same folder, flushed, fsynced and
renamed into place, so a reader never sees a half-written part (SIGKILL, full
disk, read-only folder: the part is simply absent and the batch is redone).
Each part records its own row count in the parquet key-value metadata;
`read_part` checks footer, schema and count, and a part that fails any check is
reported as corrupt (and moved aside by `quarantine`) so its batch is redone.

A batch whose run raised (its retries spent, or a fatal error) leaves no part; the runtime writes a failure
marker beside where its part goes (`PART.failed.json`: the error and when), removed when the batch runs again,
so `evolforge status` tells a failed batch from one not run yet.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from evolforge.storage.fs import (
    AnyPath,
    atomic_output,
    exists,
    parquet_file,
    read_json,
    read_parquet,
    replace,
    unlink,
    write_json_atomic,
)

if TYPE_CHECKING:
    import pyarrow as pa  # imported where used: the CLI's --help path does not load it

ROWS_KEY = b"evolforge.rows"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, read-only folder, ...)."""


def write_table_atomic(table: pa.Table, path: AnyPath, row_group_size: int | None = None) -> AnyPath:
    import pyarrow.parquet as pq

    try:
        meta = dict(table.schema.metadata or {})
        meta[ROWS_KEY] = str(table.num_rows).encode()
        table = table.replace_schema_metadata(meta)
        with atomic_output(path, "wb") as fh:
            pq.write_table(table, fh, row_group_size=row_group_size, compression="zstd")
    except OSError as e:
        raise CheckpointWriteError(
            e.errno, f"cannot write checkpoint {path}: {e.strerror or e} "
            "(is the disk full or the output folder read-only?)"
        ) from e
    return path


class CorruptPart(ValueError):
    pass


def read_part(path: AnyPath) -> pa.Table:
    """Read a part and verify it is whole; raise CorruptPart when it is not."""
    import pyarrow as pa

    try:
        table = read_parquet(path)
    except (OSError, pa.ArrowException) as e:
        raise CorruptPart(f"{path}: unreadable parquet ({e})") from e
    meta = table.schema.metadata or {}
    expected = meta.get(ROWS_KEY)
    if expected is None:
        raise CorruptPart(f"{path}: no row-count metadata (not written by evolforge)")
    if int(expected) != table.num_rows:
        raise CorruptPart(f"{path}: {table.num_rows} rows, metadata says {int(expected)}")
    return table


def part_is_valid(path: AnyPath) -> bool:
    if not exists(path):
        return False
    try:
        read_part(path)
        return True
    except CorruptPart:
        return False


def quarantine(path: AnyPath) -> AnyPath:
    """Move a corrupt part aside (kept for inspection, never read as complete)."""
    dest = path.with_name(path.name + ".corrupt")
    n = 1
    while exists(dest):
        dest = path.with_name(f"{path.name}.corrupt{n}")
        n += 1
    replace(path, dest)
    return dest


def read_row_group(path: AnyPath, index: int) -> pa.Table:
    return parquet_file(path).read_row_group(index)


def num_row_groups(path: AnyPath) -> int:
    return parquet_file(path).num_row_groups


FAILED_SUFFIX = ".failed.json"


def failure_marker(part: AnyPath) -> AnyPath:
    """Where a failed batch's marker goes: beside its part (not matched by the parts' `batch_*.parquet`)."""
    return part.with_name(part.name + FAILED_SUFFIX)


def mark_failed(part: AnyPath, error: BaseException) -> None:
    """Record that the batch of `part` failed with `error` (its type and the first 300 characters)."""
    message = " ".join(str(error).split())[:300]
    write_json_atomic(failure_marker(part), {"error": f"{type(error).__name__}: {message}" if message
                                             else type(error).__name__,
                                             "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def clear_failed(part: AnyPath) -> None:
    marker = failure_marker(part)
    if exists(marker):
        unlink(marker)


def read_failure(part: AnyPath) -> dict | None:
    """The failure marker of the batch of `part` ({"error", "at"}), or None."""
    marker = failure_marker(part)
    if not exists(marker):
        return None
    try:
        found = read_json(marker)
    except (OSError, ValueError):
        return {"error": "unreadable failure marker", "at": None}
    return found if isinstance(found, dict) else {"error": "unreadable failure marker", "at": None}
