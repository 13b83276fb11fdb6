"""Module-DAG reasoning (DeCoRL) on disk: where every file lives, the parquet schemas, readers and writers.

    OUT/                              a modules output folder
      modules_input.parquet           the questions (id, question[, difficulty]); row group = batch, fixed on
                                      the first run (difficulty: see `difficulty_of`)
      parts/batch_00000.parquet       one atomic part per finished batch: one row per question (ITEM_SCHEMA)
      journal/batch_00000.jsonl       model calls finished inside the batch (replayed on resume)
      compare/batch_00000.parquet     --compare: one atomic part per batch, one row per question (COMPARE_SCHEMA)
      journal/compare_00000.jsonl     --compare: the batch's single-shot and comparison-judge calls
      comparison.parquet              --compare: every question's single-shot answer, both scores, winner
      data/train-00000-of-00001.parquet
                                      the items table (config `items`, what load_dataset("parquet", data_dir=OUT)
                                      loads, storage/cards.py): every question: module outputs, final answer,
                                      contributions, latencies (`items.parquet` before)
      prm_steps.parquet               TRL stepwise-supervision form, one step per non-exit module (PRM_SCHEMA of
                                      storage/reward_sets.py, the form the reward stage writes)
      prm_rejected.parquet            questions without PRM rows (exit failed, judge failed, endpoint rejected)
      summary.json                    counts, per-module stats, the Mermaid graph, cost
      graph.md                        the Mermaid graph annotated with mean latency and mean contribution
      README.md, plots/, stage.json   the dataset card, the plots and the stage marker
      ledger/, logs/                  cost ledger and embedded-model log (storage/folder.py StageFolder)

The questions and their parts and journals are the `questions` batched table (storage/folder.py BatchedSet);
the comparison's parts and journals (over the same questions) the `comparisons` one.

ITEM_SCHEMA, field by field:
- id, question; status: ok (answer judged, every contribution known) | failed (the exit module has no valid
  output: not judged) | judge_failed (a judge reply held no 0-10 score) | error (the endpoint rejected a call);
  reason: why, for any status but ok;
- final_answer: the exit module's `final` content (aggregation integrate) or the joined contents (concat);
  answer: exactly the text the judge scored for the full graph; aggregation, ablation, judge_model;
- judge_full: the judge's 0-10 score of `answer`; judge_errors: one line per judge reply without a score;
- modules: one struct per module in dependency order: id, output_type, status (ok | invalid | truncated |
  error), reason, output (the validated {type, content, confidence, dependencies} as JSON; null unless ok),
  confidence, model, calls, reasks (schema re-asks), truncations (re-asks with a larger budget), max_tokens (the
  last budget), errors (every failed attempt's reason), latency_s (first call sent to last reply, re-asks
  included), started_s / finished_s (from the item's start), contribution (judge_full - judge_without; null
  for the exit), judge_without (the judge's score of the answer without this module), local_reward (the
  module's own check, 0..1, beside its contribution: tasks/modules/local_reward.py) and local_parts, what it is
  recomputed from: schema (1 when the output passed its schema, else 0) and schema_reason, own (the output
  kind's own check: steps / result: every "a op b = c" it states re-done safely, 1 all right, 0 any wrong;
  verdict: its ok flag against the answer's correctness, null here (a modules run has no ground truth); null
  when it does not apply) and own_reason, weight (modules.local_reward_weight); reward = 0 when schema is 0,
  schema when own is null, else (1 - weight) * schema + weight * own. Parts written before local rewards (no
  such fields) do not cast: run such a folder into a new --out;
- module_calls, judge_calls (1 + k when judged; 0 calls on a resumed item are still counted as made),
  wall_s (the item, judging included), forward_s (the module graph alone), chain_s (the longest dependency
  chain of the measured module latencies: the floor of forward_s), levels_s (the sum over dependency levels of
  the slowest module in the level: what lock-step rounds would take).

COMPARE_SCHEMA (modules.compare / `--compare`: the same question single-shot and through the graph, one judge):
- id, difficulty (see `difficulty_of`), graph_status (the item's status);
- single_status: ok | error (the endpoint rejected the single-shot call) | judge_failed (no 0-10 score in the
  judge's reply); single_answer: the `answer` stage model's single-shot reply; single_model;
- graph_score / single_score: the judge's 0-10 scores (graph_score is the item's own judge_full when it has one);
  graph_score_reused: true when judge_full was reused (no new call);
- winner: graph | single_shot | tie | null (not compared: a judge reply without a score, or no answer on both
  sides); a side without an answer (the graph's exit module failed, or the endpoint rejected a call) loses;
- reason: why a side has no score; single_calls (0-1 answer calls), judge_calls (1 + 1 when the graph's judge_full
  was missing but it has an answer: at most 2 per question).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from evolforge.storage.cards import main_table
from evolforge.storage.datasets import read_any_table
from evolforge.storage.folder import BatchedSet, StageFolder
from evolforge.storage.fs import AnyPath, exists, location, read_parquet, write_text_atomic
from evolforge.storage.parts import read_part, read_row_group, write_table_atomic
from evolforge.storage.reward_sets import PRM_COLUMNS, PRM_SCHEMA, STEP_ROW_SCHEMA

if TYPE_CHECKING:
    import polars as pl  # imported where used: the CLI's --help path does not load it

INPUT_SCHEMA = pa.schema([("id", pa.string()), ("question", pa.string())])
# the input with a difficulty per question (written when the source has a `difficulty` or `generation` column)
INPUT_DIFFICULTY_SCHEMA = pa.schema([*INPUT_SCHEMA, ("difficulty", pa.string())])
DIFFICULTIES = ("easy", "medium", "hard", "unknown")  # the report's row order (other labels follow, sorted)

# the parts a module's local reward is recomputed from (tasks/modules/local_reward.recompute): reward = 0 when
# schema is 0; = schema when own is null; else (1 - weight) * schema + weight * own
LOCAL_PARTS = pa.struct([("schema", pa.float64()), ("schema_reason", pa.string()), ("own", pa.float64()),
                         ("own_reason", pa.string()), ("weight", pa.float64())])

MODULE_STRUCT = pa.struct([
    ("id", pa.string()), ("output_type", pa.string()), ("status", pa.string()), ("reason", pa.string()),
    ("output", pa.string()), ("confidence", pa.float64()), ("model", pa.string()), ("calls", pa.int32()),
    ("reasks", pa.int32()), ("truncations", pa.int32()), ("max_tokens", pa.int32()),
    ("errors", pa.list_(pa.string())), ("latency_s", pa.float64()), ("started_s", pa.float64()),
    ("finished_s", pa.float64()), ("contribution", pa.float64()), ("judge_without", pa.float64()),
    ("local_reward", pa.float64()), ("local_parts", LOCAL_PARTS),
])

ITEM_SCHEMA = pa.schema([
    ("id", pa.string()), ("question", pa.string()), ("status", pa.string()), ("reason", pa.string()),
    ("final_answer", pa.string()), ("answer", pa.string()), ("aggregation", pa.string()), ("ablation", pa.string()),
    ("judge_model", pa.string()), ("judge_full", pa.float64()), ("judge_errors", pa.list_(pa.string())),
    ("modules", pa.list_(MODULE_STRUCT)), ("module_calls", pa.int32()), ("judge_calls", pa.int32()),
    ("wall_s", pa.float64()), ("forward_s", pa.float64()), ("chain_s", pa.float64()), ("levels_s", pa.float64()),
])

COMPARE_SCHEMA = pa.schema([
    ("id", pa.string()), ("difficulty", pa.string()), ("graph_status", pa.string()), ("status", pa.string()),
    ("single_status", pa.string()), ("single_answer", pa.string()), ("single_model", pa.string()),
    ("graph_score", pa.float64()), ("single_score", pa.float64()), ("graph_score_reused", pa.bool_()),
    ("winner", pa.string()), ("reason", pa.string()), ("single_calls", pa.int32()), ("judge_calls", pa.int32()),
])  # `status` (= the winner, or "not_compared") is what the batch runtime counts

# PRM rows are built in the reward stage's step-row form (STEP_ROW_SCHEMA), written in its trainer form (PRM_SCHEMA)
REJECTED_SCHEMA = pa.schema([("id", pa.string()), ("status", pa.string()), ("reason", pa.string()),
                             ("prompt", pa.string())])


@dataclass(frozen=True)
class CompareSet(BatchedSet):
    """The comparison's batched table: its parts are compare/batch_NNNNN.parquet and its call journals
    journal/compare_NNNNN.jsonl, beside the module graph's journal/batch_NNNNN.jsonl of the same batch."""

    journal_prefix: str = "compare"

    def journal(self, batch: int) -> AnyPath:
        return self.journal_dir / f"{self.journal_prefix}_{batch:05d}.jsonl"


