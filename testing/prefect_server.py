"""Real Prefect servers for tests: one for the deployment tests (`prefect_server`: a free loopback port, its own
PREFECT_HOME) and the test server of every test process (`TestServer`, `test_server_settings`)."""

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


def wait_healthy(api: str, proc: subprocess.Popen, log: Path, timeout: float, what: str,
                 poll: float = POLL_SECONDS) -> None:
    """Return once `api`/health answers 200; RuntimeError naming `what`, with the end of `log`, if `proc` exited
    or `timeout` seconds passed first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            how = "exited" if proc.poll() is not None else f"did not answer in {timeout:.0f} s"
            raise RuntimeError(f"{what} {how}:\n" + log.read_text(errors="replace")[-3000:])
        time.sleep(poll)


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
            wait_healthy(api, proc, log_path, startup_timeout, "the Prefect server")
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


# ---------------------------------------------------------------- the test server of a test process
def _template_path() -> Path:
    from importlib.metadata import version  # not `import prefect`: a worker may start its server before that

    root = Path(os.environ.get("EVOLFORGE_CACHE") or Path.home() / ".cache" / "evolforge")
    return root / "prefect-test-db" / f"prefect-{version('prefect')}.db"


def _keep_template(db_path: Path) -> None:
    """Copy the migrated database `db_path` (no run in it yet) to the template, by sqlite's online backup."""
    import sqlite3
    import tempfile

    template = _template_path()
    template.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=template.parent, suffix=".part")
    os.close(fd)
    try:
        with contextlib.closing(sqlite3.connect(db_path)) as src, contextlib.closing(sqlite3.connect(tmp)) as dst:
            src.backup(dst)
            dst.execute("pragma journal_mode=delete")  # one file, whole: no -wal beside it
        os.replace(tmp, template)  # several workers may take one at once: the last one stays
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _die_with_parent() -> None:  # in the child, before exec: SIGTERM when the test process dies
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


# The server as Prefect's `prefect_test_harness` starts it (Prefect's temporary server: uvicorn with Prefect's app,
# its services in the process, no UI), less the vacuum of events older than 90 days, which a test database never
# holds (0.8 s of CPU at each start, measured).
_SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               "PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED": "false"}


class TestServer:
    """The Prefect server of one test process (a pytest-xdist worker's session): the server Prefect's
    `prefect_test_harness` starts, on a free loopback port with a database of its own in `folder`, started by this
    class so that it starts in the background (the worker collects and runs its first tests meanwhile; `api()`
    waits for it) and so that the test process never imports Prefect's server code (1.7 s of CPU to import, measured
    alone; the whole start, server and settings, measured 7.8 to 9.0 s of CPU against 8.4 to 8.8 s for
    `prefect_test_harness`, within the noise: what it gains is the wait, not the CPU).

    Its database starts as a copy of one already migrated (about 6 s of CPU to start instead of 9, measured), kept
    per Prefect version under `$EVOLFORGE_CACHE or ~/.cache/evolforge/prefect-test-db/` and taken (sqlite's online
    backup) from the first server started without it, before any test ran on it. The server still migrates on
    start, so a copy from an older schema costs time, never correctness; delete the folder to take a new one."""

    __test__ = False  # not a pytest test class

    def __init__(self, folder: Path):
        from importlib.util import find_spec

        folder.mkdir(parents=True, exist_ok=True)
        self.db = folder / "prefect-test.db"
        self.fresh = not _template_path().is_file()  # no template yet: this server's database becomes it
        if not self.fresh:
            shutil.copyfile(_template_path(), self.db)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/api"
        self.log = folder / "server.log"
        env = {**os.environ, **_SERVER_ENV, "PREFECT_HOME": str(folder / "home"),
               "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{self.db}"}
        env.pop("PREFECT_API_URL", None)
        site = Path(find_spec("prefect").origin).parent.parent
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--app-dir", str(site), "--factory",
                 "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
                 "--log-level", "error", "--lifespan", "on"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent)
        self._up = False

    def api(self, timeout: float = 600) -> str:
        """The API URL once the server answers its health check (the template kept first, on a machine's first
        run); RuntimeError with the end of its log if it exited or has not answered after `timeout` s."""
        if not self._up:
            wait_healthy(self.url, self.proc, self.log, timeout, "the Prefect test server", poll=0.1)
            self._up = True
            if self.fresh:
                _keep_template(self.db)
                self.fresh = False
        return self.url

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def test_server_settings(api: str) -> Iterator[None]:
    """What `prefect_test_harness` does in the test process for its server: points this process's Prefect
    settings at `api` (and the process-wide settings context, which threads started before read), and at the end
    sends what the process's log and event workers still hold."""
    import inspect

    import prefect.context
    import prefect.settings
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    with prefect.settings.temporary_settings(updates={prefect.settings.PREFECT_API_URL: api}), \
            prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()):
        yield

        async def drain() -> None:
            try:
                result = APILogWorker.instance().drain()
                if inspect.isawaitable(result):
                    await result
            except RuntimeError:  # never started
                pass
            result = EventsWorker.drain_all()
            if inspect.isawaitable(result):
                await result

        run_coro_as_sync(drain())


test_server_settings.__test__ = False  # not a pytest test function
