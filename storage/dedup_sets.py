"""Files of a dedup run (the `dedup` stage: any jsonl / parquet / csv file -> kept set + dropped set).

    OUT/kept.<fmt>        the kept rows, every column, in input order (<fmt>: the input's format, jsonl /
                          parquet / csv)
    OUT/dropped.<fmt>     the dropped rows plus dedup_duplicate_of, dedup_method (exact | minhash | embedding),
                          dedup_similarity, dedup_matched_id, dedup_matched_similarity, dedup_detail
    OUT/summary.json      counts, the kept and dropped paths, per-method counts and timings (`stats`)
    OUT/stage.json        the stage marker (storage/folder.py)

The stage makes no model calls and has no batches: no ledger/ or logs/ folder, nothing for `status` to count
but the marker. A persistent dedup index (`--index`) is a folder of its own (storage/layout.py IndexLayout).
"""

from __future__ import annotations

from dataclasses import dataclass

from evolforge.storage.folder import StageFolder
from evolforge.storage.fs import AnyPath, ensure_dir


@dataclass(frozen=True, init=False)
class DedupOutLayout(StageFolder):
    """A dedup output folder (see the module docstring)."""

    def kept(self, fmt: str) -> AnyPath:
        return self.root / f"kept.{fmt}"

    def dropped(self, fmt: str) -> AnyPath:
        return self.root / f"dropped.{fmt}"

    def ensure(self) -> "DedupOutLayout":
        """The folder itself only: the stage calls no model, so it keeps no ledger and no process logs."""
        ensure_dir(self.root)
        return self
