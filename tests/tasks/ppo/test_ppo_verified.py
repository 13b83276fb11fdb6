"""Verified ground truth in the PPO data: synthesized math answers and code tests, the unverified setting, and
the evolforge/code reward check (the task's tests run in the sandbox against the response's code)."""

from __future__ import annotations

import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evolforge.config.sections.ppo import PPOSettings
from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.storage.ppo import PPOLayout, read_evolved, read_prompt_rows, read_tasks, write_prompt_parquet
from evolforge.storage.synthesis_sets import TASK_SCHEMA
from evolforge.tasks.ppo import reward as ppo_reward
from evolforge.tasks.ppo.data import build_prompt_rows
from evolforge.tasks.ppo.reward import PPOReward
from evolforge.testing.ppo_models import write_evolved

needs_bwrap = pytest.mark.skipif(not os.access("/usr/bin/bwrap", os.X_OK),
                                 reason="bubblewrap not installed (apt-get install -y bubblewrap)")
SANDBOX = dict(cpu_seconds=5, memory_mb=512, max_processes=32, wall_timeout_seconds=20, max_output_bytes=200_000,
               max_parallel=2)
TESTS = "from solution import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
MATH_Q = "A box holds 3 rows of 4 eggs. How many eggs are in the box?"
CODE_Q = "Write add(a, b) returning the sum of two integers."


def _task(**kw) -> dict:
    base = {name: None for name in TASK_SCHEMA.names}
    return base | {"status": "kept", "difficulty": "easy", "pass_rate": 1.0, "attempts": "[]"} | kw


def write_tasks(folder) -> None:
    rows = [_task(task_id="t-e0-math", seed_id="s0", kind="math", statement=MATH_Q, answer="3*4"),
            _task(task_id="t-e1-code", seed_id="s1", kind="code", statement=CODE_Q, entry_point="add",
                  solution="def add(a, b):\n    return a + b\n", tests=TESTS),
            _task(task_id="t-e2-math", seed_id="s2", kind="math", status="rejected", statement="Rejected one.",
                  answer="5", reject_reason="disagrees")]
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=TASK_SCHEMA), folder / "tasks.parquet")


@pytest.fixture
def inputs(tmp_path):
    records = read_evolved(write_evolved(tmp_path / "run" / "dataset" / "evolved.parquet", n_seeds=6))
    write_tasks(tmp_path / "synth")
    return records, read_tasks(tmp_path / "synth")  # the output folder resolves to its tasks.parquet


def _rows(records, tasks, **kw):
    train, test, counts = build_prompt_rows(records, test_fraction=0.3, split_seed=7, tasks=tasks, **kw)
    return train + test, counts


def test_synthesized_tasks_become_rows_with_verified_ground_truth(inputs, tmp_path):
    records, tasks = inputs
    assert [t["task_id"] for t in tasks] == ["t-e0-math", "t-e1-code"]  # the reader keeps kept tasks only
    rows, counts = _rows(records, tasks)
    by_question = {r["extra_info"]["question"]: r for r in rows}
    math_row, code_row = by_question[MATH_Q], by_question[CODE_Q]
    assert math_row["data_source"] == "evolforge/math" and math_row["ability"] == "math"
    assert math_row["reward_model"] == {"style": "rule", "ground_truth": "12"}  # "3*4" evaluated
    assert math_row["extra_info"]["ground_truth_source"] == "synthesis_math"
    assert code_row["data_source"] == "evolforge/code" and code_row["reward_model"]["style"] == "rule"
    assert json.loads(code_row["reward_model"]["ground_truth"]) == {"entry_point": "add", "tests": TESTS}
    assert "`add`" in code_row["prompt"][0]["content"] and CODE_Q in code_row["prompt"][0]["content"]
    assert code_row["extra_info"]["ground_truth_source"] == "synthesis_code"
    assert code_row["extra_info"]["lineage"]["seed_id"] == "s1"  # split with its instruction's lineage
    assert counts["ground_truth_sources"] == {"synthesis_math": 1, "synthesis_code": 1, "own_answer": 0,
                                              "none": len(rows) - 2}
    assert counts["train"] + counts["test"] == 6 * 2 + 1 + 2
    # the rows fit verl's parquet schema
    lay = PPOLayout(tmp_path / "ppo").ensure()
    write_prompt_parquet(rows, lay.train)
    assert {r["extra_info"]["ground_truth_source"] for r in read_prompt_rows(lay.train)} == {
        "synthesis_math", "synthesis_code", "none"}


def test_unverified_instructions_have_no_ground_truth_by_default(inputs):
    records, tasks = inputs
    assert PPOSettings().unverified_ground_truth == "exclude"
    rows, counts = _rows(records, tasks)
    evolved = [r for r in rows if r["extra_info"]["lineage"]["operation"] != "synthesis"]
    assert evolved and all(r["reward_model"] == {"style": "model", "ground_truth": ""} for r in evolved)
    assert all(r["extra_info"]["ground_truth_source"] == "none" for r in evolved)
    assert counts["ground_truth_sources"]["own_answer"] == 0 and counts["with_ground_truth"] == 2


