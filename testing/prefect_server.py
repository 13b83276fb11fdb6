"""Real Prefect servers for tests: one for the deployment tests (`prefect_server`: a free loopback port, its own
PREFECT_HOME) and the test harness of every test process (`prefect_test_harness_from_template`)."""

from __future__ import annotations

import contextlib
import os
import shutil
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


# ---------------------------------------------------------------- the test harness, from a migrated database
def _template_path() -> Path:
    import prefect

    root = Path(os.environ.get("EVOLFORGE_CACHE") or Path.home() / ".cache" / "evolforge")
    return root / "prefect-test-db" / f"prefect-{prefect.__version__}.db"


@contextlib.contextmanager
def prefect_test_harness_from_template(startup_timeout: float = 600) -> Iterator[None]:
    """Prefect's `prefect_test_harness` (a server on a free port with a database of its own), whose database starts
    as a copy of one already migrated: a test worker's server then starts in about 6 s of CPU instead of 9
    (measured: 5.5 to 6.1 s against 8.7 to 10.6 s for the server process on this 2-core machine).

    The copy is kept per Prefect version under `$EVOLFORGE_CACHE or ~/.cache/evolforge/prefect-test-db/`, taken
    (sqlite's online backup) from the first server started without it, before any test ran on it. The server
    still migrates on start, so a copy from an older schema costs time, never correctness; delete the folder to
    take a new one."""
    import sqlite3
    import tempfile

    import prefect.settings
    import prefect.testing.utilities as harness

    template = _template_path()
    make_temp = harness.mkdtemp

    def temp_dir_with_the_copy() -> str:
        folder = make_temp()
        if template.is_file():
            shutil.copyfile(template, Path(folder) / "prefect-test.db")
        return folder

    harness.mkdtemp = temp_dir_with_the_copy  # the harness names its database <mkdtemp()>/prefect-test.db
    try:
        with harness.prefect_test_harness(server_startup_timeout=startup_timeout):
            harness.mkdtemp = make_temp
            if not template.is_file():
                url = prefect.settings.PREFECT_SERVER_DATABASE_CONNECTION_URL.value()
                if url.startswith("sqlite") and "///" in url:
                    template.parent.mkdir(parents=True, exist_ok=True)
                    fd, tmp = tempfile.mkstemp(dir=template.parent, suffix=".part")
                    os.close(fd)
                    try:
                        with contextlib.closing(sqlite3.connect(url.split("///", 1)[1])) as src, \
                                contextlib.closing(sqlite3.connect(tmp)) as dst:
                            src.backup(dst)
                            dst.execute("pragma journal_mode=delete")  # one file, whole: no -wal beside it
                        os.replace(tmp, template)  # several workers may take one at once: the last one stays
                    finally:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(tmp)
            yield
    finally:
        harness.mkdtemp = make_temp
