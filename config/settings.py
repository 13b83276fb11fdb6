"""Typed settings for evolforge, loaded from TOML with environment overrides.

One tree, one source of truth. The root (`Settings`), the loader and its precedence are here; each
section is defined and documented field by field in its own file under `config/sections/`
(gateway and models, evolve and input, runtime: embedded model / runner / storage / schedule, dedup,
synthesis, sandbox, reward, ppo, proxy, modules). `config/default.toml` holds the defaults a run starts from.

Precedence (later wins):
  1. the defaults in this file,
  2. `config/default.toml` (or the file given with `--config`),
  3. environment variables `EVOLFORGE__SECTION__KEY=value`
     (for example `EVOLFORGE__EVOL_INSTRUCT__ROUNDS=6`,
     `EVOLFORGE__GATEWAY__BASE_URL=http://gpu:8000/v1`, `EVOLFORGE__MODELS__JUDGE=gpt-4o-mini`),
  4. explicit overrides from the CLI or flow parameters,
  5. when all of the above leave gateway.base_url empty: the `OPENAI_BASE_URL` environment variable (what the
     OpenAI SDK and most tools read), so a run never quietly falls back to the embedded model.

The config file is validated on its own before anything overrides it: a wrong value in the file is an error
even where a flag or variable replaces it. A UTF-8 byte-order mark at its start is read as nothing.

The API key is never part of the settings: it is read from `EVOLFORGE_API_KEY`
(falling back to `OPENAI_API_KEY`) by the gateway at call time.
Invalid settings fail at start with `ConfigError`, naming the key and the problem.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from evolforge.config.sections._base import Section
from evolforge.config.sections.dedup import DedupSettings
from evolforge.config.sections.eval import EvalSettings
from evolforge.config.sections.evolve import EvolInstructSettings, InputSettings
from evolforge.config.sections.gateway import GatewaySettings, ModelMap, PriceOverride, PricingSettings
from evolforge.config.sections.modules import ModulesSettings
from evolforge.config.sections.ppo import PPOSettings
from evolforge.config.sections.proxy import ProxySettings
from evolforge.config.sections.reward import DEFAULT_IRM_PROMPT, RewardSettings
from evolforge.config.sections.runtime import EmbeddedModelSettings, RunnerSettings, ScheduleSettings, StorageSettings
from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.config.sections.sft import SFTSettings
from evolforge.config.sections.synthesis import SynthesisSettings

__all__ = [  # the sections are importable from here too: one place to find any setting
    "ConfigError", "Settings", "load_settings", "env_overrides", "deep_merge", "DEFAULT_CONFIG", "SAMPLE_SEEDS",
    "DedupSettings", "EvolInstructSettings", "InputSettings", "GatewaySettings", "ModelMap", "PriceOverride",
    "PricingSettings", "PPOSettings", "DEFAULT_IRM_PROMPT", "RewardSettings", "EmbeddedModelSettings",
    "RunnerSettings", "ScheduleSettings", "StorageSettings", "SandboxSettings", "SynthesisSettings", "ProxySettings",
    "ModulesSettings", "SFTSettings", "EvalSettings",
]

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"
SAMPLE_SEEDS = CONFIG_DIR / "sample_seeds.jsonl"
ENV_PREFIX = "EVOLFORGE__"
BASE_URL_ENV = "OPENAI_BASE_URL"  # the endpoint when no flag, file or EVOLFORGE__ variable names one


class ConfigError(ValueError):
    """Settings that cannot be used; the message names the key and the problem."""


class Settings(Section):
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    models: ModelMap = Field(default_factory=ModelMap)
    evol_instruct: EvolInstructSettings = Field(default_factory=EvolInstructSettings)
    embedded: EmbeddedModelSettings = Field(default_factory=EmbeddedModelSettings)
    input: InputSettings = Field(default_factory=InputSettings)
    runner: RunnerSettings = Field(default_factory=RunnerSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    pricing: PricingSettings = Field(default_factory=PricingSettings)
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)
    dedup: DedupSettings = Field(default_factory=DedupSettings)
    synthesis: SynthesisSettings = Field(default_factory=SynthesisSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    ppo: PPOSettings = Field(default_factory=PPOSettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    modules: ModulesSettings = Field(default_factory=ModulesSettings)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)

    @property
    def uses_embedded_model(self) -> bool:
        return not self.gateway.base_url

    def fingerprint(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


def _has(tree: Any, path: tuple) -> bool:
    for part in path:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def _source_of(path: tuple, file: str, env: dict, overrides: dict, flags: dict[str, str]) -> str:
    """Where the value at `path` came from: the flag or parameter that set it, the environment variable, the
    config file (the last one that gives it, as the merge takes it)."""
    dotted = ".".join(str(p) for p in path)
    for n in range(len(path), 0, -1):  # an unknown key inside a section a flag set: blame that flag
        if ".".join(str(p) for p in path[:n]) in flags:
            return flags[".".join(str(p) for p in path[:n])]
    for n in range(len(path), min(2, len(path)) - 1, -1):  # the key, or the entry (a model's price) holding it
        if _has(overrides, path[:n]):
            return f"overrides {{{dotted!r}: ...}} (a flow parameter or Python argument)"
        if _has(env, path[:n]):
            return "environment variable " + ENV_PREFIX + "__".join(str(p).upper() for p in path[:n])
    return file


def _format_errors(err: ValidationError, source: str, env: dict | None = None, overrides: dict | None = None,
                   flags: dict[str, str] | None = None) -> str:
    """One line: each bad key, what is wrong with it, and where its value came from."""
    problems = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"])
        key = ".".join(str(p) for p in loc) or "(root)"
        where = _source_of(loc, source, env or {}, overrides or {}, flags or {})
        if e["type"] == "extra_forbidden":
            problems.append(f"{key}: unknown key (from {where}; check the spelling against config/sections/)")
        else:
            problems.append(f"{key}: {e['msg']} (got {e.get('input')!r}, from {where})")
    return "invalid configuration: " + "; ".join(problems)


def deep_merge(base: dict, extra: dict) -> dict:
    """Nested dict merge: `extra` wins; neither input is changed."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _parse_env_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def env_overrides(environ: dict[str, str] | None = None) -> dict:
    """`EVOLFORGE__A__B=v` -> {"a": {"b": v}}; values parse as JSON when they can."""
    environ = os.environ if environ is None else environ
    tree: dict = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        if not path:
            continue
        node = tree
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = _parse_env_value(raw)
    return tree


def load_settings(
    path: str | Path | None = None,
    overrides: dict | None = None,
    environ: dict[str, str] | None = None,
    flags: dict[str, str] | None = None,
) -> Settings:
    """Load settings: defaults < TOML file < EVOLFORGE__ env vars < explicit overrides.

    `flags`: dotted key -> the flag (or parameter) that set it among the overrides, so an invalid value is
    blamed on it; any other bad value on its environment variable, the overrides or the file."""
    path = Path(path) if path else DEFAULT_CONFIG
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder: pass --config a TOML file (e.g. {path}/config.toml)")
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is not part of the TOML
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} cannot be read: {e}") from None
    try:  # the file on its own: a wrong value in it is an error even where a flag or variable overrides it
        Settings.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, str(path))) from None
    environ = os.environ if environ is None else environ
    env = env_overrides(environ)
    data = deep_merge(data, env)
    data = deep_merge(data, overrides or {})
    if not (data.get("gateway") or {}).get("base_url") and environ.get(BASE_URL_ENV, "").strip():
        data = deep_merge(data, {"gateway": {"base_url": environ[BASE_URL_ENV].strip()}})
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, str(path), env, overrides, flags)) from None
