"""verl PPO configuration (published settings, offline schema), Ray submission, reward pre-flight. The checks
with verl's own code are in tests/tasks/ppo/test_verl_real.py."""

from __future__ import annotations

import inspect
import json
import re

import pytest
from pydantic import ValidationError

from evolforge.config.settings import ConfigError, load_settings
from evolforge.tasks.ppo import reward as ppo_reward
from evolforge.tasks.ppo import verl as ppo_verl
from evolforge.tasks.ppo.preflight import RewardStageUnhealthy, preflight


def overrides(**ppo):
    cfg = load_settings(None, {"ppo": ppo}, environ={}).ppo
    return ppo_verl.verl_overrides(cfg, train_files="/data/train.parquet", val_files="/data/test.parquet",
                                   policy_path="/models/sft", irm_dir="/rm/irm", prm_dir="/rm/prm",
                                   checkpoint_dir="/runs/ppo/verl/checkpoints")


def test_published_settings_and_paths():
    o = overrides()
    conf = ppo_verl.validate_config(o)
    assert conf.actor_rollout_ref.actor.optim.lr == 1e-6
    assert conf.algorithm.kl_ctrl.kl_coef == 0.05 and conf.algorithm.use_kl_in_reward
    assert conf.actor_rollout_ref.actor.clip_ratio == 0.2
    assert (conf.algorithm.gamma, conf.algorithm.lam, conf.algorithm.adv_estimator) == (1.0, 0.95, "gae")
    assert conf.data.train_batch_size >= 64 and conf.actor_rollout_ref.actor.ppo_mini_batch_size == 8
    assert (conf.data.train_files, conf.data.val_files) == ("/data/train.parquet", "/data/test.parquet")
    assert conf.actor_rollout_ref.model.path == conf.critic.model.path == "/models/sft"
    crf = conf.reward.custom_reward_function
    assert crf.path == ppo_reward.__file__ and crf.name == "compute_score_async"
    assert (crf.reward_kwargs.irm_dir, crf.reward_kwargs.prm_dir) == ("/rm/irm", "/rm/prm")
    # the named function exists with verl's call signature
    fn = getattr(ppo_reward, crf.name)
    assert list(inspect.signature(fn).parameters)[:4] == ["data_source", "solution_str", "ground_truth", "extra_info"]


def test_rendered_config_saves_checkpoints_and_a_policy_eval_reads(tmp_path):
    """The written verl config (the document verl reads) saves checkpoints, resumes from them and ends with the
    actor as a Hugging Face folder; final_actor finds it after the job."""
    import yaml

    from evolforge.storage.ppo import PPOLayout
    from evolforge.tasks.ppo import job

    lay = PPOLayout(tmp_path / "ppo").ensure()
    cfg = load_settings(None, {"ppo": {"save_freq": 5, "max_checkpoints": 3}}, environ={}).ppo
    job.verl_config(cfg, lay, "/models/sft", tmp_path / "irm", tmp_path / "prm", "sub-1")
    doc = yaml.safe_load(lay.verl_config.read_text())
    trainer = doc["trainer"]
    assert trainer["save_freq"] == 5 and trainer["resume_mode"] == "auto"
    assert trainer["default_local_dir"] == str(lay.verl_checkpoints)
    assert trainer["max_actor_ckpt_to_keep"] == trainer["max_critic_ckpt_to_keep"] == 3
    assert {"model", "hf_model"} <= set(doc["actor_rollout_ref"]["actor"]["checkpoint"]["save_contents"])
    args = lay.verl_overrides.read_text()
    assert "trainer.save_freq=5" in args and f"trainer.default_local_dir={lay.verl_checkpoints}" in args
    # the schema refuses a config that would end with no policy
    with pytest.raises(ValidationError, match="save_freq"):
        ppo_verl.validate_config({**overrides(), "trainer.save_freq": -1})
    with pytest.raises(ValidationError, match="hf_model"):
        ppo_verl.validate_config({**overrides(), "actor_rollout_ref.actor.checkpoint.save_contents": ["model"]})
    # after the job: the latest checkpoint's Hugging Face actor, as verl lays it out
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ppo_verl.final_actor(lay.verl_checkpoints)
    actor = lay.verl_checkpoints / "global_step_40" / "actor" / "huggingface"
    actor.mkdir(parents=True)
    (actor / "config.json").write_text("{}")
    (lay.verl_checkpoints / "latest_checkpointed_iteration.txt").write_text("40")
    assert ppo_verl.final_actor(lay.verl_checkpoints) == actor


