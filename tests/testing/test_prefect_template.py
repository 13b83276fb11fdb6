"""The Prefect test server of a test process (testing/prefect_server.py `TestServer`): its database starts from a
migrated copy kept in the cache, it is started once per process and charged to no test, and a server that cannot
start is an error showing its log."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from evolforge.testing.prefect_server import _template_path


def test_the_harness_leaves_a_migrated_copy_with_no_run_in_it(prefect_harness):
    template = _template_path()
    assert template.is_file()
    with contextlib.closing(sqlite3.connect(f"file:{template}?immutable=1", uri=True)) as db:
        assert db.execute("pragma journal_mode").fetchone()[0] == "delete"  # the copy is one whole file
        assert db.execute("select count(*) from alembic_version").fetchone()[0] == 1
        assert db.execute("select count(*) from flow_run").fetchone()[0] == 0


def test_the_process_server_is_the_harness_api_and_charged_to_no_test(prefect_harness):
    import os

    from evolforge.testing.durations import SHARED_PIDS

    port = os.environ["PREFECT_API_URL"].rsplit(":", 1)[1].split("/")[0]
    servers = []
    for pid in SHARED_PIDS:
        with contextlib.suppress(OSError):
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if b"uvicorn" in argv and port.encode() in argv:
                servers.append(pid)
    assert len(servers) == 1  # the server behind PREFECT_API_URL, started once for the process's tests


def test_a_server_that_exits_is_an_error_with_its_log(tmp_path, monkeypatch):
    from evolforge.testing import prefect_server

    monkeypatch.setattr(prefect_server.sys, "executable", "/bin/false")  # the server process exits at once
    server = prefect_server.TestServer(tmp_path)
    try:
        with pytest.raises(RuntimeError, match="the Prefect test server exited"):
            server.api(timeout=60)
    finally:
        server.stop()
