"""Files of a synthesis run.

    OUT/input.parquet                 the seeds (one row group per batch)
    OUT/parts/batch_NNNNN.parquet     one atomic part per finished batch (every task, kept or rejected)
    OUT/journal/batch_NNNNN.jsonl     model calls finished inside a batch (replayed on resume)
    OUT/ledger/*.jsonl                cost ledger (task_id = the synthesized task)
    OUT/data/train-00000-of-00001.parquet
                                      the tasks table (config `tasks`, what load_dataset("parquet", data_dir=OUT)
                                      loads, storage/cards.py): kept tasks: statement, entry_point, solution,
                                      tests / answer, difficulty, pass_rate (`tasks.parquet` before)
    OUT/rejected.parquet              rejected tasks with reject_reason and every attempt
    OUT/data/rejected-00000-of-00001.parquet
                                      only when no task was kept: the rejected tasks again, as split `rejected`
                                      of what load_dataset("parquet", data_dir=OUT) loads; the train file is
                                      then not written (datasets 5.2 cannot load a split of 0 rows: "Instruction
                                      'train' corresponds to no data"), so nothing trains on a rejected task
    OUT/cost_per_task.parquet (.csv)  per task: calls, tokens, USD, wall and sandbox seconds by phase
    OUT/summary.json                  yield, rejection reasons, mean / median cost and minutes per kept task
    OUT/README.md, OUT/plots/, OUT/stage.json, OUT/rejects.jsonl   the card, plots, marker, malformed seed rows
                                      (storage/folder.py)
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from evolforge.storage.cards import MAIN_TABLE, main_table
from evolforge.storage.folder import BatchedSet, StageFolder
from evolforge.storage.fs import AnyPath, exists, location, read_parquet, unlink, write_bytes_atomic
from evolforge.storage.parts import write_table_atomic

NONE_KEPT_SPLIT = "rejected-00000-of-00001.parquet"  # in data/, beside where the tasks table goes

TASK_SCHEMA = pa.schema([
    ("task_id", pa.string()), ("seed_id", pa.string()), ("kind", pa.string()), ("status", pa.string()),
    ("reject_reason", pa.string()), ("statement", pa.string()), ("entry_point", pa.string()),
    ("solution", pa.string()), ("tests", pa.string()), ("answer", pa.string()), ("difficulty", pa.string()),
    ("pass_rate", pa.float64()), ("solver_passes", pa.int32()), ("solver_attempts", pa.int32()),
    ("repairs", pa.int32()), ("sandbox_seconds", pa.float64()), ("wall_seconds", pa.float64()),
    ("attempts", pa.string()),
])


class SynthLayout(StageFolder):
    """A synthesis output folder (see the module docstring)."""

    @property
    def seeds(self) -> BatchedSet:
        """The seeds (input.parquet, row group = batch), one part and one call journal per batch."""
        return BatchedSet(self.root / "input.parquet", self.root / "parts", self.root / "journal")

    @property
    def input(self) -> AnyPath:
        return self.seeds.input

    @property
    def rejects(self) -> AnyPath:
        return self.root / "rejects.jsonl"

    def batched_sets(self) -> dict[str, BatchedSet]:
        return {"tasks": self.seeds}

    @property
    def tasks(self) -> AnyPath:
        return main_table(self.root)

    @property
    def none_kept_split(self) -> AnyPath:
        """OUT/data/rejected-00000-of-00001.parquet: what data_dir loads when no task was kept (see above)."""
        return self.root / MAIN_TABLE[0] / NONE_KEPT_SPLIT

    @property
    def legacy_tasks(self) -> AnyPath:
        """Where a synthesis run kept its tasks before the main table moved to data/ (still read)."""
        return self.root / "tasks.parquet"

    @property
    def rejected(self) -> AnyPath:
        return self.root / "rejected.parquet"

    @property
    def cost_per_task(self) -> AnyPath:
        return self.root / "cost_per_task.parquet"

    def all_parts(self) -> pa.Table:
        return self.seeds.all_parts(TASK_SCHEMA)


def write_task_tables(lay: SynthLayout, table: pa.Table) -> dict[str, int]:
    """The kept tasks (the tasks table, data/train-...) and the rejected ones (rejected.parquet) of every part.

    With no task kept the train file is not written (an earlier run's is removed) and data/ holds the rejected
    tasks as split `rejected` instead, so `load_dataset("parquet", data_dir=OUT)` loads them (datasets cannot load
    a split of 0 rows); with tasks kept, such a split an earlier run left is removed. Returns the counts."""
    is_kept = pc.fill_null(pc.equal(table.column("status"), "kept"), False)
    kept, rejected = table.filter(is_kept), table.filter(pc.invert(is_kept))
    write_table_atomic(rejected, lay.rejected)
    if kept.num_rows:
        write_table_atomic(kept, lay.tasks)
        if exists(lay.none_kept_split):
            unlink(lay.none_kept_split)
    else:
        write_table_atomic(rejected, lay.none_kept_split)
        if exists(lay.tasks):
            unlink(lay.tasks)
    return {"kept": kept.num_rows, "rejected": rejected.num_rows}


def read_kept_tasks(path: str | AnyPath) -> list[dict]:
    """The kept tasks of a synthesis run as rows: its tasks table (a parquet file), or the run's output folder
    (local or URL; an older run's OUT/tasks.parquet too). A run that kept no task gives []."""
    path = location(path)
    if not str(path).endswith(".parquet"):
        lay = SynthLayout(path)
        path = lay.tasks if exists(lay.tasks) or not exists(lay.legacy_tasks) else lay.legacy_tasks
    if not exists(path) and exists(path.parent / NONE_KEPT_SPLIT):
        return []  # the run finished and kept nothing (write_task_tables)
    if not exists(path):
        raise FileNotFoundError(f"synthesized tasks not found: {path} (run the synthesize flow first, or pass its "
                                "tasks table, OUT/data/train-00000-of-00001.parquet)")
    return [r for r in read_parquet(path).to_pylist() if (r.get("status") or "kept") == "kept"]


def write_csv_atomic(df, path: AnyPath) -> AnyPath:
    """A polars DataFrame as csv, written atomically (local or remote)."""
    import io

    buf = io.BytesIO()
    df.write_csv(buf)
    write_bytes_atomic(path, buf.getvalue())
    return path
