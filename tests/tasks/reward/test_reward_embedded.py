"""Integration: reward data labelled by the embedded SmolLM2-135M, both reward models trained, new data scored.

The 135M model is a weak judge: it often returns a ranking that is not a permutation or a step-label list of
the wrong length; those are counted failures. The test asks the judge again (ranking_attempts, sampling at
judge_temperature) so that a few instructions get a valid ranking, then trains on whatever it produced.
"""

from __future__ import annotations

import json
import time

import polars as pl
import pytest

from evolforge.flows.reward_data import RewardDataParams, reward_data_flow
from evolforge.flows.train_reward import TrainRewardParams, train_reward_flow
from evolforge.storage.ledger import read_ledger
from evolforge.storage.reward_sets import RewardLayout
from evolforge.tasks.reward.scoring import score_instructions, score_steps

pytestmark = [pytest.mark.embedded, pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

ROWS = [
    ("A farmer has 12 cows and buys 5 more. How many cows does he have?",
     "Step 1: The farmer starts with 12 cows.\nStep 2: He buys 5 more, so 12 + 5 = 17.\nThe answer is: 17"),
    ("A shop sells pens at 3 dollars each. How much do 4 pens cost?",
     "Step 1: One pen costs 3 dollars.\nStep 2: Four pens cost 4 * 3 = 15 dollars.\nThe answer is: 15"),
    ("Tom reads 10 pages a day. How many pages does he read in a week?",
     "Step 1: A week has 7 days.\nStep 2: 10 pages a day for 7 days is 10 * 7 = 70 pages.\nThe answer is: 70"),
    ("A box holds 6 eggs. How many eggs are in 3 boxes?",
     "Step 1: Each box holds 6 eggs.\nStep 2: There are 3 boxes.\nStep 3: 6 * 3 = 18 eggs.\nThe answer is: 18"),
    ("Explain why leaves change colour in autumn.", "Leaves change colour because chlorophyll breaks down."),
    ("Write a Python function that returns the largest of three numbers.",
     "Step 1: Define max3(a, b, c).\nStep 2: Return max(a, b, c)."),
]


def test_embedded_model_labels_and_both_reward_models_train(tmp_path):
    evolve = tmp_path / "evolve" / "dataset"
    evolve.mkdir(parents=True)
    pl.DataFrame([{"id": f"e{i}", "status": "accepted", "instruction": q, "answer": a,
                   "domain": "math" if i < 4 else "general"} for i, (q, a) in enumerate(ROWS)]
                 ).write_parquet(evolve / "evolved.parquet")
    t0 = time.perf_counter()
    summary = reward_data_flow(RewardDataParams(
        evolve_out=str(tmp_path / "evolve"), out=str(tmp_path / "reward"),
        overrides={"reward": {"batch_size": 3, "ranking_attempts": 5, "judge_temperature": 0.5, "ask_scores": False},
                   "embedded": {"max_new_tokens": 96}}))
    data_seconds = time.perf_counter() - t0
    lay = RewardLayout(tmp_path / "reward")
    ledger = read_ledger(lay.root)
    assert summary["endpoint"].startswith("embedded") and "ok" in set(ledger["outcome"])
    assert ledger["completion_tokens"].sum() > 0 and set(ledger["stage"]) >= {"evolve", "judge"}
    irm, prm = summary["irm"], summary["prm"]
    assert irm["instructions"] == 6 and set(irm["by_status"]) <= {"ranked", "ranking_invalid", "ranking_unparseable",
                                                                   "too_few_versions"}
    assert irm["pairs"] > 0, f"the embedded judge ranked nothing validly: {irm}"
    assert prm["labelled"] > 0, f"the embedded judge labelled no answer: {prm}"
    assert json.loads(lay.health.read_text())["data"]["stage"] == "data"

    t1 = time.perf_counter()
    metrics = train_reward_flow(TrainRewardParams(
        data=str(lay.root), overrides={"reward": {"irm_max_steps": 4, "prm_max_steps": 4, "max_length": 96,
                                                  "train_batch_size": 4}}))
    train_seconds = time.perf_counter() - t1
    assert metrics["models"]["irm"]["train_pairs"] > 0 and metrics["models"]["prm"]["train_steps"] > 0
    new_instructions = ["Compute the area of a 3 by 4 rectangle and explain each step.", "hi"]
    irm_scores = score_instructions(lay.model_dir("irm"), new_instructions)
    step_scores = score_steps(lay.model_dir("prm"), "What is 7 times 6?", ["7 * 6 = 42.", "The answer is: 42"])
    assert len(irm_scores) == 2 and len(step_scores) == 2
    assert all(0.0 < s < 1.0 for s in irm_scores + step_scores)
    print(json.dumps({"data_seconds": round(data_seconds, 1), "train_seconds": round(train_seconds, 1),
                      "irm": irm, "prm": prm, "metrics": metrics["models"], "irm_scores": irm_scores,
                      "step_scores": step_scores}, indent=1, default=str))
