"""Task synthesis: the validator loop, solver check, math agreement and the cost-per-task table."""

from __future__ import annotations

import json
import logging

import polars as pl
import pyarrow as pa
import pytest

from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.synthesis import checks as chk
from evolforge.tasks.synthesis import synthesize as synth
from evolforge.testing.settings import make_settings

# the scripted server answers as the default model, which has no known price: with the default USD budget
# per task an unpriced model rejects every task, so the tests price it
PRICED = {"overrides": {"smollm2-135m-instruct": {"input_per_mtok": 0.1, "output_per_mtok": 0.2},
                        "scripted": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}}


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


@pytest.mark.usefixtures("prefect_harness")
def test_synthesis_flow_repairs_labels_rejects_and_costs(tmp_path, server):
    seeds = tmp_path / "seeds.jsonl"
    rows = [
        {"id": "ok", "instruction": "Write a function that adds two numbers.", "domain": "code"},
        {"id": "buggy", "instruction": "BUGGY: write an adder function.", "domain": "code"},
        {"id": "trivial", "instruction": "TRIVIAL: write an adder with tests.", "domain": "code"},
        {"id": "hard", "instruction": "UNSOLVABLE: an adder nobody gets right.", "domain": "code"},
        {"id": "m1", "instruction": "A shop sells 3 boxes of 4 apples each. How many apples in total?", "domain": "math"},
        {"id": "m2", "instruction": "WRONGANSWER: 3 boxes with 4 pears each, how many pears in total?", "domain": "math"},
        {"id": "m3", "instruction": "WRONGANSWER STUBBORN: 3 crates of 4 figs, how many figs?", "domain": "math"},
    ]
    seeds.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    summary = synthesize_flow(SynthesizeParams(
        seeds=str(seeds), out=str(tmp_path / "out"), base_url=server.base_url,
        overrides={"synthesis": {"batch_size": 3, "prune_jaccard": 1.0}, "pricing": PRICED}))
    out = tmp_path / "out"
    assert {p["model"] for p in server.posts()} == {"smollm2-135m-instruct"}
    tasks = pl.read_parquet(out / "data" / "train-00000-of-00001.parquet")  # the tasks table
    rejected = pl.read_parquet(out / "rejected.parquet")
    by_id = {r["task_id"]: r for r in pl.concat([tasks, rejected]).to_dicts()}
    assert by_id["t-ok-code"]["status"] == "kept" and by_id["t-ok-code"]["difficulty"] == "easy"
    buggy = by_id["t-buggy-code"]
    assert buggy["status"] == "kept" and buggy["repairs"] == 1
    phases = [a["phase"] for a in json.loads(buggy["attempts"])]
    assert phases[:4] == ["stub", "stub-always-equal", "reference", "repair-1"]  # both stubs fail, then the repair
    assert json.loads(buggy["attempts"])[2]["changed"] == "solution"
    assert by_id["t-trivial-code"]["status"] == "rejected" and "trivial" in by_id["t-trivial-code"]["reject_reason"]
    hard = by_id["t-hard-code"]
    assert hard["status"] == "kept" and hard["pass_rate"] == 0.0 and hard["difficulty"] == "hard"
    assert by_id["t-m1-math"]["status"] == "kept" and by_id["t-m1-math"]["answer"] == "3*4"
    # the solvers disagree with m2's reference: repaired (the answer) and kept; m3's repair changes nothing: dropped
    assert by_id["t-m2-math"]["status"] == "kept" and by_id["t-m2-math"]["repairs"] == 1
    assert by_id["t-m2-math"]["answer"] == "3*4" and by_id["t-m2-math"]["difficulty"] == "easy"
    m3 = by_id["t-m3-math"]
    assert m3["status"] == "rejected" and m3["repairs"] == 3 and m3["answer"] == "3*5"
    assert m3["reject_reason"] == "the reference answer 15 disagrees with the solvers' majority (12) after 3 repairs"

    costs = pl.read_parquet(out / "cost_per_task.parquet")
    row = costs.filter(pl.col("task_id") == "t-buggy-code").to_dicts()[0]
    assert row["proposal_calls"] == 1 and row["validate_calls"] == 1 + 3 and row["repairs"] == 1  # repair + 3 solves
    assert row["sandbox_seconds"] > 0 and row["wall_seconds"] > 0
    m3_cost = costs.filter(pl.col("task_id") == "t-m3-math").to_dicts()[0]
    assert m3_cost["validate_calls"] == 4 * 3 + 3  # four rounds of 3 solver attempts, three repairs
    assert summary["proposed"] == 7 and summary["kept"] == 5 and summary["yield"] == pytest.approx(5 / 7, abs=1e-3)
    assert set(summary["rejections"]) == {by_id["t-trivial-code"]["reject_reason"], m3["reject_reason"]}
    # no validator set: the proposer validated its own tasks, which the summary says on one line and records
    assert summary["warning"] == "proposer and validator are the same model (smollm2-135m-instruct); set --validator"
    assert summary["models"] == {"proposer": "smollm2-135m-instruct", "validator": "smollm2-135m-instruct",
                                 "solver": "smollm2-135m-instruct", "same_model": True}
    assert (out / "cost_per_task.csv").exists()

    sent = len(server.posts())
    synthesize_flow(SynthesizeParams(seeds=str(seeds), out=str(out), base_url=server.base_url,
                                     overrides={"synthesis": {"batch_size": 3, "prune_jaccard": 1.0}, "pricing": PRICED}))
    assert len(server.posts()) == sent  # resumed: nothing repeated


