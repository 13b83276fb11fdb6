"""What every stage's output folder has, once: the run-level files, the stage marker, and batched tables.

    OUT/stage.json        the marker: {"kind": the stage's name, "version": the folder format, "evolforge":
                          the package version, "started_at", and once the stage finished "finished_at" and
                          "counts"}; written by the stage runner (flows/_stage.py) when the stage starts over the
                          folder and when it finishes (a run over a finished folder drops the finish until it
                          finishes in turn). `evolforge status` reads the kind from it, never from
                          the folder's file names.
    OUT/summary.json      what the stage did: counts, paths, cost (the stage's flow writes it last)
    OUT/README.md         the dataset card, for a stage that makes datasets (storage/cards.py)
    OUT/ledger/*.jsonl    the cost ledger: one row per model call attempt (storage/ledger.py)
    OUT/logs/             local process logs (the embedded model server)
    OUT/plots/*.png       the stage's plots (storage/plots.py)

A batched table (`BatchedSet`) is an input snapshot whose row groups are the batches, one atomic part per
finished batch, and one call journal per batch (replayed on resume):

    <input>.parquet       the records to work on; row group = batch, fixed on the first run
    <parts>/batch_NNNNN.parquet      one atomic part per finished batch
    <journal>/batch_NNNNN.jsonl      model calls finished inside a batch
"""

from __future__ import annotations

import datetime as dt
import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evolforge.storage.fs import (
    AnyPath,
    ensure_dir,
    exists,
    is_remote,
    list_files,
    location,
    read_json,
    read_parquet,
    write_json_atomic,
)
from evolforge.storage.parts import num_row_groups

if TYPE_CHECKING:
    import pyarrow as pa  # imported where used: the CLI's --help path does not load it

MARKER = "stage.json"
FOLDER_VERSION = 1


@dataclass(frozen=True, init=False)
class OutputFolder:
    """An output folder: a local folder or an fsspec URL (s3://bucket/run, see storage/fs.py)."""

    root: AnyPath

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", location(root))

    @property
    def remote(self) -> bool:
        return is_remote(self.root)

    @property
    def plots_dir(self) -> AnyPath:
        """OUT/plots/<name>.png: the stage's plots (storage/plots.py)."""
        return self.root / "plots"


@dataclass(frozen=True)
class BatchedSet:
    """One batched table of a stage (see the module docstring). `prefix` names the parts and journals."""

    input: AnyPath
    parts_dir: AnyPath
    journal_dir: AnyPath
    prefix: str = "batch"

    def part(self, batch: int) -> AnyPath:
        return self.parts_dir / f"{self.prefix}_{batch:05d}.parquet"

    def journal(self, batch: int) -> AnyPath:
        return self.journal_dir / f"{self.prefix}_{batch:05d}.jsonl"

    def batch_count(self) -> int:
        """Batches of the input snapshot (0 before it is written)."""
        return num_row_groups(self.input) if exists(self.input) else 0

    def complete(self) -> bool:
        """The input is snapshotted and every batch has its part."""
        return exists(self.input) and all(exists(self.part(b)) for b in range(self.batch_count()))

    def part_files(self) -> list[AnyPath]:
        return list_files(self.parts_dir, f"{self.prefix}_*.parquet")

    def all_parts(self, schema: pa.Schema) -> pa.Table:
        """Every part written so far, in batch order (an empty table of `schema` when there is none)."""
        import pyarrow as pa

        files = self.part_files()
        return pa.concat_tables([read_parquet(f) for f in files]) if files else schema.empty_table()


@dataclass(frozen=True, init=False)
class StageFolder(OutputFolder):
    """The output folder of one stage run (see the module docstring); each stage's storage module subclasses it
    with the stage's own files."""

    @property
    def marker(self) -> AnyPath:
        return self.root / MARKER

    @property
    def summary(self) -> AnyPath:
        return self.root / "summary.json"

    @property
    def card_dir(self) -> AnyPath:
        """Where the dataset card (README.md) and the tables it names live: the folder itself by default."""
        return self.root

    @property
    def ledger_dir(self) -> AnyPath:
        return self.root / "ledger"

    @property
    def logs_dir(self) -> Path:
        """Local process logs (the embedded model server); a local scratch folder when OUT is remote."""
        if self.remote:
            key = hashlib.sha1(str(self.root).encode()).hexdigest()[:12]
            return Path(tempfile.gettempdir()).resolve() / "evolforge-logs" / key
        return self.root / "logs"

    def batched_sets(self) -> dict[str, BatchedSet]:
        """The folder's batched tables by unit name ("round 1", "irm", "tasks"): what `status` counts."""
        return {}

    def status_extra(self) -> dict:
        """Facts `status` shows beside the batches (e.g. the reward models trained)."""
        return {}

    def ensure(self):
        for d in (self.root, self.ledger_dir):
            ensure_dir(d)
        ensure_dir(self.logs_dir)
        return self

    def start_marker(self, kind: str) -> dict:
        """Write stage.json when the stage starts over the folder (kept when it is already there for the same
        kind, without its finish time and counts: not finished until this run finishes); a folder marked for
        another stage is refused."""
        found = read_marker(self.root)
        if found is not None:
            if found.get("kind") != kind:
                raise FolderOfAnotherStage(f"{self.root} holds the output of the {found.get('kind')} stage "
                                           f"(its {MARKER}); choose another output folder for the {kind} stage")
            if "finished_at" in found:  # running again: not finished until this run finishes
                found = {k: v for k, v in found.items() if k not in ("finished_at", "counts")}
                write_json_atomic(self.marker, found)
            return found
        marker = {"kind": kind, "version": FOLDER_VERSION, "evolforge": package_version(),
                  "started_at": _now()}
        write_json_atomic(self.marker, marker)
        return marker

    def finish_marker(self, kind: str, counts: dict) -> dict:
        """stage.json once the stage finished: the same kind and version, the finish time and its counts."""
        marker = {**(read_marker(self.root) or {"kind": kind, "version": FOLDER_VERSION, "started_at": None}),
                  "evolforge": package_version(), "finished_at": _now(), "counts": counts}
        write_json_atomic(self.marker, marker)
        return marker


class FolderOfAnotherStage(ValueError):
    """An output folder already holds another stage's output."""


def read_marker(root: str | Path | AnyPath) -> dict | None:
    """The folder's stage.json, or None when it has none (or it is unreadable)."""
    path = location(root) / MARKER
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") else None


def in_folder(root: AnyPath, path: str | AnyPath) -> str:
    """`path` as a folder's own records keep it: relative to the folder when inside it (so a folder moved or
    copied elsewhere still names its own files), else absolute (or the URL)."""
    root_s, path_s = str(location(root)).rstrip("/"), str(location(path))
    return path_s[len(root_s) + 1:] if path_s.startswith(root_s + "/") else path_s


def from_folder(root: AnyPath, recorded: str) -> str:
    """A path a folder's records keep (`in_folder`), as the absolute path or URL it names now."""
    if "://" in recorded or recorded.startswith("/"):
        return recorded
    return str(location(root) / recorded)


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("evolforge")
    except PackageNotFoundError:
        return "unknown"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
