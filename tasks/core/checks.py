"""Fail fast: every stage's inputs checked before any work, in one place, with one clear message each.

The CLI runs these before a Prefect server starts (a user error costs well under a second and creates
nothing); each flow runs the same function first, so a run started from the Prefect UI stops with the same
message before it creates its output folder. A problem is an `InputError`: the message names the input and
the fix; the CLI prints it on one line and exits 2.

    check_evolve(seeds, out, settings)          evolve (run), pipeline, nightly's first night
    check_synthesize(seeds, out, settings)
    check_dedup(input, text_field, out)
    check_modules(input, out, settings)
    check_trajectories(proxy_out, out, rewards)
    check_reward_data(evolve_out, out, settings, kinds)
    check_train_reward(data, out, models)
    check_ppo(evolved, reward_dir, out, tasks)

What each checks: the input files exist and hold a usable row, the output folder can be created and
written (nothing is created), and, for the stages that call models on a configured endpoint, that the
endpoint answers and accepts the key (one GET /models with a short timeout; a slow endpoint is left to
the flow's pre-flight, which also probes every model). Imports stay light (no Prefect, no openai, no
pyarrow for jsonl / csv inputs): the whole check costs about as much as loading the settings.
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


def _seed_rows(path: str, settings: Settings, what: str) -> None:
    cfg = settings.input
    check_rows(path, cfg.instruction_field, what, cfg.max_chars)


def check_evolve(seeds: str, out: str, settings: Settings, endpoint: bool = True) -> None:
    _seed_rows(seeds, settings, "seed file")
    check_out_dir(out)
    if endpoint:
        check_endpoint(settings)


def check_synthesize(seeds: str, out: str, settings: Settings, endpoint: bool = True) -> None:
    _seed_rows(seeds, settings, "seed file")
    check_out_dir(out)
    if endpoint:
        check_endpoint(settings)


def check_dedup(input: str, text_field: str, out: str) -> None:
    check_rows(input, text_field, "input file")
    check_out_dir(out)


def check_modules(input: str, out: str, settings: Settings, endpoint: bool = True) -> None:
    check_rows(input, settings.modules.question_field, "question file", fallback_field="instruction")
    check_out_dir(out)
    if endpoint:
        check_endpoint(settings)


def check_trajectories(proxy_out: str, out: str, rewards: str | None = None) -> None:
    check_folder(proxy_out, "proxy folder", "records", " (pass the folder of a recording proxy: evolforge proxy --out)")
    check_file(rewards, "rewards file")
    check_out_dir(out)


def check_reward_data(evolve_out: str, out: str, settings: Settings, endpoint: bool = True) -> None:
    from evolforge.storage.layout import RunLayout

    evolved = RunLayout(evolve_out).evolved
    if not input_exists(evolved):
        raise InputError(f"{evolved} not found: pass the output folder of a finished evolve run (evolforge run --out)")
    check_out_dir(out)
    if endpoint:
        check_endpoint(settings)


def check_train_reward(data: str, out: str | None, models: list[str] | tuple[str, ...]) -> None:
    from evolforge.storage.reward_sets import RewardLayout

    lay = RewardLayout(data)
    needed = {"irm": lay.irm_pairs, "prm": lay.prm_steps}
    for kind in models:
        if not input_exists(needed[kind]):
            raise InputError(f"{needed[kind]} not found: pass the output folder of the reward-data stage "
                             f"(evolforge reward-data --out), or leave {kind} out of --models")
    check_out_dir(out or data)


def check_ppo(evolved: str, reward_dir: str, out: str, tasks: str | None = None) -> None:
    from evolforge.storage.fs import is_url
    from evolforge.storage.layout import RunLayout

    path = evolved
    if not is_url(evolved) and not str(evolved).endswith(".parquet"):
        path = str(RunLayout(evolved).evolved)  # an evolve run's output folder
    if not input_exists(path):
        raise InputError(f"{path} not found: pass an evolve run's dataset/evolved.parquet or its output folder")
    check_folder(reward_dir, "reward folder", None, " (pass the train-reward stage's output folder)")
    folder = str(tasks).rstrip("/")
    if tasks and not input_exists(tasks) and not any(  # the tasks table (data/), or an older run's tasks.parquet
            input_exists(f"{folder}/{name}") for name in ("data/train-00000-of-00001.parquet", "tasks.parquet")):
        raise InputError(f"synthesis tasks not found: {tasks} (pass the synthesis output folder or its tasks table, "
                         "data/train-00000-of-00001.parquet)")
    check_out_dir(out)
