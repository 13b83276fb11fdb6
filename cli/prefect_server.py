"""The Prefect server a command reports to, and `evolforge server status|stop`.

PREFECT_API_URL set: that server. Otherwise, with `runner.prefect_server = "reuse"` (the default), a local server
on 127.0.0.1 that an earlier command started in the background and left running (its URL and pid in
PREFECT_HOME/evolforge-server.json), or, when there is none, one started now the same way: a small first run
waits for a server once, later runs reach their first model call at once, and the Prefect UI of every run stays
up afterwards. `ephemeral`: Prefect's own temporary server for this command only.

The server is started on `runner.prefect_port` (4200, Prefect's own default) when that port is free, else on the
next free port above it (the line `Prefect UI: URL` says which), so the UI's address stays the same across
restarts. Its UI is told its own API address (PREFECT_UI_API_URL, which the server hands the UI at /ui-settings;
left unset, Prefect derives it from PREFECT_SERVER_API_PORT, not from `--port`, and the UI looks for an API on
4200 that is not there), and so are the links Prefect prints ("View at ..."). It runs Prefect's services (a
server started with --no-services records no task runs: its UI shows a run without them, and its scheduler runs
the deployments of `evolforge deploy`). A running server whose UI names another API address (started by an older
evolforge) is restarted on the next command.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

STATE_FILE = "evolforge-server.json"
DEFAULT_PORT = 4200  # runner.prefect_port's default: Prefect's own, where its docs and users look first
PORT_SPAN = 100  # ports tried from the preferred one up before any free port is taken
START_ATTEMPTS = 3  # a port taken between the check and the server's bind: the next one is tried


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def _state_path() -> Path:
    return prefect_home() / STATE_FILE


def healthy(api_url: str, timeout: float = 1.0) -> bool:
    import urllib.request  # here: 0.1 s of every command's start (ssl, http.client) otherwise

    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


def read_state() -> dict | None:
    try:
        return json.loads(_state_path().read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (OSError, TypeError):
        return False


def ui_api_url(api_url: str, timeout: float = 2.0) -> str | None:
    """The API address the server's UI is told to use (its /ui-settings), None when it does not say."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')[:-4]}/ui-settings", timeout=timeout) as r:
            return json.loads(r.read()).get("api_url")
    except (OSError, ValueError, AttributeError):
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on host:port (and it may be bound)."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int = DEFAULT_PORT, skip: tuple[int, ...] = ()) -> int:
    """`preferred` when free, else the next free port of the PORT_SPAN above it, else any free port (0: any)."""
    if preferred:
        for port in range(preferred, min(preferred + PORT_SPAN, 65536)):
            if port not in skip and port_free(port):
                return port
    return _free_port()


