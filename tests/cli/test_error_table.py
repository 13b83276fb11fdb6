"""Every user error of the command line (testing/error_table.py ROWS): the exit status, the one line naming the
problem and its fix, no traceback before or after Prefect starts, and no output folder made. Rows run in-process
where they stop before Prefect, in a fresh `evolforge` process where they stop after it started, and as a server
process given Ctrl-C once its banner is out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolforge.cli import main
from evolforge.testing.error_table import ROWS, Case, prepared, troubleshooting_markdown


def _cli(env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    full = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "EVOLFORGE_API_KEY", "OPENAI_API_KEY")}
    full.update(env)
    return [sys.executable, "-m", "evolforge.cli"], full


def _interrupt(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Start the server command, wait for its banner, press Ctrl-C (SIGINT), and collect what it printed."""
    cmd, full = _cli(env)
    proc = subprocess.Popen(cmd + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full)
    try:
        first = proc.stdout.readline()  # the banner ("... on http://HOST:PORT ...")
        assert first, proc.stderr.read()
        time.sleep(1.0)  # the server binds after the banner
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, first + out, err


@pytest.mark.parametrize("case", ROWS, ids=lambda c: c.id)
def test_user_error(case: Case, tmp_path, capsys, monkeypatch):
    with prepared(case, tmp_path) as values:
        argv = [a.format(**values) for a in case.argv]
        env = {k: v.format(**values) for k, v in case.env.items()}
        if case.how == "inprocess":
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            code = main(argv)
            captured = capsys.readouterr()
            out, err = captured.out, captured.err
        elif case.how == "subprocess":
            cmd, full = _cli(env)
            proc = subprocess.run(cmd + argv, capture_output=True, text=True, timeout=300, env=full)
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        else:
            code, out, err = _interrupt(argv, env)
        says = case.says.format(**values)
    text = out + err
    assert code == case.code, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    if case.lines is not None:
        assert says in err, err
        assert len(err.strip().splitlines()) == case.lines, err
        if case.lines:
            assert err.startswith("evolforge"), err
    else:
        assert says in text, text
    if "{out}" in case.argv:
        assert not Path(values["out"]).exists(), f"{values['out']} was created"


def test_every_row_has_a_fix_and_a_unique_id():
    assert len({c.id for c in ROWS}) == len(ROWS)
    assert all(c.fix.strip() for c in ROWS)
    page = troubleshooting_markdown()
    assert page.count("\n") == len(ROWS) + 1 and "--force-settings" in page
