"""Scale-out path: the verl PPO configuration and its Ray job submission.

`verl_overrides` turns `[ppo]` settings and the run's paths into Hydra overrides for
`python3 -m verl.trainer.main_ppo` (verl 0.9 key names): PPO with a critic (GAE), KL in the reward
(kl_coef), the published RLEIF numbers, the prompt parquet files, and the custom reward function
`tasks/ppo/reward.py::compute_score_async` with the IRM / PRM folders as its reward_kwargs.
`ray_submit_command` wraps it in `ray job submit --address ADDR --submission-id ID -- ...`.
Checkpoints: every ppo.save_freq steps and at the last one into `checkpoint_dir` (trainer.default_local_dir), resumed
from automatically (trainer.resume_mode auto), the actor saved also as a Hugging Face folder (save_contents hf_model);
`final_actor(checkpoint_dir)` is the folder `evolforge eval --policy` reads after the job
(global_step_N/actor/huggingface, N from verl's latest_checkpointed_iteration.txt).

Two checks: `validate_config`, the offline pydantic schema (tasks/ppo/verl_schema.py; no verl needed, what the
flow runs), and `check_with_verl`, verl's own: Hydra composes the overrides onto verl's ppo_trainer config and
verl's `validate_config` runs on it, exactly as `verl.trainer.main_ppo` does before it starts Ray, in a python
where verl is importable (verl pins packages older than evolforge's: its own virtualenv, or the test suite's
evolforge.testing.verl_env). `hydra_args` quotes every text so that it reaches verl verbatim (no OmegaConf
interpolation of `${...}` in names or paths, no number or boolean parsing of a name like "2024"), and
`config_document` (verl/ppo_config.yaml) escapes every string the same way for OmegaConf: a user string holding
`${oc.env:OPENAI_API_KEY}` stays that text when verl or Hydra loads and resolves the file.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from evolforge.config.settings import PPOSettings
from evolforge.tasks.ppo.verl_schema import VerlPPOConfig

REWARD_FILE = Path(__file__).resolve().with_name("reward.py")
REWARD_FUNCTION = "compute_score_async"
VERL_ENTRY = ["python3", "-m", "verl.trainer.main_ppo"]


CHECKPOINT_CONTENTS = ["model", "optimizer", "extra", "hf_model"]  # hf_model: the actor as a Hugging Face folder


def final_actor(checkpoint_dir: str | Path) -> Path:
    """The last saved actor as a Hugging Face folder (what `evolforge eval --policy` reads); FileNotFoundError
    before verl saved one."""
    root = Path(checkpoint_dir)
    latest = root / "latest_checkpointed_iteration.txt"
    if not latest.is_file():
        raise FileNotFoundError(f"{root}: no checkpoint yet (no latest_checkpointed_iteration.txt)")
    folder = root / f"global_step_{int(latest.read_text().strip())}" / "actor" / "huggingface"
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: the latest checkpoint holds no Hugging Face actor")
    return folder


def verl_overrides(cfg: PPOSettings, *, train_files: str, val_files: str, policy_path: str, irm_dir: str,
                   prm_dir: str, checkpoint_dir: str, reward_file: str | Path | None = None,
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
        "actor_rollout_ref.actor.checkpoint.save_contents": CHECKPOINT_CONTENTS,
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
        "trainer.save_freq": cfg.save_freq,
        "trainer.default_local_dir": str(checkpoint_dir),
        "trainer.resume_mode": "auto",
        "trainer.max_actor_ckpt_to_keep": cfg.max_checkpoints,
        "trainer.max_critic_ckpt_to_keep": cfg.max_checkpoints,
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


def config_document(overrides: dict[str, Any]) -> dict:
    """The overrides as the nested document written to verl/ppo_config.yaml, every string escaped for OmegaConf
    (`omegaconf_text`): loaded and resolved by OmegaConf (as verl and Hydra load a config), each arrives verbatim."""
    def escape(value: Any) -> Any:
        if isinstance(value, str):
            return omegaconf_text(value)
        if isinstance(value, dict):
            return {k: escape(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [escape(v) for v in value]
        return value

    return escape(nested(overrides))


def validate_config(overrides: dict[str, Any]) -> VerlPPOConfig:
    """Check the overrides against the documented schema; raises pydantic.ValidationError."""
    return VerlPPOConfig.model_validate(nested(overrides))


_BARE = re.compile(r"^[A-Za-z0-9_./:\-]+$")


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def omegaconf_text(s: str) -> str:
    """`s` as OmegaConf reads it back verbatim: every `${` escaped (`\\${`) and the backslashes just before it
    doubled, so a name or path holding `${oc.env:API_KEY}` never pulls the environment into the config."""
    return re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", s)


def _quoted(s: str) -> str:
    """A Hydra override string that arrives in verl's config as exactly `s`: OmegaConf interpolations escaped
    (`omegaconf_text`), then Hydra's quoting (backslashes before a quote or the end doubled, quotes escaped)."""
    s = omegaconf_text(s)
    s = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, s)
    return "'" + s.replace("'", "\\'") + "'"