@pytest.mark.usefixtures("prefect_harness")
def test_near_duplicate_proposals_are_pruned_before_testing(tmp_path, server):
    seeds = tmp_path / "s.jsonl"
    seeds.write_text("\n".join(json.dumps({"id": f"c{i}", "instruction": f"Adder variant {i}", "domain": "code"})
                               for i in range(3)) + "\n")
    summary = synthesize_flow(SynthesizeParams(seeds=str(seeds), out=str(tmp_path / "o"), base_url=server.base_url,
                                               overrides={"synthesis": {"batch_size": 3, "concurrency": 1, "prune_jaccard": 0.8},
                                                          "pricing": PRICED}))
    assert summary["kept"] == 1
    assert summary["rejections"] == {"near-duplicate of an earlier proposal (pruned before testing)": 2}
    rej = pl.read_parquet(tmp_path / "o" / "rejected.parquet")
    assert all(json.loads(a) == [] for a in rej["attempts"])  # no sandbox run was spent on them


# ---------------------------------------------------------------- one task, straight through synthesize_task


def _task(server, instruction: str, embedded: frozenset = frozenset(), **sections):
    settings = make_settings(server.base_url, **sections)
    gw = Gateway(settings, base_url=server.base_url, run_id="t", embedded_models=embedded)
    return synth.synthesize_task({"id": "s", "instruction": instruction}, "code", gw, settings)


def test_always_equal_stub_fails_ordinary_assertions():
    ns: dict = {}
    exec(chk.always_equal_stub("f"), ns)
    x = ns["f"](1, 2)
    assert x == 5 and 5 == x and not x != 5 and x < 0 and x > 0 and x == pytest.approx(0.3) and x
    assert hash(x) == 0 and list(x) == [] and abs(x - 1) < 1e-9
    assert not isinstance(x, int) and len(x) == 0 and x is not True


def test_an_always_equal_object_cannot_pass_tests_that_only_compare_with_eq(server):
    """The solution runs in its own process: an object it returns is a handle in the tests' process, and comparing
    a handle with == makes the run "not checkable", so the always-equal stub fails even tests that only use ==
    (in one process it passed them, and such tests were rejected as trivial)."""
    task = _task(server, "EQONLY: write an adder.", pricing=PRICED)
    assert task.status == "kept", task.reject_reason
    stub = [a for a in task.attempts if a["phase"] == "stub-always-equal"]
    assert len(stub) == 1 and not stub[0]["passed"] and "_AlwaysEqual" in (stub[0]["not_checkable"] or ""), stub


def test_tests_the_sandbox_cannot_check_are_repaired_or_rejected(server):
    task = _task(server, "UNCHECKABLE: write an adder.", pricing=PRICED, synthesis={"max_repairs": 0})
    assert task.status == "rejected" and task.reject_reason.startswith("not checkable after 0 repairs: "), task.reject_reason
    assert "lock" in task.reject_reason.lower(), task.reject_reason
    reference = [a for a in task.attempts if a["phase"] == "reference"]
    assert len(reference) == 1 and not reference[0]["passed"] and reference[0]["not_checkable"]
    repaired = _task(server, "UNCHECKABLE: write an adder.", pricing=PRICED)  # the repair returns checkable tests
    assert repaired.status == "kept" and repaired.repairs == 1, repaired.reject_reason


