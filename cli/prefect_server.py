"""The Prefect server a command reports to, and `evolforge server status|stop`.

PREFECT_API_URL set: that server. Otherwise, with `runner.prefect_server = "reuse"` (the default), a local server
on 127.0.0.1 that an earlier command started in the background and left running (its URL and pid in
PREFECT_HOME/evolforge-server.json), or, when there is none, one started now the same way: a small first run
waits for a server once, later runs reach their first model call at once, and the Prefect UI of every run stays
up afterwards. `ephemeral`: Prefect's own temporary server for this command only.
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
import urllib.request
from pathlib import Path

STATE_FILE = "evolforge-server.json"


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def _state_path() -> Path:
    return prefect_home() / STATE_FILE


def healthy(api_url: str, timeout: float = 1.0) -> bool:
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _start() -> dict:
    port = _free_port()
    home = prefect_home()
    prefect = Path(sys.executable).with_name("prefect")
    cmd = [str(prefect) if prefect.exists() else "prefect", "server", "start", "--host", "127.0.0.1",
           "--port", str(port), "--no-services", "--analytics-off"]
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    with open(home / "evolforge-server.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True)  # outlives this command; not in its process group
    state = {"url": f"http://127.0.0.1:{port}/api", "pid": proc.pid, "started": time.time(),
             "log": str(home / "evolforge-server.log")}
    _state_path().write_text(json.dumps(state))
    return state


def attach(mode: str, timeout: float = 120.0) -> str | None:
    """Point this process at the server to report to; the URL used, or None for Prefect's temporary server."""
    if os.environ.get("PREFECT_API_URL") or mode != "reuse":
        return os.environ.get("PREFECT_API_URL")
    started = False
    with _locked():
        state = read_state()
        if not (state and _alive(state.get("pid")) and healthy(state["url"], timeout=2.0)):
            if not (state and _alive(state.get("pid"))):  # else still starting (another command started it)
                state, started = _start(), True
        deadline = time.time() + timeout
        while not healthy(state["url"]):
            if not _alive(state["pid"]) or time.time() > deadline:
                raise RuntimeError(f"the local Prefect server did not start (log: {state.get('log')}); set "
                                   "runner.prefect_server = \"ephemeral\" or PREFECT_API_URL to use another")
            time.sleep(0.1)
    os.environ["PREFECT_API_URL"] = state["url"]
    if started:
        print(f"Prefect UI: {state['url'][:-4]}  (a local server started for this and later commands; "
              "`evolforge server stop` ends it)", file=sys.stderr, flush=True)
    return state["url"]


def stop() -> dict | None:
    """Stop the server `attach` started (its whole process group); None when there is none."""
    with _locked():
        state = read_state()
        if not state:
            return None
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
        return state


def cmd_server(args) -> int:
    if args.action == "stop":
        state = stop()
        print(f"stopped the local Prefect server at {state['url']}" if state else "no local Prefect server to stop")
        return 0
    state = read_state()
    if state and _alive(state.get("pid")) and healthy(state["url"]):
        print(f"local Prefect server: {state['url']} (UI: {state['url'][:-4]}) pid {state['pid']}")
        return 0
    print("no local Prefect server running (the next command starts one with runner.prefect_server = \"reuse\")")
    return 1


def register(sub) -> None:
    p = sub.add_parser("server", help="the local Prefect server commands report to (status, stop)")
    p.add_argument("action", choices=["status", "stop"])
    p.set_defaults(fn=cmd_server)
