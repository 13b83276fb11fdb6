"""Atomic parquet part files: a batch's output exists completely or not at all.

A part is written to a temporary file in the same folder, flushed, fsynced and
renamed into place, so a reader never sees a half-written part (SIGKILL, full
disk, read-only folder: the part is simply absent and the batch is redone).
Each part records its own row count in the parquet key-value metadata;
`read_part` checks footer, schema and count, and a part that fails any check is
reported as corrupt (and moved aside by `quarantine`) so its batch is redone.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROWS_KEY = b"evolforge.rows"


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, read-only folder, ...)."""


def write_table_atomic(table: pa.Table, path: Path, row_group_size: int | None = None) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(table.schema.metadata or {})
        meta[ROWS_KEY] = str(table.num_rows).encode()
        table = table.replace_schema_metadata(meta)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                pq.write_table(table, fh, row_group_size=row_group_size, compression="zstd")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        raise CheckpointWriteError(
            e.errno, f"cannot write checkpoint {path}: {e.strerror or e} "
            "(is the disk full or the output folder read-only?)"
        ) from e
    return path


class CorruptPart(ValueError):
    pass


def read_part(path: Path) -> pa.Table:
    """Read a part and verify it is whole; raise CorruptPart when it is not."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise CorruptPart(f"{path}: unreadable parquet ({e})") from e
    meta = table.schema.metadata or {}
    expected = meta.get(ROWS_KEY)
    if expected is None:
        raise CorruptPart(f"{path}: no row-count metadata (not written by evolforge)")
    if int(expected) != table.num_rows:
        raise CorruptPart(f"{path}: {table.num_rows} rows, metadata says {int(expected)}")
    return table


def part_is_valid(path: Path) -> bool:
    if not Path(path).exists():
        return False
    try:
        read_part(path)
        return True
    except CorruptPart:
        return False


def quarantine(path: Path) -> Path:
    """Move a corrupt part aside (kept for inspection, never read as complete)."""
    path = Path(path)
    dest = path.with_name(path.name + ".corrupt")
    n = 1
    while dest.exists():
        dest = path.with_name(f"{path.name}.corrupt{n}")
        n += 1
    os.replace(path, dest)
    return dest


def read_row_group(path: Path, index: int) -> pa.Table:
    return pq.ParquetFile(path).read_row_group(index)


def num_row_groups(path: Path) -> int:
    return pq.ParquetFile(path).num_row_groups
