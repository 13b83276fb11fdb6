"""The PPO flow on a real (ephemeral) Prefect server: pre-flight, data, verl job, and the local GRPO run."""

from __future__ import annotations

import json
import os
import shlex

import pyarrow.parquet as pq
import pytest
import yaml

from evolforge.cli import main
from evolforge.cli.status import stage_status
from evolforge.flows.ppo import PPOParams, ppo_flow
from evolforge.storage.folder import read_marker
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


def test_flow_refuses_an_unhealthy_reward_stage(tmp_path, evolved):
    rm = tmp_path / "rm"
    for name in ("irm", "prm"):
        (rm / "models" / name).mkdir(parents=True)
        (rm / "models" / name / "config.json").write_text("{}")
    (rm / "health.json").write_text(json.dumps({"data": {"passed": True}, "model": {
        "passed": False, "problems": ["only 3% of PRM scores are under 0.5: the PRM does not tell steps apart"]}}))
    with pytest.raises(Exception, match="PPO refused to start.*does not tell steps apart.*--ignore-reward-health"):
        ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(rm), out=str(tmp_path / "ppo"), local_steps=0,
                           overrides={"reward": {"health_policy": "stop"}}))
    assert not (tmp_path / "ppo").exists()  # nothing was started


def test_command_refuses_bad_inputs_before_anything_starts(tmp_path, evolved, capsys, monkeypatch):
    """The stage's check (tasks/ppo/stage.py) runs before Prefect: an unhealthy reward stage, a remote output
    folder and contradicting job settings are one line and exit status 2, and nothing is created."""
    rm = tmp_path / "rm"
    for name in ("irm", "prm"):
        (rm / "models" / name).mkdir(parents=True)
        (rm / "models" / name / "config.json").write_text("{}")
    (rm / "health.json").write_text(json.dumps({"data": {"passed": True}, "model": {
        "passed": False, "problems": ["IRM overfit: mean over 0.9"]}}))
    out = tmp_path / "ppo"
    monkeypatch.setenv("EVOLFORGE__REWARD__HEALTH_POLICY", "stop")  # "warn" (the default) goes on
    args = ["ppo", "--evolved", str(evolved), "--reward-dir", str(rm)]
    for extra, says in ((["--out", str(out)], "PPO refused to start: trained reward models fail the health checks: "
                                                "IRM overfit"),
                        (["--out", "s3://bucket/ppo", "--ignore-reward-health"], "must be a local"),
                        (["--out", str(out), "--ray-job", "grpo_smoke", "--local-steps", "0"], "set ppo.local_steps > 0")):
        assert main(args + extra) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_flow_writes_data_and_the_verl_config(tmp_path, evolved):
    out = tmp_path / "ppo"
    summary = ppo_flow(PPOParams(evolved=str(evolved.parent.parent), reward_dir=str(shared_reward_models()), out=str(out),
                                 local_steps=0, overrides={"ppo": {"policy_path": "/cluster/models/sft"}}))
    lay = PPOLayout(out)
    assert summary["data"]["train"] > 0 and summary["data"]["test"] > 0 and summary["local_grpo"] is None
    assert pq.read_table(lay.train).num_rows == summary["data"]["train"]
    args = lay.verl_overrides.read_text().splitlines()
    assert f"data.train_files={lay.train}" in args and f"data.val_files={lay.test}" in args
    assert "actor_rollout_ref.model.path=/cluster/models/sft" in args
    # the written config is the one in the command, and it is valid
    argv = shlex.split(lay.submit_script.read_text().splitlines()[-1])
    assert argv[argv.index("verl.trainer.main_ppo") + 1:] == args
    conf = yaml.safe_load(lay.verl_config.read_text())
    assert conf["reward"]["custom_reward_function"]["reward_kwargs"]["irm_dir"] == str(shared_reward_models() / "models" / "irm")
    assert conf["algorithm"]["kl_ctrl"]["kl_coef"] == 0.05 and conf["data"]["train_batch_size"] >= 64
    # named as it is: the verl job is PPO with a critic
    assert summary["verl"]["algorithm"] == "PPO (critic, GAE)" and conf["algorithm"]["adv_estimator"] == "gae"
    # the folder is marked as the PPO stage's, with its counts, and `status` reads it
    marker = read_marker(out)
    assert marker["kind"] == "ppo" and marker["finished_at"] and summary["out_dir"] == str(out)
    assert marker["counts"] == {"train": summary["data"]["train"], "test": summary["data"]["test"],
                                "with_ground_truth": summary["data"]["with_ground_truth"], "grpo_steps": 0}
    st = stage_status(out)
    assert st["kind"] == "ppo" and st["finished"] is True and st["units"] == []
    assert json.loads(lay.summary.read_text())["data"] == summary["data"]


def test_flow_without_a_cluster_writes_the_command(tmp_path, evolved, monkeypatch):
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "ppo"
    summary = ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(shared_reward_models()), out=str(out),
                                 local_steps=0, overrides={"ppo": {"policy_path": "/cluster/models/sft"}}))
    lay = PPOLayout(out)
    assert not lay.submission.exists() and summary["ray_job"] is None  # nothing submitted
    script = lay.submit_script.read_text()
    assert "ray job submit --address $RAY_ADDRESS" in script and "python3 -m verl.trainer.main_ppo" in script
    assert summary["job_command"].startswith("ray job submit --address $RAY_ADDRESS --submission-id evolforge-verl-ppo-")
    assert os.access(lay.submit_script, os.X_OK)


