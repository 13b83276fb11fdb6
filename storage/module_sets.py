"""Module-DAG reasoning (DeCoRL) on disk: where every file lives, the parquet schemas, readers and writers.

    OUT/                              a modules output folder
      modules_input.parquet           the questions (id, question); row group = batch, fixed on the first run
      parts/batch_00000.parquet       one atomic part per finished batch: one row per question (ITEM_SCHEMA)
      journal/batch_00000.jsonl       model calls finished inside the batch (replayed on resume)
      items.parquet                   every question: module outputs, final answer, contributions, latencies
      prm_steps.parquet               TRL stepwise-supervision form, one step per non-exit module (PRM_SCHEMA of
                                      storage/reward_sets.py, the form the reward stage writes)
      prm_rejected.parquet            questions without PRM rows (exit failed, judge failed, endpoint rejected)
      summary.json                    counts, per-module stats, the Mermaid graph, cost
      graph.md                        the Mermaid graph annotated with mean latency and mean contribution
      ledger/, logs/                  cost ledger and embedded-model log (storage.layout.RunLayout)

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
  for the exit), judge_without (the judge's score of the answer without this module);
- module_calls, judge_calls (1 + k when judged; 0 calls on a resumed item are still counted as made),
  wall_s (the item, judging included), forward_s (the module graph alone), chain_s (the longest dependency
  chain of the measured module latencies: the floor of forward_s), levels_s (the sum over dependency levels of
  the slowest module in the level: what lock-step rounds would take).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa

from evolforge.storage.datasets import read_any_table
from evolforge.storage.fs import AnyPath, ensure_dir, exists, location, read_parquet, write_text_atomic
from evolforge.storage.layout import OutputFolder
from evolforge.storage.parts import num_row_groups, read_part, read_row_group, write_table_atomic
from evolforge.storage.reward_sets import PRM_COLUMNS, PRM_SCHEMA, STEP_ROW_SCHEMA

INPUT_SCHEMA = pa.schema([("id", pa.string()), ("question", pa.string())])

MODULE_STRUCT = pa.struct([
    ("id", pa.string()), ("output_type", pa.string()), ("status", pa.string()), ("reason", pa.string()),
    ("output", pa.string()), ("confidence", pa.float64()), ("model", pa.string()), ("calls", pa.int32()),
    ("reasks", pa.int32()), ("truncations", pa.int32()), ("max_tokens", pa.int32()),
    ("errors", pa.list_(pa.string())), ("latency_s", pa.float64()), ("started_s", pa.float64()),
    ("finished_s", pa.float64()), ("contribution", pa.float64()), ("judge_without", pa.float64()),
])

ITEM_SCHEMA = pa.schema([
    ("id", pa.string()), ("question", pa.string()), ("status", pa.string()), ("reason", pa.string()),
    ("final_answer", pa.string()), ("answer", pa.string()), ("aggregation", pa.string()), ("ablation", pa.string()),
    ("judge_model", pa.string()), ("judge_full", pa.float64()), ("judge_errors", pa.list_(pa.string())),
    ("modules", pa.list_(MODULE_STRUCT)), ("module_calls", pa.int32()), ("judge_calls", pa.int32()),
    ("wall_s", pa.float64()), ("forward_s", pa.float64()), ("chain_s", pa.float64()), ("levels_s", pa.float64()),
])

# PRM rows are built in the reward stage's step-row form (STEP_ROW_SCHEMA), written in its trainer form (PRM_SCHEMA)
REJECTED_SCHEMA = pa.schema([("id", pa.string()), ("status", pa.string()), ("reason", pa.string()),
                             ("prompt", pa.string())])


@dataclass(frozen=True, init=False)
class ModulesLayout(OutputFolder):
    """A modules output folder (local or URL)."""

    input = property(lambda self: self.root / "modules_input.parquet")
    items = property(lambda self: self.root / "items.parquet")
    prm_steps = property(lambda self: self.root / "prm_steps.parquet")
    prm_rejected = property(lambda self: self.root / "prm_rejected.parquet")
    summary = property(lambda self: self.root / "summary.json")
    graph_md = property(lambda self: self.root / "graph.md")

    def part(self, batch: int) -> AnyPath:
        return self.root / "parts" / f"batch_{batch:05d}.parquet"

    def journal(self, batch: int) -> AnyPath:
        return self.root / "journal" / f"batch_{batch:05d}.jsonl"

    def ensure(self) -> "ModulesLayout":
        ensure_dir(self.root)
        return self


def build_input(source: str | Path, dest: AnyPath, batch_size: int, question_field: str = "question",
                id_field: str = "id", max_items: int = 0) -> int:
    """Snapshot the questions of a jsonl / csv / parquet file into `dest` (row group = batch), so batches are
    stable on resume. The question is `question_field`, else `instruction` (an evolve run's evolved.parquet,
    whose eliminated rows are left out); ids are `id_field`, else row numbers."""
    df, _ = read_any_table(source)
    field = question_field if question_field in df.columns else "instruction" if "instruction" in df.columns else None
    if field is None:
        raise ValueError(f"{source} has no {question_field!r} (or 'instruction') column; set modules.question_field "
                         f"(columns: {', '.join(df.columns)})")
    if "status" in df.columns and df.schema["status"] == pl.String:
        df = df.filter(pl.col("status").is_null() | pl.col("status").is_in(["seed", "accepted"]))
    ids = (df[id_field].cast(pl.String) if id_field in df.columns
           else pl.Series([f"q{i:05d}" for i in range(df.height)], dtype=pl.String))
    df = pl.DataFrame({"id": ids, "question": df[field].cast(pl.String)})
    df = df.filter(pl.col("question").is_not_null() & (pl.col("question").str.strip_chars() != ""))
    df = df.filter(pl.col("id").is_not_null()).unique(subset=["id"], keep="first", maintain_order=True)
    if max_items:
        df = df.head(max_items)
    if df.height == 0:
        raise ValueError(f"{source} holds no usable question")
    write_table_atomic(df.to_arrow().cast(INPUT_SCHEMA), dest, row_group_size=batch_size)
    return df.height


def batch_count(layout: ModulesLayout) -> int:
    return num_row_groups(layout.input)


def read_batch(layout: ModulesLayout, batch: int) -> list[dict]:
    return read_row_group(layout.input, batch).to_pylist()


def concat_parts(layout: ModulesLayout) -> pa.Table:
    tables = [read_part(layout.part(b)).select(ITEM_SCHEMA.names).cast(ITEM_SCHEMA) for b in range(batch_count(layout))]
    return pa.concat_tables(tables) if tables else ITEM_SCHEMA.empty_table()


def write_items(items: pa.Table, layout: ModulesLayout) -> AnyPath:
    return write_table_atomic(items.replace_schema_metadata(None), layout.items)


def write_prm_sets(step_rows: list[dict], layout: ModulesLayout) -> tuple[int, int]:
    """prm_steps.parquet (the rows with status ok, PRM_SCHEMA) and prm_rejected.parquet (the others)."""
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
    return pl.from_arrow(read_parquet(location(path)))


def parts_complete(layout: ModulesLayout) -> bool:
    return exists(layout.input) and all(exists(layout.part(b)) for b in range(batch_count(layout)))
