"""Scale-out path: the verl PPO configuration and its Ray job submission.

`verl_overrides` turns `[ppo]` settings and the run's paths into Hydra overrides for
`python3 -m verl.trainer.main_ppo` (verl 0.9 key names): PPO with a critic (GAE), KL in the reward
(kl_coef), the published RLEIF numbers, the prompt parquet files, and the custom reward function
`tasks/ppo/reward.py::compute_score_async` with the IRM / PRM folders as its reward_kwargs.
`ray_submit_command` wraps it in `ray job submit --address ADDR --submission-id ID -- ...`.

Two validations: `validate_config` (the documented pydantic schema in tasks/ppo/verl_schema.py, always
available) and `validate_against_verl` (every key checked against verl's own generated ppo_trainer.yaml,
found through the installed verl package or $VERL_PPO_TRAINER_YAML).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from evolforge.config.settings import PPOSettings
from evolforge.tasks.ppo.verl_schema import VerlPPOConfig

REWARD_FILE = Path(__file__).resolve().with_name("reward.py")
REWARD_FUNCTION = "compute_score_async"
VERL_ENTRY = ["python3", "-m", "verl.trainer.main_ppo"]


def verl_overrides(cfg: PPOSettings, *, train_files: str, val_files: str, policy_path: str, irm_dir: str,
                   prm_dir: str, reward_file: str | Path | None = None,
                   reward_function: str = REWARD_FUNCTION) -> dict[str, Any]:
    """Hydra key -> value. A leading '+' adds a key verl's schema does not declare (reward_kwargs)."""
    kw = "+reward.custom_reward_function.reward_kwargs"
    reward_file = reward_file or cfg.reward_function_path or REWARD_FILE
    return {
        "algorithm.adv_estimator": cfg.adv_estimator,
        "algorithm.gamma": cfg.gamma,
        "algorithm.lam": cfg.lam,
        "algorithm.use_kl_in_reward": True,
        "algorithm.kl_penalty": "kl",
        "algorithm.kl_ctrl.type": "fixed",
        "algorithm.kl_ctrl.kl_coef": cfg.kl_coef,
        "data.train_files": str(train_files),
        "data.val_files": str(val_files),
        "data.prompt_key": "prompt",
        "data.reward_fn_key": "data_source",
        "data.train_batch_size": cfg.rollout_batch_size,
        "data.max_prompt_length": cfg.max_prompt_length,
        "data.max_response_length": cfg.max_response_length,
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "actor_rollout_ref.model.path": str(policy_path),
        "actor_rollout_ref.actor.optim.lr": cfg.actor_lr,
        "actor_rollout_ref.actor.ppo_mini_batch_size": cfg.ppo_mini_batch_size,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": cfg.ppo_micro_batch_size_per_gpu,
        "actor_rollout_ref.actor.ppo_epochs": cfg.ppo_epochs,
        "actor_rollout_ref.actor.clip_ratio": cfg.clip_ratio,
        "actor_rollout_ref.actor.use_kl_loss": False,  # PPO: the KL penalty is in the reward
        "actor_rollout_ref.rollout.name": cfg.rollout_engine,
        "actor_rollout_ref.rollout.n": cfg.rollout_n,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": cfg.tensor_parallel_size,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": cfg.ppo_micro_batch_size_per_gpu,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": cfg.ppo_micro_batch_size_per_gpu,
        "critic.model.path": str(policy_path),
        "critic.optim.lr": cfg.critic_lr,
        "critic.ppo_micro_batch_size_per_gpu": cfg.ppo_micro_batch_size_per_gpu,
        "reward.custom_reward_function.path": str(reward_file),
        "reward.custom_reward_function.name": reward_function,
        f"{kw}.irm_dir": str(irm_dir),
        f"{kw}.prm_dir": str(prm_dir),
        f"{kw}.aggregation": cfg.aggregation,
        f"{kw}.answer_weight": cfg.answer_weight,
        f"{kw}.batch_window_s": cfg.reward_batch_window_s,
        f"{kw}.device": cfg.reward_device,
        "trainer.project_name": cfg.project_name,
        "trainer.experiment_name": cfg.experiment_name,
        "trainer.nnodes": cfg.nnodes,
        "trainer.n_gpus_per_node": cfg.n_gpus_per_node,
        "trainer.total_epochs": cfg.total_epochs,
        "trainer.logger": ["console"],
        "trainer.val_before_train": True,
        "trainer.test_freq": 10,
    }


