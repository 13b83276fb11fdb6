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
from evolforge.tasks.core.keys import secret_env_names
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


# ---------------------------------------------------------------- the Ray job's environment

def _request(env_vars: dict, **ppo):
    cfg = load_settings(overrides={"ppo": {"ray_env_vars": env_vars, **ppo}}).ppo
    return job.job_request(cfg, "evolforge-verl-ppo-1", ["python3", "-m", "verl.trainer.main_ppo"], smoke=False)


JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJvcGVyYXRvciJ9.c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"
REFUSED = {  # one variable each: the name (or the value) gives a secret away
    "DB_PASS": "hunter2-but-longer",
    "HF_AUTH": "anything",
    "GH_PAT": "anything",
    "AUTHORIZATION": "Bearer abcdefgh",
    "SENTRY_DSN": "https://0123456789abcdef@o1.ingest.sentry.io/42",
    "DATABASE_URL": "postgresql://admin:s3cret-pw@db.internal:5432/app",  # a DSN with credentials, harmless name
    "API_K\u0415Y": "anything",  # a Cyrillic Е: not ASCII
    "WANDB_PROJECT": SECRET,  # the configured key's value under a harmless name
    "EXTRA_ARGS": f"--api-key={SECRET}",  # ... or inside a longer value
    "CACHE_SALT": "x",  # the name
    "HOME_REPO": "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",  # token shapes under harmless names
    "MODEL_REPO_REF": "hf_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ012345",
    "S3_USER": "AKIA" + "ABCDEFGHIJKLMNOP",
    "CHAT_HOOK": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "OPENAI_COMPAT": "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2",
    "SESSION_BLOB": JWT,
    "UPSTREAM": JWT,
    "PROXY_TOKEN_COPY": "tok-0123456789",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_secret_in_the_ray_job_environment_is_refused(name, monkeypatch):
    from evolforge.tasks.ppo.ray_jobs import RayJobError

    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    value = REFUSED[name]
    with pytest.raises(RayJobError) as err:
        _request({"HF_HOME": "/cache/hf", name: value})
    message = str(err.value)
    assert ascii(name) in message or name in message  # the variable is named (a non-ASCII one escaped)
    assert "HF_HOME" not in message  # not the harmless one beside it
    assert value not in message and SECRET not in message  # the value never shows


def test_the_configured_keys_are_refused_by_value(monkeypatch):
    from evolforge.tasks.ppo.ray_jobs import RayJobError

    monkeypatch.setenv("EVOLFORGE_PROXY_TOKEN", "proxy-token-0123456789")
    with pytest.raises(RayJobError, match="WANDB_RUN_GROUP"):
        _request({"WANDB_RUN_GROUP": "proxy-token-0123456789"})
    monkeypatch.setenv("MY_SANDBOX_TOKEN", "sandbox-token-0123456789")
    cfg = load_settings(overrides={"sandbox": {"service": {"token_env": "MY_SANDBOX_TOKEN"}},
                                   "ppo": {"ray_env_vars": {"RUN_LABEL": "sandbox-token-0123456789"}}})
    with pytest.raises(RayJobError, match="RUN_LABEL"):
        job.job_request(cfg.ppo, "id", ["python3"], smoke=False, secret_names=secret_env_names(cfg))


def test_harmless_variables_pass():
    env = {"HF_HOME": "/cache/hf", "WANDB_PROJECT": "rleif", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0,1",
           "VLLM_ATTENTION_BACKEND": "FLASH_ATTN", "RAY_DASHBOARD": "http://head:8265", "NCCL_DEBUG": "WARN",
           "TRANSFORMERS_OFFLINE": "1", "RUN_NOTE": "sk-short"}
    assert _request(env).runtime_env()["env_vars"] == {"PYTHONUNBUFFERED": "1", **env}


def test_the_allow_list_passes_variables_the_operator_vouches_for(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    env = {"WANDB_API_KEY": "0123456789abcdef0123456789abcdef", "DATABASE_URL": "postgresql://u:p@db/app"}
    req = _request(env, ray_env_allow=["WANDB_API_KEY", "DATABASE_URL"])
    assert req.runtime_env()["env_vars"]["WANDB_API_KEY"] == env["WANDB_API_KEY"]
    from evolforge.tasks.ppo.ray_jobs import RayJobError

    with pytest.raises(RayJobError, match="DB_PASS"):  # only the names on the list
        _request({**env, "DB_PASS": "x"}, ray_env_allow=["WANDB_API_KEY", "DATABASE_URL"])


def test_the_allow_list_takes_only_ascii_variable_names():
    from evolforge.config.settings import ConfigError

    with pytest.raises(ConfigError, match="ray_env_allow"):
        load_settings(overrides={"ppo": {"ray_env_allow": ["API_K\u0415Y"]}})