def test_schema_rejects_bad_configs():
    bad_key = {**overrides(), "actor_rollout_ref.actor.clip_ration": 0.3}
    with pytest.raises(ValidationError, match="clip_ration"):
        ppo_verl.validate_config(bad_key)
    with pytest.raises(ValidationError, match="train_batch_size"):
        ppo_verl.validate_config({**overrides(), "data.train_batch_size": 32})
    with pytest.raises(ValidationError, match="multiple of"):
        ppo_verl.validate_config({**overrides(), "data.train_batch_size": 68})
    with pytest.raises(ValidationError, match="micro_batch"):
        ppo_verl.validate_config(overrides(ppo_micro_batch_size_per_gpu=2))  # 8 / 8 GPUs = 1 per GPU
    pkg = ppo_verl.validate_config(overrides(reward_function_path="pkg://evolforge.tasks.ppo.reward"))
    assert pkg.reward.custom_reward_function.path == "pkg://evolforge.tasks.ppo.reward"
    with pytest.raises(ValidationError, match="not importable"):
        ppo_verl.validate_config(overrides(reward_function_path="pkg://evolforge.tasks.no_such_module"))
    with pytest.raises(ValidationError, match="defines no function"):
        ppo_verl.validate_config({**overrides(), "reward.custom_reward_function.name": "no_such_fn"})
    with pytest.raises(ConfigError, match="rollout_batch_size"):
        overrides(rollout_batch_size=32)  # the published lower bound is enforced in the settings too


def test_hydra_arguments_and_ray_command():
    o = overrides()
    o["trainer.experiment_name"] = "my run"
    args = ppo_verl.hydra_args(o)
    assert "algorithm.kl_ctrl.kl_coef=0.05" in args and "actor_rollout_ref.actor.optim.lr=1e-06" in args
    assert "algorithm.use_kl_in_reward=true" in args and "trainer.logger=[console]" in args
    assert "trainer.experiment_name='my run'" in args
    # texts reach verl verbatim (checked against verl's own Hydra in tests/tasks/ppo/test_verl_real.py)
    texts = ppo_verl.hydra_args({"trainer.experiment_name": "${oc.env:OPENAI_API_KEY}", "trainer.project_name": "2024"})
    assert texts == ["trainer.experiment_name='\\${oc.env:OPENAI_API_KEY}'", "trainer.project_name='2024'"]
    assert "+reward.custom_reward_function.reward_kwargs.irm_dir=/rm/irm" in args
    cmd = ppo_verl.ray_submit_command(o, "http://head:8265", "job-1")
    sep = cmd.index("--")
    assert cmd[:sep] == ["ray", "job", "submit", "--address", "http://head:8265", "--submission-id", "job-1", "--no-wait"]
    assert cmd[sep + 1:sep + 4] == ["python3", "-m", "verl.trainer.main_ppo"] and cmd[sep + 4:] == args
    assert "--address '$RAY_ADDRESS'" not in ppo_verl.shell_line(ppo_verl.ray_submit_command(o, "", "j"))


# ------------------------------------------------------------------ pre-flight

def _reward_dir(tmp_path, health):
    for name in ("irm", "prm"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "config.json").write_text("{}")
    if health is not None:
        (tmp_path / "health.json").write_text(json.dumps(health))
    return tmp_path, tmp_path / "irm", tmp_path / "prm"


def test_preflight_reads_the_train_reward_flow_reports(tmp_path):
    out = preflight(*_reward_dir(tmp_path, {"data": {"passed": False}, "model": {"passed": True, "problems": []}}))
    assert out["healthy"] and not out["overridden"]


@pytest.mark.parametrize("health,reason", [
    (None, "no .*health.json"),
    ({"healthy": True}, "not the reward stage's health report"),
    ({"data": {"passed": True}, "model": {"passed": False, "problems": ["IRM overfit: mean over 0.9"]}}, "IRM overfit"),
    ({"data": {"passed": True}, "model": None}, "model health report"),
])
def test_preflight_refuses_unless_overridden(tmp_path, health, reason):
    args = _reward_dir(tmp_path, health)
    with pytest.raises(RewardStageUnhealthy, match=reason):
        preflight(*args)
    out = preflight(*args, ignore_health=True)
    assert out["overridden"] and not out["healthy"] and re.search(reason, out["reason"])


def test_preflight_names_an_unreadable_health_file(tmp_path):
    args = _reward_dir(tmp_path, None)
    (tmp_path / "health.json").write_text("{not json")
    with pytest.raises(RewardStageUnhealthy, match="unreadable .*health.json"):
        preflight(*args)
    out = preflight(*args, ignore_health=True)
    assert out["overridden"] and out["health"] is None and out["reason"].startswith("unreadable ")


def test_preflight_never_runs_without_models(tmp_path):
    with pytest.raises(RewardStageUnhealthy, match="IRM folder"):
        preflight(tmp_path, tmp_path / "irm", tmp_path / "prm", ignore_health=True)


def test_verl_check_without_verl_is_an_error_not_a_verdict():
    """check_with_verl in a python without verl raises VerlCheckError (never an empty problem list)."""
    import importlib.util
    import sys

    if importlib.util.find_spec("verl") is not None:
        pytest.skip("verl is importable in this venv")
    with pytest.raises(ppo_verl.VerlCheckError, match="not importable"):
        ppo_verl.check_with_verl(overrides(), python=sys.executable)
