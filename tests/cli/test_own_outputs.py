"""Own outputs are inputs: a stage reads the tables other stages write. dedup on an evolve run's evolved.parquet
and lineage.parquet (which carry a dedup_similarity column of their own) writes its kept and dropped tables."""

from __future__ import annotations

import polars as pl
import pytest

from evolforge.config.settings import DedupSettings
from evolforge.tasks.dedup.pipeline import dedup_file
from evolforge.tasks.evolve.stage import LINEAGE_COLUMNS


def evolve_table(path, rows: int = 6):
    """A table with the evolve stage's lineage columns (evolved.parquet and lineage.parquet share them), holding
    an exact duplicate so that dedup drops a row."""
    texts = [f"Explain topic {i} in detail." for i in range(rows - 1)] + ["Explain topic 0 in detail."]
    data = {c: [None] * rows for c in LINEAGE_COLUMNS}
    data.update(id=[f"r{i}" for i in range(rows)], instruction=texts, round=list(range(rows)),
                dedup_similarity=[0.5] * rows, duplicate_of=[None] * rows, calls=[1] * rows)
    pl.DataFrame(data).write_parquet(path)
    return path


@pytest.mark.parametrize("name", ["evolved.parquet", "lineage.parquet"])
def test_dedup_reads_the_evolve_stage_tables(tmp_path, name):
    src = evolve_table(tmp_path / name)
    out = tmp_path / "dedup"
    summary = dedup_file(src, "instruction", out, DedupSettings(minhash=False, embedding=False), id_field="id")
    assert summary["kept"] == 5 and summary["dropped"] == 1
    dropped = pl.read_parquet(out / "dropped.parquet")
    assert dropped["dedup_duplicate_of"].to_list() == ["r0"] and dropped["input_dedup_similarity"].to_list() == [0.5]
    assert pl.read_parquet(out / "kept.parquet").height == 5


def test_modules_on_a_table_without_a_question_column_names_its_own_setting(tmp_path):
    """The synthesized tasks table holds its questions in `statement`: the refusal names the setting that reads
    another column for the modules stage (modules.question_field), not the seed files' input.instruction_field."""
    from evolforge.config.settings import load_settings
    from evolforge.tasks.core.checks import InputError
    from evolforge.tasks.modules.stage import ModulesParams, check

    tasks = tmp_path / "tasks.parquet"
    pl.DataFrame({"task_id": ["t1"], "kind": ["math"], "statement": ["Ann buys 3 boxes of 4 apples. How many?"],
                  "answer": ["12"]}).write_parquet(tasks)
    with pytest.raises(InputError, match=r"modules\.question_field") as err:
        check(ModulesParams(input=str(tasks), out=str(tmp_path / "m"), base_url="http://127.0.0.1:9/v1"),
              load_settings())
    assert "input.instruction_field" not in str(err.value) and "statement" in str(err.value)
    overridden = load_settings(overrides={"modules": {"question_field": "statement"}})
    check(ModulesParams(input=str(tasks), out=str(tmp_path / "m"), base_url="http://127.0.0.1:9/v1"), overridden)
