"""Test fixtures: an isolated Prefect home per session, the scripted server, settings helpers."""

from __future__ import annotations

import os
import tempfile

import pytest

_HOME = tempfile.mkdtemp(prefix="evolforge-prefect-home-")
os.environ.setdefault("PREFECT_HOME", _HOME)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# commands run by tests use Prefect's temporary server, never a background one that would outlive the test
# (tests/test_prefect_server_reuse.py covers the reused server and stops it)
os.environ.setdefault("EVOLFORGE__RUNNER__PREFECT_SERVER", "ephemeral")
for _k in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY"):
    os.environ.pop(_k, None)


from evolforge.testing.scripted_server import ScriptedServer  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if os.environ.get("EVOLFORGE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow end-to-end test: set EVOLFORGE_SLOW=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def server():
    with ScriptedServer(hang_seconds=3.0) as srv:
        yield srv


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A real Prefect server (its own home and port) for the deployment tests: (env, api)."""
    from evolforge.testing.prefect_server import prefect_server as start

    with start(tmp_path_factory.mktemp("prefect-home")) as env_api:
        yield env_api