def test_own_answer_setting_restores_the_answer_models_final_answer(inputs):
    records, tasks = inputs
    rows, counts = _rows(records, tasks, unverified_ground_truth="own_answer")
    own = [r for r in rows if r["extra_info"]["lineage"]["operation"] == "add_constraints"]
    assert len(own) == 6 and all(r["reward_model"]["style"] == "rule" for r in own)
    for r in own:  # "Tom has a apples, buys b more and gives away 1" -> a + b - 1
        nums = [int(w.strip(",")) for w in r["extra_info"]["question"].split() if w.strip(",").isdigit()]
        assert r["reward_model"]["ground_truth"] == str(nums[0] + nums[1] - 1)
    assert counts["ground_truth_sources"] == {"synthesis_math": 1, "synthesis_code": 1, "own_answer": 6,
                                              "none": len(rows) - 8}
    with pytest.raises(ValueError, match="unverified_ground_truth"):
        _rows(records, tasks, unverified_ground_truth="guess")


class FakeIRM:
    def __call__(self, instructions):
        return [0.8 for _ in instructions]


class FakePRM:
    """Step score = the number the step starts with (the same fake as tests/tasks/ppo/test_ppo_reward.py)."""

    def __call__(self, prompts, steps):
        return [[float(step.split()[0]) for step in ss] for ss in steps]


def _response(body: str) -> str:
    return f"Step 1: 0.6 add the two numbers.\nStep 2: 0.8 the code:\n```python\n{body}```"


def _code_row(inputs):
    rows, _ = _rows(*inputs)
    return next(r for r in rows if r["data_source"] == "evolforge/code")


@needs_bwrap
def test_code_rows_are_checked_by_running_their_tests(inputs, monkeypatch):
    row = _code_row(inputs)
    reward = PPOReward(FakeIRM(), FakePRM(), "min", answer_weight=0.5)
    monkeypatch.setattr(ppo_reward, "load_reward", lambda **kw: reward)
    runs = []
    real_run_many = ppo_reward._sandbox_tools()[1]
    monkeypatch.setattr("evolforge.tasks.sandbox.run.run_many",
                        lambda jobs, settings, **kw: runs.append(len(jobs)) or real_run_many(jobs, settings, **kw))
    right = _response("def add(a, b):\n    return a + b\n")
    wrong = _response("def add(a, b):\n    return a - b\n")
    gt, info = row["reward_model"]["ground_truth"], row["extra_info"]
    scores = ppo_reward.compute_score_batch(["evolforge/code"] * 2, [right, wrong], [gt, gt], [info, info],
                                            sandbox=SANDBOX)
    assert runs == [2]  # one sandbox batch for the code rows
    assert scores[0] == pytest.approx(0.8 * (0.5 * 0.6 + 0.5 * 1.0))
    assert scores[1] == pytest.approx(0.8 * (0.5 * 0.6 + 0.5 * 0.0))
    assert scores[0] > scores[1]
    details = reward.details([info["question"]] * 2, [right, wrong], [gt, gt], ["evolforge/code"] * 2,
                             sandbox=SandboxSettings(**SANDBOX))
    assert [d["correct"] for d in details] == [True, False]
    assert [d["check"] for d in details] == ["tests", "tests"]
    # the per-sample verl entry point and a math row in the same batch keep their own checks
    assert ppo_reward.compute_score("evolforge/code", right, gt, info, sandbox=SANDBOX) == pytest.approx(scores[0])
    mixed = reward.details(["q", info["question"]], ["Step 1: 0.5 The answer is: 12", wrong], ["12", gt],
                           ["evolforge/math", "evolforge/code"], sandbox=SANDBOX)
    assert [(d["check"], d["correct"]) for d in mixed] == [("answer", True), ("tests", False)]


def test_code_rows_score_with_the_prm_alone_without_the_sandbox(inputs, monkeypatch):
    """Where evolforge is not importable (verl loads reward.py by path), a code row falls back to the PRM."""
    row = _code_row(inputs)
    monkeypatch.setitem(sys.modules, "evolforge.tasks.sandbox.run", None)  # its import now raises ImportError
    monkeypatch.setattr(ppo_reward, "_WARNED", set())
    reward = PPOReward(FakeIRM(), FakePRM(), "min", answer_weight=0.5)
    gt = row["reward_model"]["ground_truth"]
    with pytest.warns(RuntimeWarning, match="PRM alone") as caught:
        for _ in range(2):
            [d] = reward.details(["q"], [_response("def add(a, b):\n    return a + b\n")], [gt], ["evolforge/code"])
            assert d["correct"] is None and d["reward"] == pytest.approx(0.8 * 0.6)
    assert len([w for w in caught if "PRM alone" in str(w.message)]) == 1  # said once
