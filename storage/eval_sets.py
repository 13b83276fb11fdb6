"""Files of the evaluation stage.

    EVAL_OUT/
      generations/<benchmark>.parquet   the policy's completions (GENERATION_SCHEMA), written once per benchmark: a
                                        rerun over the folder checks them again without generating again
      data/<benchmark>.parquet          one row per sample with its verdict (RESULT_SCHEMA); a benchmark with its
                                        results is finished and skipped by a rerun
      data/README.md                    the dataset card of the results (one config per benchmark)
      metrics.json                      the table: per benchmark and domain, problems, samples, pass@k, Wilson 95%
      plots/*.png                       eval_pass_at_1 (bars with intervals)
      summary.json, stage.json, ledger/, logs/   (storage/folder.py); the ledger has the endpoint policy's calls
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from evolforge.storage.folder import StageFolder
from evolforge.storage.fs import exists, location, read_parquet, write_text_atomic
from evolforge.storage.parts import write_table_atomic

GENERATION_SCHEMA = pa.schema([("benchmark", pa.string()), ("problem_id", pa.string()), ("domain", pa.string()),
                               ("template", pa.string()), ("prompt", pa.string()), ("samples", pa.list_(pa.string()))])
RESULT_SCHEMA = pa.schema([("benchmark", pa.string()), ("problem_id", pa.string()), ("domain", pa.string()),
                           ("sample", pa.int32()), ("passed", pa.bool_()), ("detail", pa.string()),
                           ("completion", pa.string())])


@dataclass(frozen=True, init=False)
class EvalFolder(StageFolder):
    """The evaluation stage's folder (see the module docstring)."""

    def ensure(self) -> "EvalFolder":
        super().ensure()
        for d in (self.generations_dir, self.data_dir):
            Path(d).mkdir(parents=True, exist_ok=True)
        return self

    @property
    def card_dir(self) -> Path:
        return self.data_dir

    generations_dir = property(lambda self: self.root / "generations")
    data_dir = property(lambda self: self.root / "data")
    metrics = property(lambda self: self.root / "metrics.json")

    def generations(self, benchmark: str) -> Path:
        return self.generations_dir / f"{benchmark}.parquet"

    def results(self, benchmark: str) -> Path:
        return self.data_dir / f"{benchmark}.parquet"

    def status_extra(self) -> dict:
        return {"benchmarks_done": sorted(p.stem for p in Path(self.data_dir).glob("*.parquet"))}


def write_generations(rows: list[dict], path: Path) -> Path:
    return write_table_atomic(pa.Table.from_pylist(rows, schema=GENERATION_SCHEMA), path)


def write_results(rows: list[dict], path: Path) -> Path:
    return write_table_atomic(pa.Table.from_pylist(rows, schema=RESULT_SCHEMA), path)


def read_rows(path: str | Path) -> list[dict] | None:
    """The rows of a table (a local path or URL), or None when it has not been written."""
    path = location(path)
    return read_parquet(path).to_pylist() if exists(path) else None


def write_json(path: Path, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")
