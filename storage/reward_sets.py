"""Reward-model data on disk: where every file lives, the parquet schemas, readers and writers.

    OUT/                              a reward-data output folder (RewardLayout)
      reward_input.parquet            the instructions (+ answers) taken from an evolve run; row group = batch;
                                      the input of both batched sets
      irm/parts/batch_00000.parquet   the `irm` set: one atomic part per finished IRM batch: ranked groups
      irm/journal/batch_00000.jsonl   (GROUP_SCHEMA); model calls finished inside the batch (replayed on resume)
      prm/parts/, prm/journal/        the `prm` set: the same for PRM batches (STEP_ROW_SCHEMA)
      irm_groups.parquet              every group: versions, sources, judge ranking and scores, status
      data/train-00000-of-00001.parquet
                                      the IRM pairs (config `irm_pairs`, what load_dataset("parquet",
                                      data_dir=OUT) loads, storage/cards.py), TRL RewardTrainer form: prompt,
                                      chosen, rejected, margin (+ provenance) (`irm_pairs.parquet` before)
      prm_steps.parquet               TRL stepwise-supervision form: prompt, completions, labels (+ raw scores)
      prm_rejected.parquet            answers that could not be labelled, with the reason
      health.json                     data (and, after training, model) health checks
      summary.json                    the reward-data stage's counts, failures, cost
      models/irm, models/prm          trained reward models (with reward_meta.json), by the train-reward stage
      metrics.json                    the train-reward stage's summary: training metrics (pairwise and step
                                      accuracy, times), model health
      stage.json, README.md, plots/, ledger/, logs/
                                      the marker, dataset card, plots, cost ledger and embedded-model log
                                      (storage/folder.py)

Both reward stages use this folder: train-reward's --out defaults to its --data, the reward-data folder
(RewardModelsFolder: that folder keeps its reward-data stage.json; a separate --out gets its own, see there).

Trainer formats (field by field):
- IRM pairs (TRL RewardTrainer, explicit prompt): `prompt` str, `chosen` str, `rejected` str, `margin` float.
  `prompt` is the fixed instruction-rating prompt (`reward.irm_prompt`); chosen/rejected are instructions.
- PRM (TRL stepwise supervision): `prompt` str, `completions` list[str], `labels` list[bool]; beside them
  `raw_scores` (the labelling method's own figure per step) and `scores` (the same mapped to 0..1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from evolforge.storage.cards import main_table
from evolforge.storage.folder import BatchedSet, StageFolder, read_marker
from evolforge.storage.fs import AnyPath, exists, location, parquet_file, read_parquet
from evolforge.storage.parts import read_part, read_row_group, write_table_atomic

if TYPE_CHECKING:
    import polars as pl  # imported where used: the CLI's --help path does not load it

# A trained reward model's completion marker: written last (atomically), so a folder with it is complete.
META_FILE = "reward_meta.json"

INPUT_SCHEMA = pa.schema([("id", pa.string()), ("instruction", pa.string()), ("answer", pa.string()),
                          ("domain", pa.string()), ("reference_answer", pa.string())])

GROUP_SCHEMA = pa.schema([
    ("id", pa.string()), ("status", pa.string()), ("reason", pa.string()),
    ("versions", pa.list_(pa.string())), ("sources", pa.list_(pa.string())),
    ("ranking", pa.list_(pa.int32())), ("judge_scores", pa.list_(pa.float64())),
    ("judge_model", pa.string()), ("failed_attempts", pa.int32()), ("calls", pa.int32()),
])

IRM_PAIR_SCHEMA = pa.schema([
    ("prompt", pa.string()), ("chosen", pa.string()), ("rejected", pa.string()), ("margin", pa.float64()),
    ("instruction_id", pa.string()), ("chosen_rank", pa.int32()), ("rejected_rank", pa.int32()),
    ("group_size", pa.int32()), ("chosen_source", pa.string()), ("rejected_source", pa.string()),
])

STEP_ROW_SCHEMA = pa.schema([
    ("id", pa.string()), ("status", pa.string()), ("reason", pa.string()), ("method", pa.string()),
    ("prompt", pa.string()), ("completions", pa.list_(pa.string())), ("labels", pa.list_(pa.bool_())),
    ("raw_scores", pa.list_(pa.float64())), ("scores", pa.list_(pa.float64())),
    ("reasked", pa.bool_()), ("calls", pa.int32()),
])

PRM_COLUMNS = ["prompt", "completions", "labels", "raw_scores", "scores", "id", "method", "reasked"]
PRM_SCHEMA = pa.schema([STEP_ROW_SCHEMA.field(c) for c in PRM_COLUMNS])


KINDS = ("irm", "prm")
DATA_KIND = "reward-data"  # the stage.json kind of a reward-data folder (the reward-data stage's name)


@dataclass(frozen=True, init=False)
class RewardLayout(StageFolder):
    """The reward-data stage's folder (local or URL; see the module docstring); models are trained locally and
    published to it."""

    input = property(lambda self: self.root / "reward_input.parquet")
    irm_groups = property(lambda self: self.root / "irm_groups.parquet")
    irm_pairs = property(lambda self: main_table(self.root))
    prm_steps = property(lambda self: self.root / "prm_steps.parquet")
    prm_rejected = property(lambda self: self.root / "prm_rejected.parquet")
    health = property(lambda self: self.root / "health.json")
    metrics = property(lambda self: self.root / "metrics.json")
    models_dir = property(lambda self: self.root / "models")

    @property
    def irm(self) -> BatchedSet:
        """The IRM batches: reward_input.parquet (row group = batch), irm/parts, irm/journal."""
        return BatchedSet(self.input, self.root / "irm" / "parts", self.root / "irm" / "journal")

    @property
    def prm(self) -> BatchedSet:
        """The PRM batches: the same reward_input.parquet, prm/parts, prm/journal."""
        return BatchedSet(self.input, self.root / "prm" / "parts", self.root / "prm" / "journal")

    def batched(self, kind: str) -> BatchedSet:
        """The batched set of `kind` ("irm" or "prm")."""
        return {"irm": self.irm, "prm": self.prm}[kind]

    def batched_sets(self) -> dict[str, BatchedSet]:
        """The sets a run started (their irm/ or prm/ folder exists), for `status`."""
        return {kind: self.batched(kind) for kind in KINDS if exists(self.root / kind)}

    def status_extra(self) -> dict:
        return {"models_trained": [kind for kind in KINDS if self.model_ready(kind)]}

    def data_tables(self) -> dict[str, AnyPath]:
        """The reward-data tables by dataset-card config name (irm_pairs, the card's default, first)."""
        return {"irm_pairs": self.irm_pairs, "irm_groups": self.irm_groups, "prm_steps": self.prm_steps,
                "prm_rejected": self.prm_rejected}

    def model_dir(self, kind: str) -> AnyPath:
        return self.models_dir / kind

    def training_dir(self, kind: str) -> Path:
        """Where a model is trained: its folder when local; a local scratch folder published to it when remote."""
        from evolforge.storage.fs import scratch_dir

        return scratch_dir("train", self.model_dir(kind)) if self.remote else self.model_dir(kind)

    def fresh_training_dir(self, kind: str) -> Path:
        """`training_dir`, emptied and created anew for a training run (storage/fs.py fresh_dir: what was there,
        links included, is removed without following them), so the trainer's writes stay inside it."""
        from evolforge.storage.fs import fresh_dir

        return fresh_dir(self.training_dir(kind))

    def model_ready(self, kind: str) -> bool:
        return exists(self.model_dir(kind) / META_FILE)

    def local_model(self, kind: str) -> Path:
        """A trained model as a local folder (downloaded and cached when the folder is remote)."""
        from evolforge.storage.fs import local_copy
        return local_copy(self.model_dir(kind), marker=META_FILE)

    def publish_model(self, kind: str) -> None:
        """Upload a model trained in `training_dir` to its remote folder (meta file last); no-op when local."""
        from evolforge.storage.fs import publish_dir
        if self.remote:
            publish_dir(self.training_dir(kind), self.model_dir(kind), last=META_FILE)


@dataclass(frozen=True, init=False)
class RewardModelsFolder(RewardLayout):
    """The train-reward stage's folder: models/irm, models/prm, metrics.json (the stage's summary file, so the
    reward-data summary.json beside it stays) and health.json's "model" part.

    By default it is the reward-data folder itself (train-reward's --out defaults to its --data). That folder
    keeps its reward-data stage.json: the marker names the stage whose output the folder holds, `status` keeps
    showing its IRM and PRM batches (and the models trained), and reward-data can still resume over it; the
    training's completion is metrics.json. An unmarked reward-data folder (from an evolforge before 0.2) is
    left unmarked. A folder of its own (--out elsewhere) gets a train-reward stage.json, with its counts when it
    finished; a folder marked for any other stage is refused (storage/folder.py)."""

    @property
    def summary(self) -> AnyPath:
        return self.metrics

    def holds_reward_data(self) -> bool:
        """The folder is a reward-data folder: marked so, or unmarked with a reward-data input snapshot."""
        marker = read_marker(self.root)
        return marker.get("kind") == DATA_KIND if marker is not None else exists(self.input)

    def start_marker(self, kind: str) -> dict:
        if self.holds_reward_data():
            return read_marker(self.root) or {}
        return super().start_marker(kind)

    def finish_marker(self, kind: str, counts: dict) -> dict:
        if self.holds_reward_data():
            return read_marker(self.root) or {}
        return super().finish_marker(kind, counts)


def evolve_dataset(evolve_out: str | Path) -> AnyPath:
    """The training pool of an evolve run (seeds + accepted evolutions)."""
    from evolforge.storage.layout import RunLayout

    path = RunLayout(evolve_out).evolved
    if not exists(path):
        raise FileNotFoundError(f"{path} not found: pass the output folder of a finished evolve run")
    return path


def build_input(evolved: AnyPath, dest: AnyPath, batch_size: int, max_instructions: int = 0,
                reference_field: str = "reference_answer") -> int:
    """Snapshot the instructions to label into `dest` (row group = batch), so batches are stable on resume."""
    import polars as pl
    df = pl.from_arrow(read_parquet(location(evolved)))
    if "status" in df.columns:
        df = df.filter(pl.col("status").is_null() | pl.col("status").is_in(["seed", "accepted"]))
    df = df.filter(pl.col("instruction").is_not_null() & (pl.col("instruction").str.strip_chars() != ""))
    df = df.unique(subset=["id"], keep="first", maintain_order=True)
    if max_instructions:
        df = df.head(max_instructions)
    cols = {
        "id": df["id"].cast(pl.String),
        "instruction": df["instruction"],
        "answer": df["answer"].cast(pl.String) if "answer" in df.columns else pl.Series([None] * df.height, dtype=pl.String),
        "domain": df["domain"] if "domain" in df.columns else pl.Series(["general"] * df.height),
        "reference_answer": (df[reference_field].cast(pl.String) if reference_field in df.columns
                             else pl.Series([None] * df.height, dtype=pl.String)),
    }
    table = pa.Table.from_pydict({k: v.to_list() for k, v in cols.items()}, schema=INPUT_SCHEMA)
    if table.num_rows == 0:
        raise ValueError(f"{evolved} holds no usable instruction")
    write_table_atomic(table, dest, row_group_size=batch_size)
    return table.num_rows


def read_batch(layout: RewardLayout, batch: int) -> list[dict]:
    """The records of one batch (row group) of the input snapshot (both sets share it)."""
    return read_row_group(layout.input, batch).to_pylist()


def concat_parts(batched: BatchedSet, schema: pa.Schema) -> pa.Table:
    """Every batch's part of a set, in batch order, as `schema` (its columns, in its order)."""
    tables = [read_part(batched.part(b)).select(schema.names).cast(schema) for b in range(batched.batch_count())]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def write_irm_sets(groups: pa.Table, pairs: list[dict], layout: RewardLayout) -> int:
    write_table_atomic(groups.replace_schema_metadata(None), layout.irm_groups)
    write_table_atomic(pa.Table.from_pylist(pairs, schema=IRM_PAIR_SCHEMA), layout.irm_pairs)
    return len(pairs)


def write_prm_sets(rows: pa.Table, layout: RewardLayout) -> tuple[int, int]:
    import polars as pl
    df = pl.from_arrow(rows)
    ok = df.filter(pl.col("status") == "ok").select(PRM_COLUMNS)
    rejected = df.filter(pl.col("status") != "ok").select("id", "status", "reason", "prompt", "reasked")
    write_table_atomic(ok.to_arrow().cast(PRM_SCHEMA), layout.prm_steps)
    write_table_atomic(rejected.to_arrow(), layout.prm_rejected)
    return ok.height, rejected.height


def read_irm_pairs(path: str | Path) -> pl.DataFrame:
    import polars as pl
    return pl.from_arrow(read_parquet(location(path)))


def read_prm_steps(path: str | Path) -> pl.DataFrame:
    import polars as pl
    return pl.from_arrow(read_parquet(location(path)))


def read_groups(layout: RewardLayout) -> pl.DataFrame:
    import polars as pl
    return pl.from_arrow(read_parquet(layout.irm_groups))


def parquet_rows(path: AnyPath) -> int:
    return parquet_file(location(path)).metadata.num_rows
