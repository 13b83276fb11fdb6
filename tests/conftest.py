"""Test fixtures: an isolated Prefect home per session, the scripted server, settings helpers."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

_HOME = tempfile.mkdtemp(prefix="evolforge-prefect-home-")
os.environ.setdefault("PREFECT_HOME", _HOME)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
for _k in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY"):
    os.environ.pop(_k, None)

sys.path.insert(0, str(Path(__file__).parent))

from scripted_server import ScriptedServer  # noqa: E402


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


def make_settings(base_url: str = "", **sections):
    from evolforge.config.settings import load_settings

    overrides = {k: v for k, v in sections.items()}
    if base_url:
        overrides.setdefault("gateway", {})["base_url"] = base_url
    return load_settings(None, overrides, environ={})
