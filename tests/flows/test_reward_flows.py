"""The reward-data and training flows on a real (ephemeral) Prefect server against the scripted endpoint."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.cli.status import stage_status
from evolforge.flows.reward_data import RewardDataParams, reward_data_flow
from evolforge.flows.train_reward import TrainRewardParams, train_reward_flow
from evolforge.storage.folder import FolderOfAnotherStage
from evolforge.storage.ledger import read_ledger
from evolforge.storage.reward_sets import RewardLayout
from evolforge.tasks.core.health import RewardHealthError
from evolforge.tasks.reward.scoring import score_instructions, score_steps
from evolforge.testing.evolved_runs import TINY_TRAINING, evolve_folder

pytestmark = pytest.mark.usefixtures("prefect_harness")

def data_params(tmp_path, server, **reward):
    return RewardDataParams(evolve_out=str(evolve_folder(tmp_path)), out=str(tmp_path / "reward"),
                            base_url=server.base_url,
                            overrides={"reward": {"batch_size": 4, "concurrency": 2, **reward},
                                       "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 2.0}})


def test_reward_data_then_training_then_scoring(tmp_path, server):
    summary = reward_data_flow(data_params(tmp_path, server))
    lay = RewardLayout(tmp_path / "reward")
    # 12 instructions (6 seeds + 6 evolutions): 2 versions each + 1 ranking; 6 answers: 4 judged, 2 re-asked first
    assert summary["irm"]["by_status"] == {"ranked": 12} and summary["batches"]["total"] == 6
    assert summary["irm"]["pairs"] == pl.read_parquet(lay.irm_pairs).height == 12 * 3
    prm = summary["prm"]
    assert prm["labelled"] == 6 and prm["reasons"] == {"no answer": 6} and prm["reasked_and_labelled"] == 2
    steps = pl.read_parquet(lay.prm_steps)
    assert steps.height == 6 and sum(len(x) for x in steps["labels"]) == prm["steps"] == 2 * 3 + 4 * 2
    assert sum(1 for x in steps["labels"].explode() if not x) == 2  # the two "wrong" steps
    # every call is in the ledger, charged to the instruction or answer it served
    ledger = read_ledger(lay.root)
    ledger = ledger.filter(pl.col("stage") != "preflight")  # the pre-flight probe is charged too
    assert ledger.height == len(server.posts()) == 12 * 3 + 6 + 2  # rankings + versions, step labels, re-asks
    assert set(ledger["task_id"]) == {f"irm-{x}{i}" for x in "se" for i in range(6)} | {f"prm-e{i}" for i in range(6)}
    health = json.loads(lay.health.read_text())
    assert health["data"]["irm"]["n"] == 36 and health["data"]["prm"]["n"] == 14 and health["model"] is None
    assert health["data"]["prm"]["share_below_half"] == round(2 / 14, 4)
    assert "prm_low_share" in {c["check"] for c in health["data"]["checks"] if not c["passed"]}
    assert json.loads(lay.summary.read_text())["health"]["passed"] is False

    # resume: a second run over the folder sends nothing; a corrupt part is moved aside and redone alone
    n = len(server.posts())
    reward_data_flow(data_params(tmp_path, server))
    assert len(server.posts()) == n
    part = lay.irm.part(1)
    part.write_bytes(part.read_bytes()[:50])
    lay.irm.journal(1).unlink()
    reward_data_flow(data_params(tmp_path, server))
    assert len(server.posts()) == n + 4 * 3 and list(part.parent.glob("*.corrupt"))
    assert pl.read_parquet(lay.irm_pairs).height == 36

    metrics = train_reward_flow(TrainRewardParams(data=str(lay.root), overrides={"reward": TINY_TRAINING}))
    irm, prm_m = metrics["models"]["irm"], metrics["models"]["prm"]
    assert irm["train_pairs"] + irm["eval_pairs"] == 36 and irm["eval_pairs"] > 0
    assert 0.0 <= irm["pairwise_accuracy"] <= 1.0 and irm["train_seconds"] > 0
    assert prm_m["train_answers"] + prm_m["eval_answers"] == 6 and 0.0 <= prm_m["step_accuracy"] <= 1.0
    assert json.loads(lay.metrics.read_text())["models"]["irm"]["pairwise_accuracy"] == irm["pairwise_accuracy"]
    model_health = json.loads(lay.health.read_text())["model"]
    assert model_health["stage"] == "model" and model_health["irm"]["n"] > 0 and model_health["prm"]["n"] > 0

    scores = score_instructions(lay.model_dir("irm"), ["Add 1 and 1.", "Write a haiku about rain in June."])
    assert len(scores) == 2 and all(0.0 < s < 1.0 for s in scores)
    step_scores = score_steps(lay.model_dir("prm"), "What is 1 plus 1?", ["Add 1 and 1.", "This is wrong.", "It is 2."])
    assert len(step_scores) == 3 and all(0.0 < s < 1.0 for s in step_scores)

    # the health gate: policy 'stop' refuses to train on failed data checks, unless overridden
    stop = {"reward": {**TINY_TRAINING, "health_policy": "stop"}}
    with pytest.raises(RewardHealthError, match="PRM scores are under 0.5"):
        train_reward_flow(TrainRewardParams(data=str(lay.root), out=str(tmp_path / "models2"), overrides=stop))
    assert not (tmp_path / "models2" / "models").exists()
    again = train_reward_flow(TrainRewardParams(data=str(lay.root), override_health=True, overrides=stop))
    assert again["health"]["overridden"] and again["models"]["irm"] == metrics["models"]["irm"]  # kept, not retrained


def test_stage_markers_of_the_shared_folder_and_of_a_models_folder(tmp_path, server):
    """reward-data marks its folder; train-reward over it (the default --out) keeps that marker and `status`
    shows the models trained; a models folder of its own gets a train-reward marker, which reward-data refuses."""
    data = lay = RewardLayout(tmp_path / "reward")
    reward_data_flow(data_params(tmp_path, server, max_instructions=4))
    marker = json.loads(lay.marker.read_text())
    assert marker["kind"] == "reward-data" and marker["finished_at"]
    assert marker["counts"] == {"irm_pairs": 4 * 3, "prm_rows": 2}  # 4 ranked groups of 3; e0, e1 answered
    st = stage_status(lay.root)
    assert st["kind"] == "reward-data" and st["finished"] and st["models_trained"] == []
    assert [(u["unit"], u["done"], u["batches"]) for u in st["units"]] == [("irm", 1, 1), ("prm", 1, 1)]

    train_reward_flow(TrainRewardParams(data=str(lay.root), models=["irm"], overrides={"reward": TINY_TRAINING}))
    assert json.loads(lay.marker.read_text()) == marker  # still the reward-data folder: it can resume
    assert json.loads(lay.summary.read_text())["irm_pairs"] == 12  # the reward-data summary is not replaced
    assert json.loads(lay.metrics.read_text())["models"]["irm"]["train_pairs"] > 0
    st = stage_status(lay.root)
    assert st["kind"] == "reward-data" and st["models_trained"] == ["irm"] and len(st["units"]) == 2
    reward_data_flow(data_params(tmp_path, server, max_instructions=4))  # resumes over the trained folder

    own = RewardLayout(tmp_path / "models")
    train_reward_flow(TrainRewardParams(data=str(data.root), out=str(own.root), models=["irm"],
                                        overrides={"reward": TINY_TRAINING}))
    marker = json.loads(own.marker.read_text())
    assert marker["kind"] == "train-reward" and marker["finished_at"]
    assert marker["counts"] == {"models": ["irm"], "model_health_passed": False}  # no PRM scores to check
    assert own.metrics.exists() and not own.summary.exists() and own.model_ready("irm")
    st = stage_status(own.root)
    assert st["kind"] == "train-reward" and st["units"] == [] and st["models_trained"] == ["irm"]
    with pytest.raises(FolderOfAnotherStage, match="train-reward stage"):
        reward_data_flow(data_params(tmp_path, server).model_copy(update={"out": str(own.root)}))


def test_failed_rankings_are_counted_and_decorl_labels(tmp_path, server):
    server.script("ok", "ok", "text:no idea")  # the first group's ranking is unparseable
    p = data_params(tmp_path, server, concurrency=1, max_instructions=4, batch_size=4)
    summary = reward_data_flow(p.model_copy(update={"kinds": ["irm"]}))
    assert summary["irm"]["instructions"] == 4 and summary["prm"] is None
    assert summary["irm"]["by_status"] == {"ranked": 3, "ranking_unparseable": 1}
    assert summary["irm"]["pairs"] == 3 * 3 and summary["gateway"]["json_failures"] == 1

    summary = reward_data_flow(p.model_copy(update={"kinds": ["prm"], "method": "decorl"}))
    assert summary["irm"]["pairs"] == 9  # the IRM set made by the first run is kept
    lay = RewardLayout(tmp_path / "reward")
    steps = pl.read_parquet(lay.prm_steps)
    assert set(steps["method"]) == {"decorl"} and steps["id"].to_list() == ["e0", "e1"]  # s0, s1: no answer
    e0 = steps.filter(pl.col("id") == "e0").row(0, named=True)
    assert e0["raw_scores"] == [2.0, -3.0, 2.0] and e0["labels"] == [True, False, True]
    assert json.loads(lay.health.read_text())["data"]["irm"]["n"] == 9  # 3 ranked groups x 3 versions
