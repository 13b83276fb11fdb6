"""Fail fast: the generic checks every stage's input check is made of, each with one clear message.

Each stage's `check(params, settings)` (tasks/<stage>/stage.py, named by its descriptor) is built from these.
The CLI runs it before a Prefect server starts (a user error costs well under a second and creates nothing);
the stage runner (flows/_stage.py) runs the same check first, so a run started from the Prefect UI stops with
the same message before it creates its output folder. A problem is an `InputError`: the message names the
input and the fix; the CLI prints it on one line and exits 2.

    check_rows(path, field, what)      the input file exists and holds a usable row
    check_file(path, what)             an optional input file exists
    check_folder(path, what, marker)   an input folder exists (holding `marker`)
    check_out_dir(out)                 the output folder can be created and written (nothing is created)
    check_priced(settings, roles, ...) with a USD budget, every model of the roles has a price
    check_endpoint(settings)           a configured endpoint answers like an OpenAI-compatible API, accepts the
                                       key and lists the models the settings name (one GET /models with a short
                                       timeout; a slow endpoint is left to the flow's pre-flight, which probes
                                       every model)

Imports stay light (no Prefect, no openai, no pyarrow for jsonl / csv inputs): a whole check costs about as
much as loading the settings.
"""

from __future__ import annotations

from evolforge.config.settings import Settings
from evolforge.storage.inputs import SeedFileError, first_usable_row, folder_problem, input_exists

ENDPOINT_TIMEOUT_SECONDS = 2.0


class InputError(ValueError):
    """A user error found before any work: the message names the input and the fix."""


class PreflightError(InputError):
    """The flow's pre-flight (one minimal call per model) failed: a wrong endpoint, model or key, found before
    any work; the run leaves no output folder behind when it created it (flows/_stage.py)."""


MODELS_SHOWN = 12  # models of an endpoint's list a message names before "and N more"


def check_out_dir(out: str, what: str = "--out") -> None:
    problem = folder_problem(out)
    if problem:
        raise InputError(f"{problem} (choose another {what})")


def check_rows(path: str, field: str, what: str, max_chars: int | None = None,
               fallback_field: str | None = None, field_fix: str | None = None) -> None:
    """`field_fix`: how to name another field, when no row has this one (default: input.instruction_field)."""
    try:
        first_usable_row(path, field, max_chars, what, fallback_field, **({"field_fix": field_fix} if field_fix else {}))
    except SeedFileError as e:
        raise InputError(str(e)) from None


def check_file(path: str | None, what: str) -> None:
    if path and not input_exists(path):
        import os

        if "://" not in str(path) and os.path.isdir(os.path.expanduser(str(path))):
            raise InputError(f"{what} {path} is a folder: give the file inside it")
        raise InputError(f"{what} not found: {path}")


def check_folder(path: str, what: str, marker: str | None = None, hint: str = "") -> None:
    """`path` is an existing folder (holding `marker`, when given)."""
    from evolforge.storage.fs import exists, location

    root = location(path)
    if not exists(root):
        raise InputError(f"{what} not found: {root}{hint}")
    if marker and not exists(root / marker):
        raise InputError(f"{what} {root} has no {marker}{hint}")


def check_priced(settings: Settings, roles: tuple[str, ...], budget_usd: float, budget_key: str) -> None:
    """With a USD budget (`budget_key` = `budget_usd`, not 0), every model of `roles` on a configured endpoint has a
    price: an unpriced call's cost is unknown, and unknown is never under a budget, so every task would be
    rejected as over it. The embedded model is free."""
    if not budget_usd or settings.uses_embedded_model:
        return
    from evolforge.tasks.core.pricing import has_price

    for role in roles:
        model = settings.models.for_stage(role)
        if not has_price(settings.pricing, model):
            raise InputError(
                f"model {model!r} (models.{role if getattr(settings.models, role, '') else 'default'}) has no known "
                f"price, so with {budget_key} = {budget_usd:g} every task would be rejected as over the cost budget: "
                f"add [pricing.overrides.\"{model}\"] with input_per_mtok and output_per_mtok to the config, or set "
                f"{budget_key} = 0 (no USD budget)")


