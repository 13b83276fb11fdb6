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
    check_endpoint(settings)           a configured endpoint answers and accepts the key (one GET /models with
                                       a short timeout; a slow endpoint is left to the flow's pre-flight, which
                                       probes every model)

Imports stay light (no Prefect, no openai, no pyarrow for jsonl / csv inputs): a whole check costs about as
much as loading the settings.
"""

from __future__ import annotations

from evolforge.config.settings import Settings
from evolforge.storage.inputs import SeedFileError, first_usable_row, folder_problem, input_exists

ENDPOINT_TIMEOUT_SECONDS = 2.0


class InputError(ValueError):
    """A user error found before any work: the message names the input and the fix."""


def check_out_dir(out: str, what: str = "--out") -> None:
    problem = folder_problem(out)
    if problem:
        raise InputError(f"{problem} (choose another {what})")


def check_rows(path: str, field: str, what: str, max_chars: int | None = None,
               fallback_field: str | None = None) -> None:
    try:
        first_usable_row(path, field, max_chars, what, fallback_field)
    except SeedFileError as e:
        raise InputError(str(e)) from None


def check_file(path: str | None, what: str) -> None:
    if path and not input_exists(path):
        raise InputError(f"{what} not found: {path}")


def check_folder(path: str, what: str, marker: str | None = None, hint: str = "") -> None:
    """`path` is an existing folder (holding `marker`, when given)."""
    from evolforge.storage.fs import exists, location

    root = location(path)
    if not exists(root):
        raise InputError(f"{what} not found: {root}{hint}")
    if marker and not exists(root / marker):
        raise InputError(f"{what} {root} has no {marker}{hint}")


def check_endpoint(settings: Settings, timeout: float = ENDPOINT_TIMEOUT_SECONDS) -> None:
    """A configured endpoint answers and accepts the key (the embedded model is started by the run itself)."""
    if settings.uses_embedded_model:
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

    try:  # stdlib, not httpx: no client or TLS context to build for a plain-http endpoint
        req = urllib.request.Request(base + "/models", headers={"Authorization": f"Bearer {key}"} if key else {})
        with urllib.request.urlopen(req, timeout=timeout):
            return
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise InputError(f"model endpoint {base} refused the API key (HTTP {e.code}): set EVOLFORGE_API_KEY "
                             "(or OPENAI_API_KEY) to a key it accepts" + ("" if key else " (none is set)")) from None
        return  # it answers (some servers have no /models): the flow's pre-flight probes every model
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            if not isinstance(e, urllib.error.URLError):
                return  # connected, slow to answer: the flow's pre-flight decides with the full timeout
        raise InputError(f"model endpoint {base} is unreachable ({reason}); start it, fix --base-url "
                         "(gateway.base_url), or leave it empty to use the embedded model") from None


