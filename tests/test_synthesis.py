"""Task synthesis: the validator loop, solver check, math agreement and the cost-per-task table."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow
from evolforge.tasks.synthesis import checks as chk

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.mark.parametrize("expr,value", [("42", 42.0), ("3/4", 0.75), ("2*5+1", 11.0), ("1,200", 1200.0),
                                        ("2^3", 8.0), ("__import__('os')", None), ("9**9999", None), ("", None)])
def test_eval_number_is_safe_arithmetic(expr, value):
    assert chk.eval_number(expr) == value


def test_final_answer_and_difficulty():
    assert chk.final_answer("Step 1: 3*4\nThe answer is: 12") == 12.0
    assert chk.final_answer("so we get 7 apples and then 9") == 9.0
    # the shared extractor (tasks/text/answers.py) finds the text, eval_number evaluates it
    assert chk.final_answer("Step 1: 3*4 = 12.\nThe answer is: 3*4 = 12 apples.") == 12.0
    assert chk.final_answer("so \\boxed{\\frac{3}{4}}") == 0.75 and chk.final_answer("#### 1,200") == 1200.0
    assert chk.final_answer("no number here") is None
    assert [chk.difficulty(x) for x in (1.0, 0.67, 0.5, 1 / 3, 0.2, 0.0)] == ["easy", "easy", "medium", "medium", "hard", "hard"]


def test_synthesis_flow_repairs_labels_rejects_and_costs(tmp_path, server):
    seeds = tmp_path / "seeds.jsonl"
    rows = [
        {"id": "ok", "instruction": "Write a function that adds two numbers.", "domain": "code"},
        {"id": "buggy", "instruction": "BUGGY: write an adder function.", "domain": "code"},
        {"id": "trivial", "instruction": "TRIVIAL: write an adder with tests.", "domain": "code"},
        {"id": "hard", "instruction": "UNSOLVABLE: an adder nobody gets right.", "domain": "code"},
        {"id": "m1", "instruction": "A shop sells 3 boxes of 4 apples each. How many apples in total?", "domain": "math"},
        {"id": "m2", "instruction": "WRONGANSWER: 3 boxes with 4 pears each, how many pears in total?", "domain": "math"},
    ]
    seeds.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    summary = synthesize_flow(SynthesizeParams(
        seeds=str(seeds), out=str(tmp_path / "out"), base_url=server.base_url,
        overrides={"synthesis": {"batch_size": 3, "prune_jaccard": 1.0}}))
    out = tmp_path / "out"
    tasks = pl.read_parquet(out / "tasks.parquet")
    rejected = pl.read_parquet(out / "rejected.parquet")
    by_id = {r["task_id"]: r for r in pl.concat([tasks, rejected]).to_dicts()}
    assert by_id["t-ok-code"]["status"] == "kept" and by_id["t-ok-code"]["difficulty"] == "easy"
    buggy = by_id["t-buggy-code"]
    assert buggy["status"] == "kept" and buggy["repairs"] == 1
    phases = [a["phase"] for a in json.loads(buggy["attempts"])]
    assert phases[:3] == ["stub", "reference", "repair-1"]
    assert json.loads(buggy["attempts"])[1]["changed"] == "solution"
    assert by_id["t-trivial-code"]["status"] == "rejected" and "trivial" in by_id["t-trivial-code"]["reject_reason"]
    hard = by_id["t-hard-code"]
    assert hard["status"] == "kept" and hard["pass_rate"] == 0.0 and hard["difficulty"] == "hard"
    assert by_id["t-m1-math"]["status"] == "kept" and by_id["t-m1-math"]["answer"] == "3*4"
    assert by_id["t-m2-math"]["status"] == "rejected" and "disagrees" in by_id["t-m2-math"]["reject_reason"]

    costs = pl.read_parquet(out / "cost_per_task.parquet")
    row = costs.filter(pl.col("task_id") == "t-buggy-code").to_dicts()[0]
    assert row["proposal_calls"] == 1 and row["repairs_calls"] == 1 and row["solver_calls"] == 3
    assert row["sandbox_seconds"] > 0 and row["wall_seconds"] > 0
    assert summary["proposed"] == 6 and summary["kept"] == 4 and summary["yield"] == pytest.approx(4 / 6, abs=1e-3)
    assert set(summary["rejections"]) == {by_id["t-trivial-code"]["reject_reason"], by_id["t-m2-math"]["reject_reason"]}
    assert (out / "cost_per_task.csv").exists()

    sent = len(server.posts())
    synthesize_flow(SynthesizeParams(seeds=str(seeds), out=str(out), base_url=server.base_url,
                                     overrides={"synthesis": {"batch_size": 3, "prune_jaccard": 1.0}}))
    assert len(server.posts()) == sent  # resumed: nothing repeated


def test_near_duplicate_proposals_are_pruned_before_testing(tmp_path, server):
    seeds = tmp_path / "s.jsonl"
    seeds.write_text("\n".join(json.dumps({"id": f"c{i}", "instruction": f"Adder variant {i}", "domain": "code"})
                               for i in range(3)) + "\n")
    summary = synthesize_flow(SynthesizeParams(seeds=str(seeds), out=str(tmp_path / "o"), base_url=server.base_url,
                                               overrides={"synthesis": {"batch_size": 3, "concurrency": 1, "prune_jaccard": 0.8}}))
    assert summary["kept"] == 1
    assert summary["rejections"] == {"near-duplicate of an earlier proposal (pruned before testing)": 2}
    rej = pl.read_parquet(tmp_path / "o" / "rejected.parquet")
    assert all(json.loads(a) == [] for a in rej["attempts"])  # no sandbox run was spent on them
