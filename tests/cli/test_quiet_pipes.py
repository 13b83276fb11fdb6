"""A closed pipe is not an error: `evolforge status --out DIR | head` and `costs ... | head` end quietly (exit 141,
as a Unix tool killed by SIGPIPE; no traceback, no 'Exception ignored')."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from evolforge.storage.folder import StageFolder
from evolforge.storage.ledger import LedgerWriter


@pytest.fixture
def run_folder(tmp_path):
    folder = StageFolder(tmp_path / "run").ensure()
    folder.start_marker("evolve")
    writer = LedgerWriter(folder.ledger_dir, "run-1")
    for i in range(50):
        writer.record(stage="evolve", model=f"m{i}", task_id=f"t{i}", attempt=1, outcome="ok", prompt_tokens=10,
                      completion_tokens=5, cost_usd=0.0)
    writer.close()
    return folder.root


@pytest.mark.parametrize("argv", [("status", "--out", "{out}"), ("costs", "--out", "{out}", "--by", "model")],
                         ids=["status", "costs"])
def test_output_into_a_closed_pipe_ends_quietly(run_folder, argv):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes (what `| head` leaves once it has its lines)
    try:
        proc = subprocess.run([sys.executable, "-m", "evolforge.cli", *(a.format(out=run_folder) for a in argv)],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    finally:
        os.close(write)
    assert proc.returncode in (0, 141), proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
