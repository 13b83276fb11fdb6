"""The PPO stage keeps secrets out of what it hands to verl and Ray.

- verl/ppo_config.yaml: every string setting arrives verbatim when OmegaConf (what verl and Hydra load it with)
  resolves the file; a `${oc.env:...}` in a user string is text, never the environment's value.
- the Ray job's environment variables (the dashboard shows them): refused by name pattern, by a non-ASCII name,
  by value (the configured keys, well-known token shapes, URLs with credentials), unless the operator names the
  variable in ppo.ray_env_allow.
"""

from __future__ import annotations

import json

import pytest

from evolforge.config.settings import load_settings
from evolforge.storage.ppo import PPOLayout
from evolforge.tasks.ppo import job

SECRET = "sk-live-DO-NOT-LEAK-0123456789abcdef"
INTERPOLATED = "${oc.env:OPENAI_API_KEY}"


@pytest.fixture(scope="module")
def omegaconf_env():
    """A python with omegaconf importable: verl's own environment (omegaconf is not in the project's venv)."""
    from evolforge.testing.verl_env import VerlEnvUnavailable, ensure_verl_env

    try:
        return ensure_verl_env()
    except VerlEnvUnavailable as e:
        if e.offline:
            pytest.skip(f"verl's environment (omegaconf) cannot be installed (package index unreachable): {e}")
        raise


def _resolve_with_omegaconf(env, path) -> dict:
    code = ("import json, sys\nfrom omegaconf import OmegaConf\n"
            "print(json.dumps(OmegaConf.to_container(OmegaConf.load(sys.argv[1]), resolve=True)))")
    proc = env.run(code, str(path), env={"OPENAI_API_KEY": SECRET, "EVOLFORGE_API_KEY": SECRET})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_verl_yaml_strings_are_not_interpolated_by_omegaconf(tmp_path, omegaconf_env):
    texts = {
        "project_name": INTERPOLATED,
        "experiment_name": "run-\\" + INTERPOLATED + "-\\\\${oc.env:EVOLFORGE_API_KEY}\\",  # backslashes before ${
    }
    reward_file = tmp_path / INTERPOLATED / "reward.py"  # a real file (the schema checks it) under a hostile name
    reward_file.parent.mkdir()
    reward_file.write_text("def compute_score_async(**kw):\n    return 0.0\n")
    texts["reward_function_path"] = str(reward_file)
    cfg = load_settings(overrides={"ppo": texts}).ppo
    lay = PPOLayout(tmp_path / "ppo").ensure()
    job.verl_config(cfg, lay, "/models/${oc.env:OPENAI_API_KEY}", tmp_path / "irm", tmp_path / "prm", "sub-1")

    raw = lay.verl_config.read_text()
    assert SECRET not in raw
    resolved = _resolve_with_omegaconf(omegaconf_env, lay.verl_config)
    assert SECRET not in json.dumps(resolved)
    trainer = resolved["trainer"]
    assert trainer["project_name"] == texts["project_name"]  # verbatim: the text, not the key
    assert trainer["experiment_name"] == texts["experiment_name"]
    assert resolved["reward"]["custom_reward_function"]["path"] == texts["reward_function_path"]
    assert resolved["actor_rollout_ref"]["model"]["path"] == "/models/${oc.env:OPENAI_API_KEY}"
    assert trainer["logger"] == ["console"] and trainer["nnodes"] == 1  # other values as they were
