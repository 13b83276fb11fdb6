"""A stage's input files and output folder, checked before any work (light imports: no pyarrow unless a
parquet file is read, no fsspec for local paths), so a user error is reported in well under a second.

    iter_rows(path)                     (line number, row or None, error) for every row of a jsonl / csv /
                                        parquet file (what storage/datasets.py imports seeds from)
    first_usable_row(path, field, ...)  the first row with a usable text field, else SeedFileError naming why
    folder_problem(path)                why an output folder cannot be created or written, or None
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Iterator

SUPPORTED = (".jsonl", ".json", ".ndjson", ".parquet", ".csv")


class SeedFileError(ValueError):
    """An input file that cannot be used: missing, of an unsupported type, or without a usable row."""


def _location(path):
    """A local Path without importing fsspec; a URL through storage.fs."""
    if not isinstance(path, (str, os.PathLike)):  # a remote UPath (storage.fs.location) already
        return path
    s = os.fspath(path)
    if "://" in s and not s.startswith("file://"):
        from evolforge.storage.fs import location

        return location(s)
    return Path(s.removeprefix("file://")).expanduser().resolve()


def iter_rows(path) -> Iterator[tuple[int, dict | None, str | None]]:
    """Yield (line_no, row or None, error) for each row of the file (local path or URL)."""
    path = _location(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):  # utf-8-sig: a byte-order mark (Windows editors) is read as nothing
        with io.TextIOWrapper(path.open("rb"), encoding="utf-8-sig", errors="replace") as fh:
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
        with io.TextIOWrapper(path.open("rb"), encoding="utf-8-sig", errors="replace", newline="") as fh:
            for n, row in enumerate(csv.DictReader(fh), 2):
                yield n, row, None
    elif suffix == ".parquet":
        from evolforge.storage.fs import parquet_file

        pf = parquet_file(path)
        n = 0
        for batch in pf.iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                n += 1
                yield n, row, None
    else:
        raise SeedFileError(f"unsupported file type {path.suffix!r} ({path}): use one of {', '.join(SUPPORTED)}")


def input_exists(path) -> bool:
    p = _location(path)
    if isinstance(p, Path):
        return p.is_file()
    from evolforge.storage.fs import exists

    return exists(p)


FIELD_FIX = "set input.instruction_field to the column that holds the text"


def first_usable_row(path, field: str, max_chars: int | None = None, what: str = "seed file",
                     fallback_field: str | None = None, field_fix: str = FIELD_FIX) -> dict:
    """The first row whose `field` (else `fallback_field`) is a non-empty string of at most `max_chars`.

    Raises SeedFileError naming the problem: the file is missing, has an unsupported type, is not readable,
    or no row has a usable `field` (and whether any row has the field at all)."""
    p = _location(path)
    if not input_exists(p):
        if isinstance(p, Path) and p.is_dir():
            raise SeedFileError(f"{what} {p} is a folder: give the file inside it ({', '.join(SUPPORTED)})")
        raise SeedFileError(f"{what} not found: {p}")
    seen_field = too_long = rows = bad = 0
    columns: dict[str, None] = {}  # the fields the rows have, in order (named when none has `field`)
    try:
        for _, row, err in iter_rows(p):
            rows += 1
            if err:
                bad += 1
                continue
            if len(columns) < 50:
                columns.update(dict.fromkeys(map(str, row)))
            key = field if field in row or not fallback_field else fallback_field
            if key not in row:
                continue
            seen_field += 1
            text = row.get(key)
            if not isinstance(text, str) or not text.strip():
                continue
            if max_chars is not None and len(text.strip()) > max_chars:
                too_long += 1
                continue
            return row
    except SeedFileError:
        raise
    except Exception as e:  # noqa: BLE001 - an unreadable file is the user's to fix, said in one line
        raise SeedFileError(f"{what} {p} cannot be read: {type(e).__name__}: {e}") from None
    names = repr(field) + (f" or {fallback_field!r}" if fallback_field else "")
    if not rows:
        why = "it is empty"
    elif bad == rows:
        why = f"none of its {rows} rows parses"
    elif not seen_field:
        has = f"its rows have: {', '.join(list(columns)[:12])}; " if columns else ""
        why = f"no row has the field {names} ({has}{field_fix})"
    elif too_long:
        why = f"every {names} is empty or longer than input.max_chars={max_chars}"
    else:
        why = f"every {names} is empty"
    raise SeedFileError(f"no usable row in {what} {p}: {why}")


def folder_problem(path) -> str | None:
    """Why `path` cannot serve as an output folder (not a folder, not writable), or None. Creates nothing that
    stays: a probe file is made and removed in the folder, or in its nearest existing parent (so permissions,
    read-only mounts and full quotas are all seen). A remote URL is not probed (its store answers on the
    first write)."""
    if not isinstance(path, (str, os.PathLike)):  # a remote UPath
        return None
    s = os.fspath(path)
    if not s.strip():
        return "the output folder is empty (\"\"): it would be the current folder"
    if "://" in s and not s.startswith("file://"):
        return None
    p = Path(s.removeprefix("file://")).expanduser().absolute()
    if p.exists() and not p.is_dir():
        return f"output folder {p} exists and is not a folder"
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot create output folder {p}: {existing} is not a folder"
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".evolforge-probe-"):
            pass
    except OSError as e:
        where = "output folder" if existing == p else f"cannot create output folder {p}:"
        return f"{where} {existing} is not writable ({e.strerror or e})"
    return None
