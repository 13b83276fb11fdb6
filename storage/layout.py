"""Where every file lives. Nothing else builds paths inside an output folder.

StageFolder (storage/folder.py) is the base of every stage's folder (a local folder or an fsspec URL). The evolve
stage's (RunLayout; its round bookkeeping: storage/rounds.py; its run record: storage/run_record.py):

    OUT/
      stage.json                     the stage marker: kind "evolve", counts once finished (storage/folder.py)
      run.json                       settings fingerprint + seeds path of the run
      rejects.jsonl                  malformed input rows, with the reason
      rounds/round_01/input.parquet  the pool this round evolves (row group = batch)
      rounds/round_01/parts/batch_00000.parquet   one atomic part per finished batch
      rounds/round_01/journal/batch_00000.jsonl   model calls finished inside a batch
      rounds/round_01/dedup.parquet  the round's dedup decisions (id, duplicate_of, method, similarity)
      rounds/round_01/_SUCCESS       written when every batch (and the dedup step) of the round is done
      rounds/round_01/_DEDUP_PENDING an index manifest snapshot left by an older evolforge's interrupted dedup step
      rounds/round_01/_SEEDS_INDEXED, _SEEDS_INDEX_PENDING   the seeds' entry into the dedup index
      dedup_index/                   persistent dedup index of everything accepted (see tasks/dedup/index.py)
      dedup_run.json                 this run's tag in dedup indexes and the indexes it wrote to (for retry)
      ledger/*.jsonl                 cost ledger: one row per model call
      dataset/evolved.parquet        seeds + every accepted evolution (the training pool)
      dataset/lineage.parquet        every evolution attempt with its lineage and status
      dataset/final_pool.parquet     the pool after the last round (what a next night evolves)
      dataset/sft/train.parquet      the evolved dataset as SFT conversations (`messages`, TRL SFTTrainer)
      dataset/README.md              the dataset card: one config per table, features, sizes, settings, cost
      plots/*.png                    the run's plots (also on the Prefect run as a markdown artifact)
      cost_ledger.parquet            the ledger compacted at the end of the run
      summary.json                   counts, survival rates, cost totals, dataset paths
      logs/embedded-model.log        the embedded model server's log (when it ran)

Also here: IndexLayout (a persistent dedup index, shared by the evolve rounds and the dedup stage). The
synthesis, dedup, modules, reward, PPO and pipeline stages keep their layouts beside their readers and writers
(storage/synthesis_sets.py, dedup_sets.py, module_sets.py, reward_sets.py, ppo.py, pipeline_sets.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from evolforge.storage.folder import BatchedSet, OutputFolder, StageFolder
from evolforge.storage.fs import AnyPath, ensure_dir, exists, list_files, read_text


@dataclass(frozen=True, init=False)
class RunLayout(StageFolder):
    """The evolve stage's folder (see the module docstring); its run-level files (summary, ledger, logs,
    stage.json) are those of every StageFolder (storage/folder.py)."""

    # run-level files
    @property
    def run_info(self) -> AnyPath:
        return self.root / "run.json"

    @property
    def rejects(self) -> AnyPath:
        return self.root / "rejects.jsonl"

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
    def sft(self) -> AnyPath:
        """The evolved dataset as TRL SFTTrainer conversations (storage/rounds.py write_sft_view). Named
        sft/train.parquet: the only file of dataset/ a split name matches, so `load_dataset("parquet",
        data_dir=OUT/dataset)` reads it (and the other tables, through the card's configs, by name)."""
        return self.dataset_dir / "sft" / "train.parquet"

    @property
    def card_dir(self) -> AnyPath:
        return self.dataset_dir

    def datasets(self) -> dict[str, AnyPath]:
        """The tables a finished run leaves, by name (summary.json's `datasets`)."""
        return {"sft": self.sft, "evolved": self.evolved, "lineage": self.lineage, "final_pool": self.final_pool,
                "cost_ledger": self.ledger_parquet, "rejects": self.rejects}

    # per round
    def round_dir(self, round_no: int) -> AnyPath:
        return self.rounds_dir / f"round_{round_no:02d}"

    def round_input(self, round_no: int) -> AnyPath:
        return self.round_dir(round_no) / "input.parquet"

    def round_success(self, round_no: int) -> AnyPath:
        return self.round_dir(round_no) / "_SUCCESS"

    def round_dedup(self, round_no: int) -> AnyPath:
        return self.round_dir(round_no) / "dedup.parquet"

    def round_dedup_pending(self, round_no: int) -> AnyPath:
        return self.round_dir(round_no) / "_DEDUP_PENDING"

    @property
    def seeds_indexed(self) -> AnyPath:
        return self.round_dir(1) / "_SEEDS_INDEXED"

    @property
    def seeds_index_pending(self) -> AnyPath:
        return self.round_dir(1) / "_SEEDS_INDEX_PENDING"

    @property
    def rounds_dir(self) -> AnyPath:
        return self.root / "rounds"

    def parts_dir(self, round_no: int) -> AnyPath:
        return self.round_dir(round_no) / "parts"

    @property
    def dedup_index(self) -> AnyPath:
        return self.root / "dedup_index"

    @property
    def dedup_run(self) -> AnyPath:
        """{"run": tag, "source": OUT, "indexes": [...], "relative": [...]}: the tag this run's index segments
        carry and the indexes it wrote to (`recorded_indexes`: how they are named), so a retry
        (`evolforge retry`) can roll its rounds back out of a shared index (tasks/evolve/dedup_round.py)."""
        return self.root / "dedup_run.json"

    def recorded_indexes(self, ref: dict | None = None) -> list[str]:
        """The dedup indexes dedup_run.json (or `ref`, its content) names, as paths or URLs now: an index inside
        the folder is kept relative to it; one outside it (a nightly dataset's DATASET/dedup_index beside
        DATASET/nights/DATE) is kept absolute and, when local, also relative to the folder ("relative"), so
        the old path and the one the relative path names now (the two moved together) are both its index."""
        import os

        ref = ref if ref is not None else (json.loads(read_text(self.dedup_run)) if exists(self.dedup_run) else {})
        root = str(self.root).rstrip("/")
        out: list[str] = []
        for i, rec in enumerate(ref.get("indexes") or []):
            named = [rec if "://" in rec or rec.startswith("/") else f"{root}/{rec}"]
            rels = ref.get("relative") or []
            rel = rels[i] if i < len(rels) else None
            if rel and "://" not in root:
                named.append(os.path.normpath(os.path.join(root, rel)))
            out += [n for n in named if n not in out]
        return out

    def index_record(self, ref: dict, indexes: list[str]) -> dict:
        """dedup_run.json's content for `ref` ({"run", "source"}) and the absolute indexes the run wrote to
        (see `recorded_indexes`)."""
        import os

        root = str(self.root).rstrip("/")
        kept, relative = [], []
        for index in indexes:
            inside = index.startswith(root + "/")
            kept.append(index[len(root) + 1:] if inside else index)
            local = "://" not in index and "://" not in root and not inside
            relative.append(os.path.relpath(index, root) if local else None)
        return {**ref, "indexes": kept, "relative": relative}

    def round_set(self, round_no: int) -> BatchedSet:
        """The round's batched table: its input pool, parts and call journals."""
        rdir = self.round_dir(round_no)
        return BatchedSet(rdir / "input.parquet", rdir / "parts", rdir / "journal")

    def part(self, round_no: int, batch: int) -> AnyPath:
        return self.round_set(round_no).part(batch)

    def journal(self, round_no: int, batch: int) -> AnyPath:
        return self.round_set(round_no).journal(batch)

    def rounds_started(self) -> list[int]:
        """The rounds that have a folder, in order."""
        return sorted(int(d.name.split("_")[1]) for d in list_files(self.rounds_dir, "round_[0-9][0-9]"))

    def batched_sets(self) -> dict[str, BatchedSet]:
        """Each started round ("round 1", ...): what `evolforge status` counts."""
        return {f"round {r}": self.round_set(r) for r in self.rounds_started()}

    def round_complete(self, round_no: int) -> bool:
        """The round's _SUCCESS marker parses and every batch part it counts is present."""
        marker = self.round_success(round_no)
        if not exists(marker):
            return False
        try:
            n = json.loads(read_text(marker))["batches"]
        except (ValueError, KeyError, TypeError):
            return False
        present = {p.name for p in list_files(self.parts_dir(round_no), "batch_*.parquet")}
        return all(self.part(round_no, i).name in present for i in range(n))

    def unit_complete(self, unit: str) -> bool:
        """A round ("round 2") is complete (round_complete)."""
        return self.round_complete(int(unit.split()[-1]))

    def ensure(self) -> "RunLayout":
        super().ensure()
        ensure_dir(self.dataset_dir)
        return self


@dataclass(frozen=True, init=False)
class IndexLayout(OutputFolder):
    """A persistent dedup index: manifest.json (the committed state) and its append-only segments."""

    manifest = property(lambda self: self.root / "manifest.json")
    # held around every transaction on the index (read manifest -> dedup -> append -> commit), see
    # tasks/dedup/index.py `index_lock`: a flock'ed file locally, an exclusively created object on a store
    lock = property(lambda self: self.root / "manifest.lock")

    def file(self, name: str) -> AnyPath:
        """A segment named by the manifest (seg-NNNNNN.npz, full-NNNNNN.npz)."""
        return self.root / name
