"""The model gateway: the endpoint, retries, concurrency, which model serves which stage, prices."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evolforge.config.sections._base import Section


class GatewaySettings(Section):
    """The one OpenAI-compatible endpoint every model call goes through."""

    base_url: str = Field(
        "",
        description="OpenAI-compatible base URL, e.g. http://gpu-box:8000/v1 (vLLM) or "
        "https://api.openai.com/v1. Empty: the OPENAI_BASE_URL environment variable when it is set, else start "
        "the embedded model on loopback (--base-url and EVOLFORGE__GATEWAY__BASE_URL come first). A run's first "
        "line names the endpoint and model it uses.",
    )
    timeout_seconds: float = Field(120.0, gt=0, description="Per-request timeout (connect + read).")
    max_retries: int = Field(3, ge=0, le=20, description="Retries after the first attempt on 429, 5xx, timeouts, connection errors and malformed bodies.")
    backoff_base_seconds: float = Field(1.0, ge=0, description="First backoff delay; doubles per retry, with full jitter.")
    backoff_max_seconds: float = Field(30.0, ge=0, description="Cap on one backoff delay (a longer Retry-After is honoured up to 4x this).")
    concurrency: int = Field(
        0, ge=0, le=1024, description="Most model calls in flight at once in one process. 0 (default): follow the "
        "endpoint: 32 for a remote one; for the embedded model one call per llama-server slot (read from the "
        "server's /props; 2 on llama-cpp-python's one-at-a-time server; embedded.max_concurrent_calls sets another "
        "number). A positive value is used as given for a remote endpoint, and lowers the embedded model's (calls "
        "beyond its slots only queue in the server). A run's first lines say the number and where it came from "
        "(`gateway: N calls in flight (from ...)`).")
    global_concurrency_limit: str = Field(
        "",
        description="Name of a Prefect global concurrency limit (with slot decay) every call also takes a slot of; "
        "empty disables. Create it with `prefect gcl create NAME --limit N --slot-decay-per-second R`.",
    )
    ca_bundle: str = Field(
        "", description="CA bundle file (PEM) that verifies the endpoint's TLS certificate: a private CA or a "
        "company proxy's. Empty: the SSL_CERT_FILE environment variable when it is set, else the system's and "
        "certifi's CAs. A certificate that does not verify stops a run at start, naming this setting.")
    allow_key_over_http: bool = Field(
        False, description="Send the API key over plain http to a host that is not loopback (a trusted private "
        "network). Off: a key goes over http only to 127.0.0.0/8, ::1 or localhost, and a run against another "
        "http host with a key set stops at start with an error naming this setting. https is always allowed.",
    )
    structured_outputs: Literal["json_schema", "json_object", "prompt"] = Field(
        "json_schema", description="How a call that expects JSON (module outputs, the Equal judge, IRM rankings, PRM "
        "step labels and scores, synthesis proposals and repairs) asks for it, at best. json_schema: "
        "`response_format: {type: json_schema, json_schema: {name, schema, strict: true}}` with the stage's pydantic "
        "schema (vLLM, OpenAI and llama-server honour it; llama-server turns it into a grammar, so the embedded model "
        "returns JSON of that shape). json_object: `{type: json_object}`, any JSON object. prompt: no response_format, "
        "the prompt describes the JSON and the reply is parsed tolerantly. An endpoint that rejects the field (HTTP "
        "400 or 422 naming it) gets the next one at once; the one that worked is remembered per endpoint and model "
        "for the rest of the process and the downgrade is logged once (docs/structured-outputs.md).",
    )
    schema_string_lengths: Literal["auto", "keep", "drop"] = Field(
        "auto", description="Whether the json_schema sent keeps the schemas' string lengths (minLength / maxLength): "
        "llama-server and vLLM turn them into the grammar (no empty strings, no string that runs to the token cap), "
        "OpenAI's strict mode refuses them. auto: keep them for the embedded model only; keep; drop.",
    )
    check_model_list: bool = Field(
        True, description="Before a run, check that the endpoint's model list (GET /models) names every model the "
        "[models] section gives (the input check stops with the list and the flag to set, before anything is "
        "written). Off: for an endpoint that serves models it does not list.",
    )
    fail_fast_after: int = Field(
        3, ge=1, description="After this many consecutive calls exhaust their retries on connection errors, "
        "the endpoint is declared down and the run stops with one clear error.",
    )


class ModelMap(Section):
    """Model name per stage. Empty means: use `default`."""

    default: str = Field("smollm2-135m-instruct", description="Model for any stage left empty.")
    evolve: str = Field("", description="Rewrites instructions (Evol-Instruct operations).")
    judge: str = Field("", description="Equal / Not Equal elimination judge, rankings, step labels.")
    answer: str = Field("", description="Answers evolved instructions (used by elimination rules 2 and 3).")
    synthesize: str = Field("", description="Proposes verifiable tasks (code tasks and math problems).")
    validator: str = Field(
        "", description="Validates synthesized tasks: repairs a task whose reference fails its tests or whose "
        "answer the solvers do not agree with, and runs the final solver check (unless `solver` names another "
        "model); its calls are charged to the cost ledger's `validate` stage. Empty: the `synthesize` model (the "
        "proposer checks its own work, as before there was a validator), and a synthesis run warns on one line that "
        "proposer and validator are the same model. Flag: `evolforge synthesize --validator` (and `pipeline`).")
    solver: str = Field("", description="Independent solver of the final check (task difficulty, math agreement). "
                        "Empty: the `validator` model when one is set, else `default`.")

    def for_stage(self, stage: str) -> str:
        name = getattr(self, stage, "") if stage in type(self).model_fields else ""
        if not name and stage == "validator":  # no validator: the proposer repairs its own tasks (warned about)
            return self.for_stage("synthesize")
        if not name and stage == "solver":
            return self.validator or self.default
        return name or self.default


class PriceOverride(Section):
    input_per_mtok: float = Field(ge=0, description="USD per million prompt tokens.")
    output_per_mtok: float = Field(ge=0, description="USD per million completion tokens.")


class PricingSettings(Section):
    """Cost of model calls: genai-prices database, overridden per model name here."""

    provider_id: str = Field("", description="genai-prices provider id to match models against (e.g. openai); empty guesses.")
    overrides: dict[str, PriceOverride] = Field(
        default_factory=dict, description="Per model name: prices for self-hosted or private models."
    )
