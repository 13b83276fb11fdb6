"""The PPO flow on a real (ephemeral) Prefect server: pre-flight, data, verl job, and the local GRPO run."""

from __future__ import annotations

import json
import os
import stat

import pyarrow.parquet as pq
import pytest
import yaml

from evolforge.flows.ppo import PPOParams, ppo_flow
from evolforge.storage.ppo import PPOLayout, read_jsonl
from evolforge.testing.ppo_models import (
    one_torch_thread,  # noqa: F401 (autouse fixture)
    shared_reward_models,
    write_evolved,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def evolved(tmp_path):
    return write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=6)


@pytest.fixture
def fake_ray(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ray_args.json"
    script = bin_dir / "ray"
    script.write_text(f"#!/usr/bin/env python3\nimport json, sys\njson.dump(sys.argv[1:], open({str(log)!r}, 'w'))\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_flow_refuses_an_unhealthy_reward_stage(tmp_path, evolved):
    rm = tmp_path / "rm"
    for name in ("irm", "prm"):
        (rm / "models" / name).mkdir(parents=True)
        (rm / "models" / name / "config.json").write_text("{}")
    (rm / "health.json").write_text(json.dumps({"data": {"passed": True}, "model": {
        "passed": False, "problems": ["only 3% of PRM scores are under 0.5: the PRM does not tell steps apart"]}}))
    with pytest.raises(Exception, match="PPO refused to start.*does not tell steps apart"):
        ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(rm), out=str(tmp_path / "ppo"), local_steps=0))
    assert not (tmp_path / "ppo").exists()  # nothing was started


def test_flow_writes_data_and_submits_the_verl_job(tmp_path, evolved, fake_ray):
    out = tmp_path / "ppo"
    summary = ppo_flow(PPOParams(evolved=str(evolved.parent.parent), reward_dir=str(shared_reward_models()), out=str(out),
                                 local_steps=0, ray_address="http://head:8265",
                                 overrides={"ppo": {"policy_path": "/cluster/models/sft"}}))
    lay = PPOLayout(out)
    assert summary["data"]["train"] > 0 and summary["data"]["test"] > 0 and summary["local"] is None
    assert pq.read_table(lay.train).num_rows == summary["data"]["train"]
    submitted = json.loads(fake_ray.read_text())
    assert submitted[:3] == ["job", "submit", "--address"] and submitted[3] == "http://head:8265"
    assert f"data.train_files={lay.train}" in submitted and f"data.val_files={lay.test}" in submitted
    assert "actor_rollout_ref.model.path=/cluster/models/sft" in submitted
    assert json.loads(lay.submission.read_text())["submission_id"] == summary["verl"]["submission_id"]
    # the written config is the submitted one, and it is valid
    args = lay.verl_overrides.read_text().splitlines()
    assert args == submitted[submitted.index("verl.trainer.main_ppo") + 1:]
    conf = yaml.safe_load(lay.verl_config.read_text())
    assert conf["reward"]["custom_reward_function"]["reward_kwargs"]["irm_dir"] == str(shared_reward_models() / "models" / "irm")
    assert conf["algorithm"]["kl_ctrl"]["kl_coef"] == 0.05 and conf["data"]["train_batch_size"] >= 64
    assert json.loads(lay.summary.read_text())["verl"]["command"].startswith("ray job submit --address http://head:8265")


def test_flow_without_a_cluster_writes_the_command(tmp_path, evolved, fake_ray):
    out = tmp_path / "ppo"
    summary = ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(shared_reward_models()), out=str(out),
                                 local_steps=0, overrides={"ppo": {"policy_path": "/cluster/models/sft"}}))
    lay = PPOLayout(out)
    assert not fake_ray.exists() and not lay.submission.exists()  # nothing submitted
    script = lay.submit_script.read_text()
    assert "ray job submit --address $RAY_ADDRESS" in script and "python3 -m verl.trainer.main_ppo" in script
    assert summary["verl"]["submission_id"] is None and os.access(lay.submit_script, os.X_OK)


@pytest.mark.slow
def test_local_grpo_two_steps_end_to_end(tmp_path, evolved):
    """SmolLM2-135M (from the GGUF) takes two real GRPO steps with the r = rI * rA reward (about 2 minutes)."""
    out = tmp_path / "ppo"
    summary = ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(shared_reward_models()), out=str(out), local_steps=2))
    lay = PPOLayout(out)
    steps = read_jsonl(lay.metrics)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert {"reward", "kl", "loss", "step_seconds"} <= set(s) and 0.0 <= s["reward"] <= 1.0
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    assert steps[1]["kl"] > 0.0  # ... and it moved after it
    # the trained policy is saved and differs from the SFT policy
    from safetensors.torch import load_file

    sft, trained = load_file(lay.sft_policy / "model.safetensors"), load_file(lay.policy / "model.safetensors")
    assert sft.keys() == trained.keys() and any(not sft[k].equal(trained[k]) for k in sft)
    comparison = json.loads(lay.comparison.read_text())
    assert comparison["n_prompts"] == min(4, summary["data"]["test"]) and comparison["eval_split"] == "test"
    for side in ("sft", "trained"):
        assert 0.0 <= comparison[side]["mean_reward"] <= 1.0 and len(comparison[side]["rewards"]) == comparison["n_prompts"]
    assert comparison["beats_sft_by_3_points"] == (comparison["delta"] >= 0.03)
    assert summary["local"]["comparison"]["delta"] == pytest.approx(
        comparison["trained"]["mean_reward"] - comparison["sft"]["mean_reward"])
    # the verl job points at the converted SFT policy
    assert f"actor_rollout_ref.model.path={lay.sft_policy}" in lay.verl_overrides.read_text().splitlines()