@dataclass(frozen=True, init=False)
class ModulesLayout(StageFolder):
    """A modules output folder, local or URL (see the module docstring)."""

    @property
    def questions(self) -> BatchedSet:
        """The questions (modules_input.parquet, row group = batch), one item part and one journal per batch."""
        return BatchedSet(self.root / "modules_input.parquet", self.root / "parts", self.root / "journal")

    @property
    def comparisons(self) -> CompareSet:
        """`compare`: the same questions' single-shot answers and judge scores, one part and journal per batch."""
        return CompareSet(self.questions.input, self.root / "compare", self.root / "journal")

    def batched_sets(self) -> dict[str, BatchedSet]:
        return {"questions": self.questions}

    input = property(lambda self: self.questions.input)
    items = property(lambda self: main_table(self.root))
    prm_steps = property(lambda self: self.root / "prm_steps.parquet")
    prm_rejected = property(lambda self: self.root / "prm_rejected.parquet")
    graph_md = property(lambda self: self.root / "graph.md")
    comparison = property(lambda self: self.root / "comparison.parquet")


def difficulty_of(difficulty: object = None, generation: object = None) -> str:
    """A question's difficulty for the comparison report. The rule:
    1. the input's `difficulty` value when present and not empty (synthesis tasks carry easy / medium / hard),
       lower-cased;
    2. else the evolve lineage's `generation` (how many evolutions from its seed): 0 (a seed) -> easy,
       1 -> medium, 2 or more -> hard;
    3. else unknown."""
    if difficulty is not None and str(difficulty).strip():
        return str(difficulty).strip().lower()
    if generation is not None:
        try:
            g = int(generation)
        except (TypeError, ValueError):
            return "unknown"
        return "easy" if g <= 0 else "medium" if g == 1 else "hard"
    return "unknown"