def test_flow_with_an_unreachable_cluster_fails_clearly(tmp_path, evolved, monkeypatch):
    from evolforge.tasks.ppo.ray_jobs import RayJobError
    from evolforge.testing.prefect_server import free_port

    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    address = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(RayJobError, match=f"no Ray job server at {address}"):
        ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(shared_reward_models()), out=str(tmp_path / "ppo"),
                           local_steps=0, ray_address=address, overrides={"ppo": {"policy_path": "/cluster/sft"}}))


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
    # the trained policy is saved and differs from the base policy it started from (no --sft given)
    from safetensors.torch import load_file

    base, trained = load_file(lay.base_policy / "model.safetensors"), load_file(lay.policy / "model.safetensors")
    assert base.keys() == trained.keys() and any(not base[k].equal(trained[k]) for k in base)
    comparison = json.loads(lay.comparison.read_text())
    assert comparison["n_prompts"] == min(4, summary["data"]["test"]) and comparison["eval_split"] == "test"
    for side in ("initial", "trained"):
        assert 0.0 <= comparison[side]["mean_reward"] <= 1.0 and len(comparison[side]["rewards"]) == comparison["n_prompts"]
    assert comparison["initial_policy"] == "base" and summary["paths"]["initial_policy_kind"] == "base"
    assert summary["local_grpo"]["algorithm"] == "GRPO" and summary["local_grpo"]["ran_on"] == "flow"
    assert summary["training_health"]["completions"] == 2 * 2 * 2  # steps x prompts x completions per prompt
    assert summary["local_grpo"]["comparison"]["delta"] == pytest.approx(
        comparison["trained"]["mean_reward"] - comparison["initial"]["mean_reward"])
    # the verl job points at the converted base policy
    assert f"actor_rollout_ref.model.path={lay.base_policy}" in lay.verl_overrides.read_text().splitlines()


def test_ppo_starts_from_the_sft_policy_and_reports_a_reward_change_not_a_met_bar(tmp_path, evolved):
    """--sft: the GRPO smoke run and the verl job start from the SFT stage's model (a tiny Llama here); the held-out
    comparison is named initial (sft) vs trained and is reported as a mean-reward change, never as a bar met."""
    from evolforge.tasks.ppo.report import markdown
    from evolforge.testing.tiny_policy import build_tiny_policy

    sft_out = tmp_path / "sft"
    build_tiny_policy(sft_out / "model")  # what the SFT stage leaves in its output folder
    out = tmp_path / "ppo"
    summary = ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(shared_reward_models()), out=str(out),
                                 sft=str(sft_out), local_steps=1,
                                 overrides={"ppo": {"local_eval_prompts": 2, "local_eval_max_new_tokens": 4,
                                                    "local_max_completion_length": 4}}))
    lay = PPOLayout(out)
    assert summary["paths"]["initial_policy"] == str(sft_out / "model")
    assert summary["paths"]["initial_policy_kind"] == "sft" and not lay.base_policy.exists()  # nothing converted
    assert f"actor_rollout_ref.model.path={sft_out / 'model'}" in lay.verl_overrides.read_text().splitlines()
    comparison = json.loads(lay.comparison.read_text())
    assert comparison["initial_policy"] == "sft" and "beats_sft_by_3_points" not in comparison
    text = markdown(summary)
    assert "sft policy" in text and "change in mean reward, not in accuracy" in text
    assert " met" not in text and "bar" not in text


def test_sft_flag_must_name_a_model(tmp_path, evolved, capsys):
    out = tmp_path / "ppo"
    assert main(["ppo", "--evolved", str(evolved), "--reward-dir", str(shared_reward_models()), "--out", str(out),
                 "--sft", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--sft" in err and "no transformers model there" in err and not out.exists()


def test_flow_trains_on_the_irm_selection(tmp_path, evolved):
    """reward.select_by_irm: the reward stage's IRM scores the evolved pool; the flow's training prompts are the
    selected ones, each row's lineage and summary.json record the choice."""
    out = tmp_path / "ppo"
    summary = ppo_flow(PPOParams(evolved=str(evolved.parent.parent), reward_dir=str(shared_reward_models()), out=str(out),
                                 local_steps=0, overrides={"ppo": {"policy_path": "/cluster/models/sft"},
                                                           "reward": {"select_by_irm": "share", "select_share": 0.3}}))
    sel = summary["data"]["irm_selection"]
    assert sel["mode"] == "share" and sel["irm"] == str(shared_reward_models() / "models" / "irm")
    assert 0 < sel["selected"] < sel["scored"] and summary["data"]["dropped"]["irm_selection"] > 0
    lineage = [r["lineage"] for r in pq.read_table(PPOLayout(out).train).column("extra_info").to_pylist()]
    assert lineage and all(x["irm_selected"] and x["irm_score"] is not None for x in lineage)