def test_an_unpriced_model_puts_the_task_over_its_cost_budget(server, caplog):
    synth._UNPRICED_WARNED.discard("unpriced-model")
    with caplog.at_level(logging.WARNING, logger="evolforge.synthesis"):
        tasks = [_task(server, f"Write an adder {i}.", models={"default": "unpriced-model"}) for i in range(2)]
    for task in tasks:
        assert task.status == "rejected" and "over the cost budget" in task.reject_reason
        assert '[pricing.overrides."unpriced-model"]' in task.reject_reason and task.attempts == []
    warnings = [r.getMessage() for r in caplog.records if r.name == "evolforge.synthesis"]
    assert len(warnings) == 1 and "unpriced-model" in warnings[0] and '[pricing.overrides."unpriced-model"]' in warnings[0]
    # free (the embedded model), priced, or no USD budget: the task goes on
    assert _task(server, "Write an adder 3.", frozenset({"unpriced-model"}), models={"default": "unpriced-model"}).status == "kept"
    assert _task(server, "Write an adder 4.", models={"default": "unpriced-model"},
                 pricing={"overrides": {"unpriced-model": {"input_per_mtok": 0.1, "output_per_mtok": 0.1}}}).status == "kept"
    assert _task(server, "Write an adder 5.", models={"default": "unpriced-model"},
                 synthesis={"budget_usd_per_task": 0}).status == "kept"


def test_the_time_budget_is_checked_before_every_sandbox_run(server):
    server.latency = 0.3  # the proposal alone takes longer than the budget
    task = _task(server, "Write an adder.", pricing=PRICED, synthesis={"budget_seconds_per_task": 0.2})
    assert task.status == "rejected" and task.reject_reason.startswith("over the time budget")
    assert task.attempts == [] and task.sandbox_seconds == 0  # no sandbox run was started over the budget
    assert task.reject_reason == "over the time budget (0.2s)"


def test_a_run_that_keeps_no_task_still_loads_with_load_dataset(tmp_path, server):
    """Every proposal rejected (wrong math answers, tests that assert nothing): the folder loads with
    load_dataset("parquet", data_dir=OUT) (the rejected tasks as split `rejected`, no train split), by its card
    (default config `rejected`), and as no kept tasks for the stages that read it."""
    from datasets import load_dataset

    from evolforge.storage.cards import read_card
    from evolforge.storage.synthesis_sets import read_kept_tasks

    seeds = tmp_path / "seeds.jsonl"
    rows = [{"id": "m1", "instruction": "WRONGANSWER STUBBORN: 3 boxes with 4 pears each, how many pears?", "domain": "math"},
            {"id": "m2", "instruction": "WRONGANSWER STUBBORN: 2 bags with 5 plums each, how many plums?", "domain": "math"},
            {"id": "t1", "instruction": "TRIVIAL: write an adder with tests.", "domain": "code"}]
    seeds.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    params = SynthesizeParams(seeds=str(seeds), out=str(out), base_url=server.base_url,
                              overrides={"synthesis": {"batch_size": 3, "prune_jaccard": 1.0}, "pricing": PRICED})
    from evolforge.flows._stage import KeptNothing

    with pytest.raises(KeptNothing) as kept_nothing:  # the flow run fails: it kept nothing (its summary is written)
        synthesize_flow(params)
    summary = kept_nothing.value.summary
    assert summary["kept"] == 0 and summary["proposed"] == 3
    assert not (out / "data" / "train-00000-of-00001.parquet").exists()
    loaded = load_dataset("parquet", data_dir=str(out))
    assert list(loaded) == ["rejected"] and loaded["rejected"].num_rows == 3
    assert set(loaded["rejected"]["status"]) == {"rejected"} and all(loaded["rejected"]["reject_reason"])
    header, body = read_card(out)
    default = [c["config_name"] for c in header["configs"] if c.get("default")]
    assert default == ["rejected"] and "tasks" not in [c["config_name"] for c in header["configs"]]
    assert "No task was kept" in body
    assert load_dataset(str(out), split="train").num_rows == 3  # the card's default config
    assert read_kept_tasks(out) == [] and read_kept_tasks(out / "data" / "train-00000-of-00001.parquet") == []

    # tables rewritten with a kept task (a later run over the folder): the train file, and no rejected split left
    from evolforge.storage.synthesis_sets import SynthLayout, write_task_tables

    lay = SynthLayout(out)
    parts = lay.all_parts()
    kept_one = parts.set_column(parts.schema.get_field_index("status"), "status",
                                pa.array(["kept"] + ["rejected"] * (parts.num_rows - 1)))
    assert write_task_tables(lay, kept_one) == {"kept": 1, "rejected": 2}
    assert not lay.none_kept_split.exists()
    assert {k: v.num_rows for k, v in load_dataset("parquet", data_dir=str(out)).items()} == {"train": 1}