def build_input(source: str | Path, dest: AnyPath, batch_size: int, question_field: str = "question",
                id_field: str = "id", max_items: int = 0) -> int:
    """Snapshot the questions of a jsonl / csv / parquet file into `dest` (row group = batch), so batches are
    stable on resume. The question is `question_field`, else `instruction` (an evolve run's evolved.parquet,
    whose eliminated rows are left out); ids are `id_field`, else row numbers. When the source has a
    `difficulty` or `generation` column, each question's difficulty (`difficulty_of`) is kept too."""
    import polars as pl
    df, _ = read_any_table(source)
    field = question_field if question_field in df.columns else "instruction" if "instruction" in df.columns else None
    if field is None:
        raise ValueError(f"{source} has no {question_field!r} (or 'instruction') column; set modules.question_field "
                         f"(columns: {', '.join(df.columns)})")
    if "status" in df.columns and df.schema["status"] == pl.String:
        df = df.filter(pl.col("status").is_null() | pl.col("status").is_in(["seed", "accepted"]))
    ids = (df[id_field].cast(pl.String) if id_field in df.columns
           else pl.Series([f"q{i:05d}" for i in range(df.height)], dtype=pl.String))
    levels = None
    if "difficulty" in df.columns or "generation" in df.columns:
        diff = df["difficulty"].to_list() if "difficulty" in df.columns else [None] * df.height
        gen = df["generation"].to_list() if "generation" in df.columns else [None] * df.height
        levels = pl.Series([difficulty_of(d, g) for d, g in zip(diff, gen)], dtype=pl.String)
    df = pl.DataFrame({"id": ids, "question": df[field].cast(pl.String),
                       **({"difficulty": levels} if levels is not None else {})})
    df = df.filter(pl.col("question").is_not_null() & (pl.col("question").str.strip_chars() != ""))
    df = df.filter(pl.col("id").is_not_null()).unique(subset=["id"], keep="first", maintain_order=True)
    if max_items:
        df = df.head(max_items)
    if df.height == 0:
        raise ValueError(f"{source} holds no usable question")
    schema = INPUT_DIFFICULTY_SCHEMA if levels is not None else INPUT_SCHEMA
    write_table_atomic(df.to_arrow().cast(schema), dest, row_group_size=batch_size)
    return df.height


