"""What every command shares: the settings merge, the endpoint flags, running a flow with one clear error.

A user error (bad config, missing or unusable input, unwritable output folder, unreachable endpoint or refused
key, a changed run) is one line on stderr and exit status 2, no traceback (`--debug` shows it); the inputs are
checked (tasks/core/checks.py) before any Prefect server starts. A failed run says how to resume only when
it left checkpoints to resume from.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback

DEBUG = False  # --debug: tracebacks of user errors and failed runs
VERBOSE = False  # --verbose: every log line, warning and library report on the terminal (else in the run's log)


def add_endpoint_args(p) -> None:
    """--config, --base-url and --model, as every stage command takes them."""
    p.add_argument("--config", help="TOML config file (default: config/default.toml)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint (default: the embedded model)")
    p.add_argument("--model", help="model for every stage without its own model in the config")


def port_in_use(host: str, port: int) -> str | None:
    """Why a server cannot listen on host:port (the one line a command prints before its banner), or None."""
    import socket

    if not port:
        return None
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(info[0], info[1]) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT port is free
            s.bind(info[4])
    except OSError as e:
        return (f"cannot listen on {host}:{port}: {e.strerror or e} (choose another --port, or stop what listens "
                "there)")
    return None


def prefect_env() -> None:
    """Prefect's settings for a command: before Prefect is first imported (it reads them then)."""
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def prefect_defaults(params=None):
    """Prefect's settings for a command and the server it reports to (runner.prefect_server of the params'
    settings: a reused local server by default, see cli/prefect_server.py), as a context around the flow call
    (Prefect reads its settings when first imported: a server found later is applied as a settings context)."""
    prefect_env()
    from evolforge.cli.prefect_server import attach
    from evolforge.config.sections.runtime import RunnerSettings
    from evolforge.config.settings import ConfigError

    try:
        runner = params.settings().runner if hasattr(params, "settings") else RunnerSettings()
    except ConfigError:  # reported by the flow itself, in its own words
        runner = RunnerSettings(prefect_server="ephemeral")
    url = attach(runner.prefect_server, port=runner.prefect_port)
    if not url:
        return contextlib.nullcontext()
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: url})


def settings_or_exit(args, extra: dict | None = None):
    """Settings from --config, --base-url, --model and `extra`, merged as every flow merges them."""
    from evolforge.config.settings import ConfigError, load_settings
    from evolforge.tasks.core.params import EndpointParams, flags_of, leaves

    params = EndpointParams(config=getattr(args, "config", None), base_url=getattr(args, "base_url", None) or None,
                            model=getattr(args, "model", None))
    flags = {".".join(path): f"--{path[-1].replace('_', '-')}" for path in leaves(extra or {})}  # the command's
    try:
        settings = params.settings()  # the endpoint flags' own blame
        if not extra:
            return settings
        endpoint = {k: v for k, v in (("gateway", {"base_url": params.base_url} if params.base_url else None),
                                      ("models", {"default": params.model} if params.model else None)) if v}
        from evolforge.config.settings import deep_merge

        return load_settings(params.config, deep_merge(endpoint, extra),
                             flags={**flags_of(params, endpoint), **flags})
    except ConfigError:
        raise  # a user error: run_command prints it on one line (exit status 2)


def is_user_error(e: BaseException) -> bool:
    """An error the user fixes (input, config, endpoint, key): one line and exit 2, never a traceback."""
    from evolforge.cli.stage_args import ParamsError
    from evolforge.config.settings import ConfigError
    from evolforge.storage.folder import FolderOfAnotherStage
    from evolforge.storage.inputs import SeedFileError
    from evolforge.storage.locks import FolderLocked
    from evolforge.tasks.core.checks import InputError
    from evolforge.tasks.core.extras import MissingExtra
    from evolforge.tasks.core.keys import InsecureKeyTransport

    kinds: tuple[type, ...] = (ConfigError, InputError, SeedFileError, InsecureKeyTransport, ParamsError,
                               FolderOfAnotherStage, FolderLocked, MissingExtra)
    if "evolforge.storage.run_record" in sys.modules:  # loaded only by a run that got that far
        kinds += (sys.modules["evolforge.storage.run_record"].RunInputsChanged,)
    return isinstance(e, kinds)