@contextlib.contextmanager
def _locked():
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / (STATE_FILE + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def server_env(port: int, host: str = "127.0.0.1") -> dict[str, str]:
    """The environment of a server on host:port whose UI and printed links name that server."""
    api = f"http://{host}:{port}/api"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_URL")}
    env.update(PREFECT_SERVER_API_HOST=host, PREFECT_SERVER_API_PORT=str(port), PREFECT_UI_API_URL=api,
               PREFECT_UI_URL=api[:-4], PREFECT_SERVER_ANALYTICS_ENABLED="false")
    return env


def _start(port: int) -> dict:
    home = prefect_home()
    prefect = Path(sys.executable).with_name("prefect")
    cmd = [str(prefect) if prefect.exists() else "prefect", "server", "start", "--host", "127.0.0.1",
           "--port", str(port), "--analytics-off"]  # with its services: the task run recorder fills the UI
    with open(home / "evolforge-server.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=server_env(port),
                                start_new_session=True)  # outlives this command; not in its process group
    state = {"url": f"http://127.0.0.1:{port}/api", "pid": proc.pid, "started": time.time(),
             "log": str(home / "evolforge-server.log")}
    _state_path().write_text(json.dumps(state))
    return state


def _stop_state(state: dict) -> None:
    """End the server of `state` (its whole process group) and forget it."""
    if _alive(state.get("pid")):
        with contextlib.suppress(OSError):
            os.killpg(state["pid"], signal.SIGTERM)
        deadline = time.time() + 20
        while _alive(state["pid"]) and time.time() < deadline:
            time.sleep(0.1)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(state["pid"], os.WNOHANG)
        if _alive(state["pid"]):
            with contextlib.suppress(OSError):
                os.killpg(state["pid"], signal.SIGKILL)
    _state_path().unlink(missing_ok=True)


class PrefectServerError(RuntimeError):
    """The local Prefect server could not be started: one line naming its log and the ways around it."""


def _wait_healthy(state: dict, deadline: float) -> bool:
    """Wait until the server of `state` answers; False when its process ended first."""
    while not healthy(state["url"]):
        if not _alive(state["pid"]):
            return False
        if time.time() > deadline:
            raise PrefectServerError(f"the local Prefect server did not start in time (log: {state.get('log')}); set "
                                     "runner.prefect_server = \"ephemeral\" or PREFECT_API_URL to use another")
        time.sleep(0.1)
    return True


def attach(mode: str, timeout: float = 120.0, port: int = DEFAULT_PORT) -> str | None:
    """Point this process at the server to report to; the URL used, or None for Prefect's temporary server.

    `port`: where a server started now listens when it is free (else the next free port above it)."""
    if os.environ.get("PREFECT_API_URL") or mode != "reuse":
        return os.environ.get("PREFECT_API_URL")
    started = False
    with _locked():
        state = read_state()
        deadline = time.time() + timeout
        if state and _alive(state.get("pid")) and healthy(state["url"], timeout=2.0) \
                and ui_api_url(state["url"]) not in (None, state["url"]):
            _stop_state(state)  # an older evolforge's server: its UI looks for an API elsewhere
            state = None
        if not (state and _alive(state.get("pid")) and healthy(state["url"], timeout=2.0)):
            # else still starting (another command started it): wait for it below
            if not (state and _alive(state.get("pid")) and _wait_healthy(state, deadline)):
                tried: tuple[int, ...] = ()
                for _ in range(START_ATTEMPTS):
                    state, started = _start(pick_port(port, tried)), True
                    if _wait_healthy(state, deadline):
                        break
                    tried += (int(state["url"].rsplit(":", 1)[1].split("/")[0]),)  # lost its port: the next one
                else:
                    _state_path().unlink(missing_ok=True)
                    raise PrefectServerError(f"the local Prefect server did not start (log: {state.get('log')}); set "
                                             "runner.prefect_server = \"ephemeral\" or PREFECT_API_URL to use another")
    os.environ["PREFECT_API_URL"] = state["url"]
    ui = state["url"][:-4]
    os.environ["PREFECT_UI_URL"] = ui  # the "View at" links Prefect prints
    if started:
        where = "" if ui.endswith(f":{port}") or not port else f"; port {port} was taken"
        print(f"Prefect UI: {ui}  (a local server started for this and later commands{where}; "
              "`evolforge server stop` ends it)", file=sys.stderr, flush=True)
    return state["url"]


def stop() -> dict | None:
    """Stop the server `attach` started (its whole process group); None when there is none."""
    with _locked():
        state = read_state()
        if not state:
            return None
        _stop_state(state)
        return state


def cmd_server(args) -> int:
    if args.action == "stop":
        state = stop()
        print(f"stopped the local Prefect server at {state['url']}" if state else "no local Prefect server to stop")
        return 0
    state = read_state()
    if state and _alive(state.get("pid")) and healthy(state["url"]):
        print(f"local Prefect server: {state['url']} (UI: {state['url'][:-4]}) pid {state['pid']}")
        print(f"point the prefect CLI at it: export PREFECT_API_URL={state['url']}")
        return 0
    print("no local Prefect server running (the next command starts one with runner.prefect_server = \"reuse\")")
    return 1


def register(sub) -> None:
    p = sub.add_parser("server", help="the local Prefect server commands report to (status, stop)")
    p.add_argument("action", choices=["status", "stop"])
    p.set_defaults(fn=cmd_server)
