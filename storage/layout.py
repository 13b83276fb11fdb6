"""Where every file of a run lives. Nothing else builds paths inside an output folder.

    OUT/
      run.json                       settings fingerprint + seeds path of the run
      rejects.jsonl                  malformed input rows, with the reason
      rounds/round_01/input.parquet  the pool this round evolves (row group = batch)
      rounds/round_01/parts/batch_00000.parquet   one atomic part per finished batch
      rounds/round_01/journal/batch_00000.jsonl   model calls finished inside a batch
      rounds/round_01/dedup.parquet  the round's dedup decisions (id, duplicate_of, method, similarity)
      rounds/round_01/_SUCCESS       written when every batch (and the dedup step) of the round is done
      dedup_index/                   persistent dedup index of everything accepted (see tasks/dedup/index.py)
      ledger/*.jsonl                 cost ledger: one row per model call
      dataset/evolved.parquet        seeds + every accepted evolution (the training pool)
      dataset/lineage.parquet        every evolution attempt with its lineage and status
      dataset/final_pool.parquet     the pool after the last round (what a next night evolves)
      cost_ledger.parquet            the ledger compacted at the end of the run
      summary.json                   counts, survival rates, cost totals, dataset paths
      logs/embedded-model.log        the embedded model server's log (when it ran)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .fs import AnyPath, ensure_dir, is_remote, location


@dataclass(frozen=True, init=False)
class OutputFolder:
    """An output folder: a local folder or an fsspec URL (s3://bucket/run, see storage/fs.py)."""

    root: AnyPath

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", location(root))

    @property
    def remote(self) -> bool:
        return is_remote(self.root)


@dataclass(frozen=True, init=False)
class RunLayout(OutputFolder):
    """The files of an evolve run (see the module docstring)."""

    # run-level files
    @property
    def run_info(self) -> AnyPath:
        return self.root / "run.json"

    @property
    def rejects(self) -> AnyPath:
        return self.root / "rejects.jsonl"

    @property
    def summary(self) -> AnyPath:
        return self.root / "summary.json"

    @property
    def ledger_dir(self) -> AnyPath:
        return self.root / "ledger"

    @property
    def ledger_parquet(self) -> AnyPath:
        return self.root / "cost_ledger.parquet"

    @property
    def dataset_dir(self) -> AnyPath:
        return self.root / "dataset"

    @property
    def evolved(self) -> AnyPath:
        return self.dataset_dir / "evolved.parquet"

    @property
    def lineage(self) -> AnyPath:
        return self.dataset_dir / "lineage.parquet"

    @property
    def final_pool(self) -> AnyPath:
        return self.dataset_dir / "final_pool.parquet"

    @property
    def logs_dir(self) -> Path:
        """Local process logs (the embedded model server); a local scratch folder when OUT is remote."""
        if self.remote:
            import hashlib
            import tempfile

            key = hashlib.sha1(str(self.root).encode()).hexdigest()[:12]
            return Path(tempfile.gettempdir()) / "evolforge-logs" / key
        return self.root / "logs"

    # per round
    def round_dir(self, round_no: int) -> AnyPath:
        return self.root / "rounds" / f"round_{round_no:02d}"

    def round_input(self, round_no: int) -> AnyPath:
        return self.round_dir(round_no) / "input.parquet"

    def round_success(self, round_no: int) -> AnyPath:
        return self.round_dir(round_no) / "_SUCCESS"

    def round_dedup(self, round_no: int) -> AnyPath:
        return self.round_dir(round_no) / "dedup.parquet"

    @property
    def dedup_index(self) -> AnyPath:
        return self.root / "dedup_index"

    def part(self, round_no: int, batch: int) -> AnyPath:
        return self.round_dir(round_no) / "parts" / f"batch_{batch:05d}.parquet"

    def journal(self, round_no: int, batch: int) -> AnyPath:
        return self.round_dir(round_no) / "journal" / f"batch_{batch:05d}.jsonl"

    def ensure(self) -> "RunLayout":
        for d in (self.root, self.ledger_dir, self.dataset_dir):
            ensure_dir(d)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        return self
