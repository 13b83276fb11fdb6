"""The durations record of a test (`--durations-json`) carries the test's outcome: the worst of its phases."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_a_failed_call_is_recorded_failed_though_its_teardown_passed(tmp_path):
    (tmp_path / "test_probe.py").write_text(
        "import pytest\n"
        "def test_fails():\n    assert 1 == 2\n"
        "def test_passes():\n    pass\n"
        "def test_skips():\n    pytest.skip('no')\n")
    out = tmp_path / "d.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "evolforge.testing.durations", "--durations-json", str(out), "-o", "addopts=",
                           str(tmp_path / "test_probe.py")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    outcomes = {k.rsplit("::", 1)[1]: v["outcome"] for k, v in json.loads(out.read_text())["records"].items()}
    assert outcomes == {"test_fails": "failed", "test_passes": "passed", "test_skips": "skipped"}