def _hydra_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    s = str(value)
    bare = _BARE.match(s) and s.lower() not in ("true", "false", "null") and not _is_number(s)
    return s if bare else _quoted(s)  # a text that reads as a number or boolean stays text


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


# Runs in a python where verl is importable (its own environment: verl pins packages older than evolforge's).
# Reads {"checks": [{"overrides": [hydra args], "keys": [...]}, ...]} on stdin; prints one JSON line
# {"verl": version or None, "error": why verl did not import, "results": [{"problems", "values"}, ...]}.
VERL_CHECK_SCRIPT = r"""
import json, os, sys, traceback
request = json.load(sys.stdin)
out = {"verl": None, "error": None, "results": []}
try:
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    import verl.trainer.main_ppo as main_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device
    out["verl"] = verl.__version__
except Exception:
    out["error"] = traceback.format_exc()[-4000:]
    request["checks"] = []
for check in request["checks"]:
    result = {"problems": [], "values": {}}
    out["results"].append(result)
    try:
        with initialize_config_dir(config_dir=os.path.join(os.path.dirname(main_ppo.__file__), "config"),
                                   version_base=None):
            config = compose(config_name="ppo_trainer", overrides=check["overrides"])
        for key in check["keys"]:
            value = OmegaConf.select(config, key, default=None)
            result["values"][key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        # what verl.trainer.main_ppo.main does before it starts Ray
        auto_set_device(config)
        validate_config(config=config, use_reference_policy=need_reference_policy(config),
                        use_critic=need_critic(config))
    except Exception as e:  # a failure here is a problem of the configuration
        result["problems"].append(f"{type(e).__name__}: {e}")
print(json.dumps(out, default=str))
"""


class VerlCheckError(RuntimeError):
    """The check itself could not run (no verl in that python, a crash): not a verdict on the configuration."""


def check_with_verl(overrides: dict[str, Any], python: str = sys.executable, env: dict | None = None,
                    timeout_s: float = 600.0) -> dict:
    """Check the overrides with verl's own code, exactly as `verl.trainer.main_ppo` does before it starts Ray:
    Hydra composes them onto verl's ppo_trainer config (an unknown key, or '+' on a declared one, fails), then
    verl's `validate_config` builds its typed configs (actor, critic, model: the model folders must exist here)
    and checks the batch arithmetic. Runs `python` (one that imports verl and hydra) in a subprocess.

    Returns {"verl": version, "problems": [...] (empty = valid), "values": {key: the composed value}}."""
    return check_many_with_verl([overrides], python, env, timeout_s)[0]


def check_many_with_verl(configs: list[dict[str, Any]], python: str = sys.executable, env: dict | None = None,
                         timeout_s: float = 600.0) -> list[dict]:
    """`check_with_verl` of several configurations in one subprocess (importing verl takes most of the time)."""
    request = json.dumps({"checks": [{"overrides": hydra_args(o), "keys": [k.lstrip("+") for k in o]}
                                     for o in configs]})
    try:
        proc = subprocess.run([python, "-c", VERL_CHECK_SCRIPT], input=request, capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VerlCheckError(f"could not run verl's config check with {python}: {e}") from e
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise VerlCheckError(f"verl's config check crashed (exit {proc.returncode}): {proc.stderr.strip()[-3000:]}")
    out = json.loads(lines[-1])
    if out["verl"] is None:
        raise VerlCheckError(f"verl is not importable with {python}:\n{out['error']}")
    return [{"verl": out["verl"], **r} for r in out["results"]]