def run_command(args) -> int:
    """Run the chosen command; a user error is one line on stderr and exit status 2.

    A command registered with `fast_exit=True` (run, retry) ends its process as soon as it is done when that
    process is the `evolforge` command itself (`fast_exit`); called in-process (tests, Python) it just returns."""
    global DEBUG, VERBOSE
    DEBUG = bool(getattr(args, "debug", False))
    VERBOSE = bool(getattr(args, "verbose", False)) or DEBUG
    from evolforge.tasks.core.stopping import RunStopped, requested

    try:
        code = args.fn(args)
    except RunStopped as e:  # a signal stopped the run (tasks/core/stopping.py): what finished is kept
        if DEBUG:
            traceback.print_exc()
        out = getattr(args, "out", None) or getattr(args, "dataset", None)
        again = f"; run the same command again to resume (evolforge status --out {out})" if out else ""
        print(f"\nevolforge {args.cmd}: {e}: finished calls are kept (journal and ledger){again}", file=sys.stderr)
        code = e.exit_code
    except KeyboardInterrupt:
        if DEBUG:
            traceback.print_exc()
        print(f"\nevolforge {args.cmd}: interrupted (Ctrl-C)", file=sys.stderr)
        code = 130
    except Exception as e:
        from evolforge.tasks.core.extras import missing_extra

        if not is_user_error(e) and missing_extra(e) is None:
            raise
        if DEBUG:
            traceback.print_exc()
        # a module of an optional extra not installed (pyproject.toml): the pip line that brings it
        print(f"evolforge {args.cmd}: {e if is_user_error(e) else missing_extra(e)}", file=sys.stderr)
        code = 2
    if requested() is not None and is_cli_process():
        fast_exit(code)  # stopped: the signal's watchdog ends the process if a thread is stuck in a cut-off call
    if getattr(args, "fast_exit", False) and is_cli_process():
        fast_exit(code)
    return code


def is_cli_process() -> bool:
    """This process is the `evolforge` command (console script or `python -m evolforge.cli`)."""
    from pathlib import Path

    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name in ("evolforge.cli.__main__", "evolforge.cli"):
        return True
    return Path(sys.argv[0]).name == "evolforge"


def fast_exit(code: int) -> None:
    """End the process now, skipping the interpreter's teardown of its ~3,000 modules (1 to 1.5 s on a 2-core
    machine, after the run is done): what a normal exit does first still runs, in the same order: waiting for
    non-daemon threads, then the atexit handlers (Prefect sends its last logs and events to the server,
    logging flushes and closes its handlers); then stdout and stderr are flushed. Everything a run writes is
    closed before the command returns (atomic parts, journals, ledger)."""
    import atexit

    shutdown = getattr(threading, "_shutdown", None)  # joins non-daemon threads, as Py_Finalize does first
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or broken pipe: nothing more to say
            pass
    os._exit(code if isinstance(code, int) else 1)


def failed(what: str, e: BaseException, out: str | None, log=None) -> int:
    """A run that failed after it started: one line, and the resume hint when checkpoints were left."""
    if is_user_error(e):
        raise e
    from evolforge.tasks.core.extras import missing_extra

    if (missing := missing_extra(e)) is not None:  # an import of an extra's module in the run: one line, exit 2
        raise missing from e
    if DEBUG:
        traceback.print_exc()
    where = f" (details: {log.path})" if log is not None and getattr(log, "path", None) else ""
    print(f"\nevolforge {what} failed: {e}{where}", file=sys.stderr)
    if out:
        from evolforge.storage.status import has_checkpoints

        if has_checkpoints(out):
            print(f"Checkpoints are kept in {out}; run the same command again to resume "
                  f"(evolforge status --out {out} shows what is done).", file=sys.stderr)
    return 1


SUMMARY_LINES = 16  # what the short summary shows at most (the whole summary is OUT/summary.json)


def _missing_file(value, out: str | None) -> bool:
    """`value` names a file inside the local output folder that does not exist (an end block leaves it out)."""
    if not out or not isinstance(value, str) or "://" in str(out):
        return False
    from pathlib import Path

    root = str(Path(out).expanduser().absolute())
    value = value.rstrip(".,:;)")  # a path at the end of a clause
    return value.startswith(root.rstrip("/") + "/") and not os.path.exists(value)


def short_summary(name: str, result, out: str | None, log=None) -> str:
    """The end of a stage command without its own `present`: its figures, one a line, and where the rest is."""
    lines = [f"== evolforge {name} complete =="]
    items = result.items() if isinstance(result, dict) else ()
    for key, value in items:
        if key in ("run_id", "out_dir") or len(lines) > SUMMARY_LINES:
            continue
        if _missing_file(value, out):
            continue  # a file the stage did not write (it kept nothing)
        if isinstance(value, (int, float, str, bool)) and len(str(value)) <= 100:
            lines.append(f"{key}: {value}")
        elif isinstance(value, dict) and value and len(value) <= 8 and all(
                isinstance(v, (int, float, str, bool)) or v is None for v in value.values()):
            value = {k: v for k, v in value.items() if not _missing_file(v, out)}
            text = ", ".join(f"{k}={v}" for k, v in value.items())
            if text and len(text) <= 160:
                lines.append(f"{key}: {text}")
    if out:
        lines.append(f"summary: {str(out).rstrip('/')}/summary.json")
    if log is not None and getattr(log, "path", None):
        lines.append(f"log: {log.path}")
    return "\n".join(lines)


