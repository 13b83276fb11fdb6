"""A real Prefect server for deployment tests: started on a free loopback port with its own PREFECT_HOME."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

from evolforge.testing.net import free_port  # noqa: F401 - tests import it from here too

TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
POLL_SECONDS = 0.25  # how often the server's health and a run's state are asked for


@contextlib.contextmanager
def prefect_server(home: Path, startup_timeout: float = 180) -> Iterator[tuple[dict, str]]:
    """Start `prefect server start` in `home`; yields (environment for clients and workers, API URL)."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO"}
    log_path = Path(home) / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                 "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.time() + startup_timeout
            while True:
                try:
                    if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError("Prefect server exited: " + log_path.read_text()[-3000:])
                if time.time() > deadline:
                    raise RuntimeError(f"Prefect server did not start in {startup_timeout}s")
                time.sleep(POLL_SECONDS)
            yield env, api
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def run_state(api: str, run_id: str) -> str:
    return httpx.get(f"{api}/flow_runs/{run_id}", timeout=10).json()["state_type"]


def wait_for_run(api: str, run_id: str, timeout: float = 300) -> str:
    """The flow run's terminal state type; AssertionError when it is still running after `timeout`."""
    deadline = time.time() + timeout
    st = None
    while time.time() < deadline:
        st = run_state(api, run_id)
        if st in TERMINAL:
            return st
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"flow run {run_id} still {st} after {timeout}s")
