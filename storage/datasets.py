"""Reading seed datasets and writing the pool / output datasets.

Seeds come as jsonl, parquet or csv with a configurable instruction field.
Rows are streamed in chunks and written to the round-1 input parquet with one
row group per batch, so memory does not grow with the dataset. A malformed row
(unparseable line, missing or empty instruction, too long, duplicate id or text)
goes to `rejects.jsonl` with its line number and the reason; the run goes on.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from .parts import write_table_atomic

POOL_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("seed_id", pa.string()),
        ("instruction", pa.string()),
        ("domain", pa.string()),
        ("generation", pa.int32()),
    ]
)

SUPPORTED = (".jsonl", ".json", ".ndjson", ".parquet", ".csv")


class SeedFileError(ValueError):
    pass


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


def _iter_raw_rows(path: Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """Yield (line_no, row or None, error) for each row of the file."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    yield n, None, f"not valid JSON: {e.msg} at column {e.colno}"
                    continue
                if not isinstance(row, dict):
                    yield n, None, f"expected a JSON object, got {type(row).__name__}"
                    continue
                yield n, row, None
    elif suffix == ".csv":
        with open(path, "r", encoding="utf-8", errors="replace", newline="") as fh:
            for n, row in enumerate(csv.DictReader(fh), 2):
                yield n, row, None
    elif suffix == ".parquet":
        pf = pq.ParquetFile(path)
        n = 0
        for batch in pf.iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                n += 1
                yield n, row, None
    else:
        raise SeedFileError(f"unsupported seed file type {path.suffix!r}: use one of {', '.join(SUPPORTED)}")


def import_seeds(
    path: str | Path,
    dest: Path,
    rejects_path: Path,
    *,
    instruction_field: str = "instruction",
    id_field: str = "id",
    domain_field: str = "domain",
    max_chars: int = 20_000,
    batch_size: int = 128,
) -> dict:
    """Stream seeds into `dest` (the round-1 pool); return counts. Rejects go to `rejects_path`."""
    path = Path(path)
    if not path.exists():
        raise SeedFileError(f"seed file not found: {path}")
    seen_ids: set[str] = set()
    seen_text: dict[str, int] = {}
    chunk: list[dict] = []
    kept = rejected = 0
    rejects_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".building")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    writer = pq.ParquetWriter(tmp, POOL_SCHEMA, compression="zstd")
    field_seen = False
    with open(rejects_path, "w", encoding="utf-8") as rej:

        def reject(line_no: int, reason: str, row: dict | None) -> None:
            nonlocal rejected
            rejected += 1
            rej.write(json.dumps({"source": str(path), "line": line_no, "reason": reason, "row": row},
                                 ensure_ascii=False, default=str) + "\n")

        for line_no, row, err in _iter_raw_rows(path):
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
    writer.close()
    if kept == 0:
        tmp.unlink(missing_ok=True)
        hint = "" if field_seen else f" (no row has the field {instruction_field!r}; set input.instruction_field)"
        raise SeedFileError(f"no usable seed in {path}{hint}; see {rejects_path}")
    tmp.replace(dest)
    return {"seeds": kept, "rejected": rejected}


def write_pool(rows: pa.Table, dest: Path, batch_size: int) -> Path:
    """Write a round's input pool with one row group per batch."""
    return write_table_atomic(rows.select(POOL_SCHEMA.names).cast(POOL_SCHEMA), dest, row_group_size=batch_size)


def read_table(path: Path) -> pa.Table:
    return pq.read_table(path)