def _listed_models(body: bytes) -> list[str] | None:
    """The model ids of an OpenAI-style `GET /models` answer ({"data": [{"id": ...}]}); None when the body is not
    such a list at all (not JSON, or JSON without a `data` list)."""
    import json

    try:
        doc = json.loads(body)
    except ValueError:
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return None
    return [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")]


def _model_problem(settings: Settings, base: str, served: list[str]) -> str | None:
    """The first model the settings name that the endpoint does not list, as the message naming the fix."""
    models = settings.models
    named = {}  # model -> the key that names it (models.default only when some role falls back to it)
    for role in (name for name in type(models).model_fields if name != "default"):
        own = getattr(models, role)
        named.setdefault(own or models.default, f"models.{role}" if own else "models.default")
    shown = ", ".join(served[:MODELS_SHOWN]) + (f" and {len(served) - MODELS_SHOWN} more"
                                                if len(served) > MODELS_SHOWN else "")
    for model, key in named.items():
        if model in served:
            continue
        if key == "models.default":
            embedded = ", the embedded model's name: no --model was given" if model == settings.embedded.alias else ""
            fix = "pass --model with one of them (or set models.default"
        else:
            embedded, fix = "", f"set {key} to one of them (or leave it empty for --model"
        return (f"model endpoint {base} does not serve {model!r} ({key}{embedded}); it serves: {shown}; {fix}; "
                "gateway.check_model_list = false skips this check)")
    return None


def check_endpoint(settings: Settings, timeout: float = ENDPOINT_TIMEOUT_SECONDS) -> None:
    """A configured endpoint answers `GET /models` like an OpenAI-compatible API, accepts the key and lists the
    models the settings name (the embedded model is started by the run itself: here only its GGUF file and a
    server for it are looked for)."""
    if settings.uses_embedded_model:
        from evolforge.tasks.core.embedded_model import unavailable

        problem = unavailable(settings.embedded)
        if problem:
            raise InputError(problem)
        return
    from evolforge.tasks.core.keys import InsecureKeyTransport, check_key_transport, read_api_key

    base = settings.gateway.base_url.rstrip("/")
    key = read_api_key()
    try:
        check_key_transport(base, key, settings.gateway.allow_key_over_http)
    except InsecureKeyTransport as e:
        raise InputError(str(e)) from None
    import urllib.error
    import urllib.request

    not_openai = (f"model endpoint {base} does not answer like an OpenAI-compatible API ({{what}}); the base URL "
                  "of one usually ends in /v1 (e.g. http://host:8000/v1): fix --base-url (gateway.base_url), or "
                  "leave it empty to use the embedded model")
    from evolforge.tasks.core.tls import tls_context, tls_problem

    tls = tls_context(settings) if base.startswith("https:") else True
    try:  # stdlib, not httpx: no client or TLS context to build for a plain-http endpoint
        req = urllib.request.Request(base + "/models", headers={"Authorization": f"Bearer {key}"} if key else {})
        with urllib.request.urlopen(req, timeout=timeout, context=None if tls is True else tls) as res:
            body, kind = res.read(2_000_000), res.headers.get_content_type()
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise InputError(f"model endpoint {base} refused the API key (HTTP {e.code}): set EVOLFORGE_API_KEY "
                             "(or OPENAI_API_KEY) to a key it accepts" + ("" if key else " (none is set)")) from None
        if e.code in (404, 405) and e.headers.get_content_type() == "text/html":
            raise InputError(not_openai.format(what=f"GET {base}/models: HTTP {e.code}, a web page")) from None
        return  # it answers (some servers have no /models): the flow's pre-flight probes every model
    except (urllib.error.URLError, OSError, ValueError) as e:
        if (problem := tls_problem(base, e)) is not None:
            raise InputError(problem) from None
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            if not isinstance(e, urllib.error.URLError):
                return  # connected, slow to answer: the flow's pre-flight decides with the full timeout
        raise InputError(f"model endpoint {base} is unreachable ({reason}); start it, fix --base-url "
                         "(gateway.base_url), or leave it empty to use the embedded model") from None
    served = _listed_models(body)
    if served is None:
        raise InputError(not_openai.format(what=f"GET {base}/models answered {kind}, not a model list"))
    if served and settings.gateway.check_model_list:
        problem = _model_problem(settings, base, served)
        if problem:
            raise InputError(problem)