def add_wait_arg(p) -> None:
    """--wait [SECONDS]: wait for another run over the same output folder to finish instead of refusing."""
    p.add_argument("--wait", nargs="?", type=float, const=float("inf"), default=0.0, metavar="SECONDS",
                   help="when another run writes to the output folder, wait for it to finish (for at most SECONDS) "
                        "instead of stopping at once")


def output_lock(out: str | None, wait: float = 0.0):
    """The output folder's run lock (storage/locks.py): one writer per folder, taken before Prefect starts and
    held until the command is done; another run holding it is one line naming it (exit 2), or waited for."""
    if not out:
        return contextlib.nullcontext()
    from evolforge.storage.fs import location
    from evolforge.storage.locks import run_lock

    return run_lock(location(out), wait=wait or 0.0)


def endpoint_line(name: str, params) -> str | None:
    """A run's first line: the endpoint and model it uses, and where the endpoint comes from (None: the stage
    calls no model, or its settings cannot be read: the flow reports that itself)."""
    from evolforge.config.settings import BASE_URL_ENV, ConfigError

    if not hasattr(params, "base_url"):
        return None
    try:
        settings = params.settings()
    except ConfigError:
        return None
    url = settings.gateway.base_url
    if not url:
        where = f"the embedded model {settings.embedded.alias} (on loopback; --base-url or {BASE_URL_ENV} names another)"
    else:
        source = ("--base-url" if params.base_url else f"{BASE_URL_ENV}"
                  if os.environ.get(BASE_URL_ENV, "").strip() == url else "gateway.base_url")
        where = f"{url} (from {source})"
    models = settings.models
    own = {role: getattr(models, role) for role in type(models).model_fields
           if role != "default" and getattr(models, role) and getattr(models, role) != models.default}
    extra = "; " + ", ".join(f"{role}: {m}" for role, m in own.items()) if own else ""
    return f"evolforge {name}: endpoint {where}, model {models.default}{extra}"


def run_stage(stage, params, wait: float = 0.0) -> int:
    """Run a registered stage's flow with live progress; print what the stage presents (else a short summary),
    or one clear line when it fails (with the resume hint when it left checkpoints). The output folder is locked
    for the whole run (`output_lock`)."""
    from evolforge.cli.progress import live_progress
    from evolforge.cli.terminal import quiet_terminal
    from evolforge.tasks.core.stopping import GRACE_SECONDS, reset, stop_on_signals

    prefect_env()
    out = stage.out_of(params)
    log = None
    reset()
    first = endpoint_line(stage.cli_name, params)
    if first:
        print(first, flush=True)
    with output_lock(out, wait), stop_on_signals(GRACE_SECONDS if is_cli_process() else None):
        try:
            with prefect_defaults(params), live_progress(), quiet_terminal(out, VERBOSE) as log:
                result = stage.load_flow()(params)
        except Exception as e:
            if type(e).__name__ != "KeptNothing":  # flows/_stage.py: the run failed, its summary is written
                return failed(stage.cli_name, e, out, log)
            result = e.summary
    if stage.present:
        text = "\n".join(line for line in stage.present(result, params).splitlines()
                         if not any(_missing_file(word, out) for word in line.split()))
        print(text + (f"\nlog: {log.path}" if log is not None and log.path else ""))
    else:
        print(short_summary(stage.cli_name, result, out, log))
    if line := rejected_rows(out):
        print(line)
    return kept_nothing(stage, result)


def rejected_rows(out: str | None) -> str | None:
    """The line saying how many input rows were rejected and where they are (OUT/rejects.jsonl), or None."""
    if not out:
        return None
    from evolforge.storage.fs import exists, location, read_text

    path = location(out) / "rejects.jsonl"
    try:
        n = sum(1 for line in read_text(path).splitlines() if line.strip()) if exists(path) else 0
    except (OSError, ValueError):
        return None
    return f"{n} input row{'s' if n != 1 else ''} rejected (not used; line and reason in {path})" if n else None


def kept_nothing(stage, result) -> int:
    """1, with one line saying so, when the stage kept nothing (its descriptor's `kept` count is 0), else 0."""
    if not (stage.kept and isinstance(result, dict) and result.get(stage.kept) == 0):
        return 0
    reasons = result.get("rejections") or {}
    top = "; ".join(f"{n} x {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:3])
    print(f"evolforge {stage.cli_name}: kept nothing ({stage.kept} = 0)" + (f"; rejected: {top}" if top else ""),
          file=sys.stderr)
    return 1


def run_flow(fn, params, out: str | None = None) -> int:
    """Run a stage flow with live progress; print its result, or one clear line when it fails."""
    from evolforge.cli.progress import live_progress
    from evolforge.cli.terminal import quiet_terminal

    log = None
    try:
        with prefect_defaults(params), live_progress(), quiet_terminal(out, VERBOSE) as log:
            result = fn(params)
    except Exception as e:
        return failed(fn.name, e, out, log)
    print(short_summary(fn.name, result, out, log))
    return 0