def batch_count(layout: ModulesLayout) -> int:
    return layout.questions.batch_count()


def read_batch(layout: ModulesLayout, batch: int) -> list[dict]:
    return read_row_group(layout.input, batch).to_pylist()


def concat_parts(layout: ModulesLayout) -> pa.Table:
    qs = layout.questions
    tables = [read_part(qs.part(b)).select(ITEM_SCHEMA.names).cast(ITEM_SCHEMA) for b in range(qs.batch_count())]
    return pa.concat_tables(tables) if tables else ITEM_SCHEMA.empty_table()


def read_part_rows(layout: ModulesLayout, batch: int) -> list[dict]:
    """A finished batch's item rows (ITEM_SCHEMA)."""
    return read_part(layout.questions.part(batch)).select(ITEM_SCHEMA.names).to_pylist()


def concat_compare_parts(layout: ModulesLayout) -> pa.Table:
    cs = layout.comparisons
    tables = [read_part(cs.part(b)).select(COMPARE_SCHEMA.names).cast(COMPARE_SCHEMA)
              for b in range(cs.batch_count()) if exists(cs.part(b))]
    return pa.concat_tables(tables) if tables else COMPARE_SCHEMA.empty_table()


def write_comparison(table: pa.Table, layout: ModulesLayout) -> AnyPath:
    return write_table_atomic(table.replace_schema_metadata(None), layout.comparison)


def write_items(items: pa.Table, layout: ModulesLayout) -> AnyPath:
    return write_table_atomic(items.replace_schema_metadata(None), layout.items)


def write_prm_sets(step_rows: list[dict], layout: ModulesLayout) -> tuple[int, int]:
    """prm_steps.parquet (the rows with status ok, PRM_SCHEMA) and prm_rejected.parquet (the others)."""
    import polars as pl
    table = pa.Table.from_pylist(step_rows, schema=STEP_ROW_SCHEMA)
    df = pl.from_arrow(table)
    ok = df.filter(pl.col("status") == "ok").select(PRM_COLUMNS)
    rejected = df.filter(pl.col("status") != "ok").select("id", "status", "reason", "prompt")
    write_table_atomic(ok.to_arrow().cast(PRM_SCHEMA), layout.prm_steps)
    write_table_atomic(rejected.to_arrow().cast(REJECTED_SCHEMA), layout.prm_rejected)
    return ok.height, rejected.height


def write_graph_markdown(markdown: str, layout: ModulesLayout) -> AnyPath:
    return write_text_atomic(layout.graph_md, markdown)


def read_items(path: str | Path) -> pl.DataFrame:
    import polars as pl
    return pl.from_arrow(read_parquet(location(path)))
