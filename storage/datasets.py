"""Reading seed datasets and writing the pool / output datasets.

Seeds come as jsonl, parquet or csv with a configurable instruction field.
Rows are streamed in chunks and written to the round-1 input parquet with one
row group per batch, so memory does not grow with the dataset. A malformed row
(unparseable line, missing or empty instruction, too long, duplicate id or text)
goes to `rejects.jsonl` with its line number and the reason; the run goes on.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pyarrow as pa

from evolforge.storage.fs import AnyPath, atomic_output, exists, location, parquet_writer, read_parquet
from evolforge.storage.inputs import SUPPORTED, SeedFileError, iter_rows  # noqa: F401 - SUPPORTED, SeedFileError: part of this module's API
from evolforge.storage.parts import write_table_atomic

POOL_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("seed_id", pa.string()),
        ("instruction", pa.string()),
        ("domain", pa.string()),
        ("generation", pa.int32()),
    ]
)



_MATH = re.compile(r"\b(how many|how much|total|sum|each|per|percent|cost|calculate|solve|equation|average)\b", re.I)
_CODE = re.compile(r"\b(function|python|program|code|implement|algorithm|class|sql|regex|script|array|string)\b", re.I)


def guess_domain(text: str) -> str:
    if _CODE.search(text):
        return "code"
    if re.search(r"\d", text) and _MATH.search(text):
        return "math"
    return "general"


def text_id(text: str, prefix: str = "s") -> str:
    norm = " ".join(text.split()).lower()
    return f"{prefix}-{hashlib.sha1(norm.encode()).hexdigest()[:12]}"


def import_seeds(
    path: str | Path,
    dest: AnyPath,
    rejects_path: AnyPath,
    *,
    instruction_field: str = "instruction",
    id_field: str = "id",
    domain_field: str = "domain",
    max_chars: int = 20_000,
    batch_size: int = 128,
) -> dict:
    """Stream seeds into `dest` (the round-1 pool); return counts. Rejects go to `rejects_path`."""
    path = location(path)
    if not exists(path):
        raise SeedFileError(f"seed file not found: {path}")
    kept, rejected, field_seen = 0, 0, False
    with atomic_output(rejects_path, "w") as rej:  # the rejects are published even when no seed is usable
        try:
            with parquet_writer(dest, POOL_SCHEMA, compression="zstd") as writer:
                kept, rejected, field_seen = _import_rows(path, rej, writer, instruction_field, id_field,
                                                          domain_field, max_chars, batch_size)
                if kept == 0:
                    raise _NoSeeds  # the pool is not published
        except _NoSeeds:
            pass
    if kept == 0:
        hint = "" if field_seen else f" (no row has the field {instruction_field!r}; set input.instruction_field)"
        raise SeedFileError(f"no usable seed in {path}{hint}; see {rejects_path}")
    return {"seeds": kept, "rejected": rejected}


class _NoSeeds(Exception):
    pass


def _import_rows(path: AnyPath, rej, writer, instruction_field: str, id_field: str, domain_field: str,
                 max_chars: int, batch_size: int) -> tuple[int, int, bool]:
    seen_ids: set[str] = set()
    seen_text: dict[str, int] = {}
    chunk: list[dict] = []
    kept = rejected = 0
    field_seen = False

    def reject(line_no: int, reason: str, row: dict | None) -> None:
        nonlocal rejected
        rejected += 1
        rej.write(json.dumps({"source": str(path), "line": line_no, "reason": reason, "row": row},
                             ensure_ascii=False, default=str) + "\n")

    for line_no, row, err in iter_rows(path):
        if err:
            reject(line_no, err, None)
            continue
        text = row.get(instruction_field)
        if instruction_field in row:
            field_seen = True
        if not isinstance(text, str) or not text.strip():
            reject(line_no, f"missing or empty field {instruction_field!r}", row)
            continue
        text = text.strip()
        if len(text) > max_chars:
            reject(line_no, f"instruction longer than input.max_chars={max_chars}", row)
            continue
        raw_id = row.get(id_field)
        rid = str(raw_id).strip() if raw_id not in (None, "") else text_id(text)
        norm = " ".join(text.split()).lower()
        if norm in seen_text:
            reject(line_no, f"duplicate instruction (same text as line {seen_text[norm]})", row)
            continue
        if rid in seen_ids:
            reject(line_no, f"duplicate id {rid!r}", row)
            continue
        seen_ids.add(rid)
        seen_text[norm] = line_no
        domain = row.get(domain_field)
        domain = domain if domain in ("math", "code", "general") else guess_domain(text)
        # a pool written by an earlier run (final_pool.parquet) keeps its lineage
        seed_id = row.get("seed_id") if isinstance(row.get("seed_id"), str) and row.get("seed_id") else rid
        generation = row.get("generation") if isinstance(row.get("generation"), int) else 0
        chunk.append({"id": rid, "seed_id": seed_id, "instruction": text, "domain": domain, "generation": generation})
        kept += 1
        if len(chunk) >= batch_size:
            writer.write_table(pa.Table.from_pylist(chunk, schema=POOL_SCHEMA), row_group_size=batch_size)
            chunk = []
    if chunk:
        writer.write_table(pa.Table.from_pylist(chunk, schema=POOL_SCHEMA), row_group_size=batch_size)
    return kept, rejected, field_seen


def write_pool(rows: pa.Table, dest: AnyPath, batch_size: int) -> AnyPath:
    """Write a round's input pool with one row group per batch."""
    return write_table_atomic(rows.select(POOL_SCHEMA.names).cast(POOL_SCHEMA), dest, row_group_size=batch_size)


def read_table(path: AnyPath) -> pa.Table:
    return read_parquet(location(path))


def read_any_table(path: AnyPath):
    """A whole .jsonl/.parquet/.csv file (local or URL) as a polars DataFrame, and its format."""
    import polars as pl

    path = location(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pl.from_arrow(read_parquet(path)), "parquet"
    if suffix in (".jsonl", ".ndjson", ".csv"):
        with path.open("rb") as fh:
            return (pl.read_ndjson(fh), "jsonl") if suffix != ".csv" else (pl.read_csv(fh), "csv")
    raise ValueError(f"{path}: unsupported format {suffix!r} (use .jsonl, .parquet or .csv)")


def write_any_table(df, path: AnyPath, fmt: str) -> AnyPath:
    """Write a polars DataFrame as jsonl, parquet or csv, atomically."""
    with atomic_output(path, "wb") as fh:
        {"jsonl": df.write_ndjson, "parquet": df.write_parquet, "csv": df.write_csv}[fmt](fh)
    return path