def nested(overrides: dict[str, Any]) -> dict:
    """{"a.b.c": v} -> {"a": {"b": {"c": v}}} (the '+' of added keys dropped)."""
    tree: dict = {}
    for key, value in overrides.items():
        *parents, leaf = key.lstrip("+").split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def validate_config(overrides: dict[str, Any]) -> VerlPPOConfig:
    """Check the overrides against the documented schema; raises pydantic.ValidationError."""
    return VerlPPOConfig.model_validate(nested(overrides))


_BARE = re.compile(r"^[A-Za-z0-9_./:\-]+$")


def _hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    s = str(value)
    return s if _BARE.match(s) and s.lower() not in ("true", "false", "null") else "'" + s.replace("'", "\\'") + "'"


def hydra_args(overrides: dict[str, Any]) -> list[str]:
    return [f"{k}={_hydra_value(v)}" for k, v in overrides.items()]


def main_ppo_command(overrides: dict[str, Any]) -> list[str]:
    return VERL_ENTRY + hydra_args(overrides)


def ray_submit_command(overrides: dict[str, Any], address: str, submission_id: str, working_dir: str = "") -> list[str]:
    cmd = ["ray", "job", "submit", "--address", address or "$RAY_ADDRESS", "--submission-id", submission_id, "--no-wait"]
    if working_dir:
        cmd += ["--working-dir", working_dir]
    return cmd + ["--"] + main_ppo_command(overrides)


def shell_line(cmd: list[str]) -> str:
    return " ".join(c if c == "$RAY_ADDRESS" else shlex.quote(c) for c in cmd)


class RaySubmitError(RuntimeError):
    pass


def submit(cmd: list[str], timeout_s: float = 300.0) -> dict:
    """Run `ray job submit ... --no-wait`; the job id is the command's --submission-id."""
    ray = shutil.which(cmd[0])
    if ray is None:
        raise RaySubmitError("`ray` is not installed here: pip install 'ray[default]' (the job runs on the cluster; "
                             "this machine only needs the CLI), or run the written submit.sh where it is")
    proc = subprocess.run([ray, *cmd[1:]], capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RaySubmitError(f"ray job submit failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return {"submission_id": cmd[cmd.index("--submission-id") + 1], "stdout": proc.stdout[-4000:]}


def find_verl_config() -> Path | None:
    """verl's generated ppo_trainer.yaml: $VERL_PPO_TRAINER_YAML, else inside the installed verl package."""
    env = os.environ.get("VERL_PPO_TRAINER_YAML")
    if env and Path(env).is_file():
        return Path(env)
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    return found if found.is_file() else None


_MISSING = object()


def validate_against_verl(overrides: dict[str, Any], verl_yaml: Path) -> list[str]:
    """Problems of the overrides against verl's own config; empty list = valid. With Hydra installed, the
    overrides are composed onto verl's ppo_trainer config exactly as main_ppo does; without it, every key is
    checked against the generated YAML (unknown keys, '+' on existing keys, values of the wrong kind)."""
    try:
        from hydra import compose, initialize_config_dir
        from hydra.errors import HydraException
    except ImportError:
        return _check_keys(overrides, Path(verl_yaml))
    try:
        with initialize_config_dir(config_dir=str(Path(verl_yaml).resolve().parent), version_base=None):
            compose(config_name="ppo_trainer", overrides=hydra_args(overrides))
    except HydraException as e:
        return [str(e)]
    return []


def _check_keys(overrides: dict[str, Any], verl_yaml: Path) -> list[str]:
    schema = yaml.safe_load(verl_yaml.read_text(encoding="utf-8"))
    problems = []
    for key, value in overrides.items():
        added = key.startswith("+")
        parts = key.lstrip("+").split(".")
        node: Any = schema
        for i, p in enumerate(parts):
            if isinstance(node, dict) and p in node:
                node = node[p]
            else:
                node = _MISSING
                missing_at = ".".join(parts[: i + 1])
                break
        if added:
            parent_exists = node is _MISSING and missing_at != parts[0]
            if node is not _MISSING:
                problems.append(f"{key}: '+' adds a key, but verl already declares {key[1:]}")
            elif not parent_exists:
                problems.append(f"{key}: verl has no section {missing_at}")
            continue
        if node is _MISSING:
            problems.append(f"{key}: verl has no key {missing_at}")
        elif isinstance(node, dict):
            problems.append(f"{key}: {key} is a section in verl, not a value")
        elif isinstance(node, bool) and not isinstance(value, bool):
            problems.append(f"{key}: verl expects a boolean, got {value!r}")
        elif isinstance(node, (int, float)) and not isinstance(node, bool) and not isinstance(value, (int, float)):
            problems.append(f"{key}: verl expects a number, got {value!r}")
        elif isinstance(node, list) and not isinstance(value, (list, tuple)):
            problems.append(f"{key}: verl expects a list, got {value!r}")
    return problems
