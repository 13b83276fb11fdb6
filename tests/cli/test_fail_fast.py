"""Fail fast: a user error of any long command is found before a Prefect server starts, printed as one line (no
traceback unless --debug), exit status 2, and the output folder is not created. The resume hint appears only
when there are checkpoints to resume from. How long that takes is measured by bench/bench_fail_fast.py (a
benchmark beside its reference, not a timed test: on a loaded machine a fresh interpreter's start alone varies
by seconds)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from evolforge.testing.net import SERVE_POLL

SCRIPT = Path(sys.executable).with_name("evolforge")


def evolforge(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """The installed command in a fresh process, timed from start to exit."""
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "evolforge.cli"]
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("EVOLFORGE") and k not in ("OPENAI_API_KEY", "PREFECT_API_URL")}
    full_env.update(env or {})
    t0 = time.perf_counter()
    proc = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120, env=full_env)
    return proc, time.perf_counter() - t0


fails_fast = evolforge


def assert_user_error(proc, elapsed: float, out: Path, says: str, lines: int = 1) -> None:
    """`elapsed` is not judged here (see the module's docstring)."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text, text
    assert says in proc.stderr, proc.stderr
    assert proc.stderr.startswith("evolforge") and len(proc.stderr.strip().splitlines()) <= lines, proc.stderr
    assert "Checkpoints are kept" not in text and "Prefect" not in text and "temporary server" not in text
    assert not out.exists(), "the output folder was created although nothing ran"


@pytest.fixture
def seeds(tmp_path) -> Path:
    path = tmp_path / "seeds.jsonl"
    path.write_text(json.dumps({"instruction": "Add 2 and 3, then explain why."}) + "\n")
    return path


def test_missing_seed_file(tmp_path):
    out = tmp_path / "out"
    proc, elapsed = fails_fast("run", "--seeds", str(tmp_path / "nope.jsonl"), "--out", str(out))
    assert_user_error(proc, elapsed, out, "seed file not found")


def test_seed_file_without_a_usable_row(tmp_path):
    bad = tmp_path / "seeds.jsonl"
    bad.write_text('{"prompt": "the text sits in another column"}\nnot json at all\n{"prompt": ""}\n')
    out = tmp_path / "out"
    proc, elapsed = fails_fast("run", "--seeds", str(bad), "--out", str(out))
    assert_user_error(proc, elapsed, out, "no usable row in seed file")
    assert "input.instruction_field" in proc.stderr  # names the fix

    empty = tmp_path / "empty.csv"
    empty.write_text("instruction,id\n   ,1\n,2\n")
    proc, elapsed = fails_fast("run", "--seeds", str(empty), "--out", str(out))
    assert_user_error(proc, elapsed, out, "every 'instruction' is empty")


def test_bad_config(tmp_path, seeds):
    out = tmp_path / "out"
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[evol_instruct]\nrounds = "many"\n')
    proc, elapsed = fails_fast("run", "--seeds", str(seeds), "--out", str(out), "--config", str(cfg))
    assert_user_error(proc, elapsed, out, "evol_instruct.rounds")  # the key, the problem and the file: one line
    assert str(cfg) in proc.stderr
    cfg.write_text("this is = not [toml\n")
    proc, elapsed = fails_fast("run", "--seeds", str(seeds), "--out", str(out), "--config", str(cfg))
    assert_user_error(proc, elapsed, out, "not valid TOML")


def test_unwritable_output_folder(tmp_path, seeds):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = blocker / "out"  # its parent is a file: cannot be created
    proc, elapsed = fails_fast("run", "--seeds", str(seeds), "--out", str(out))
    assert_user_error(proc, elapsed, out, "is not a folder")
    # a folder the user cannot write to (root writes anywhere: /proc stands in as a folder nobody can write)
    if os.geteuid() == 0:
        out = Path("/proc/evolforge-out")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        out = locked / "out"
    proc, elapsed = fails_fast("run", "--seeds", str(seeds), "--out", str(out))
    assert_user_error(proc, elapsed, out, "is not writable")


def test_unreachable_endpoint_and_refused_key(tmp_path, seeds):
    out = tmp_path / "out"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    proc, elapsed = fails_fast("run", "--seeds", str(seeds), "--out", str(out), "--base-url", dead)
    assert_user_error(proc, elapsed, out, "is unreachable")

    class Refuse(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": SERVE_POLL}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
        key = "sk-test-secret-key-123456"
        proc, elapsed = fails_fast("run", "--seeds", str(seeds), "--out", str(out), "--base-url", url,
                                  env={"EVOLFORGE_API_KEY": key})
        assert_user_error(proc, elapsed, out, "refused the API key (HTTP 401)")
        assert key not in proc.stdout + proc.stderr
    finally:
        srv.shutdown()


def test_debug_shows_the_traceback(tmp_path):
    out = tmp_path / "out"
    for argv in (["--debug", "run"], ["run", "--debug"]):
        proc, _ = evolforge(*argv, "--seeds", str(tmp_path / "nope.jsonl"), "--out", str(out))
        assert proc.returncode == 2 and "Traceback" in proc.stderr and "seed file not found" in proc.stderr
        assert not out.exists()


@pytest.mark.parametrize("argv, says", [
    (["synthesize", "--seeds", "{tmp}/nope.jsonl"], "seed file not found"),
    (["pipeline", "--seeds", "{tmp}/nope.jsonl"], "seed file not found"),
    (["dedup", "--input", "{tmp}/bad.jsonl", "--text-field", "text"], "no row has the field 'text'"),
    (["modules", "--input", "{tmp}/bad.jsonl"], "no usable row in question file"),
    (["trajectories", "--proxy-out", "{tmp}/no-proxy"], "proxy folder not found"),
    (["reward-data", "--evolve-out", "{tmp}/no-run"], "pass the output folder of a finished evolve run"),
    (["train-reward", "--data", "{tmp}/no-data", "--models", "prm"], "prm_steps.parquet not found"),
    (["ppo", "--evolved", "{tmp}/no-run", "--reward-dir", "{tmp}"], "evolved.parquet not found"),
])
def test_every_long_command_fails_fast(tmp_path, argv, says):
    (tmp_path / "bad.jsonl").write_text('{"other": 1}\n')
    out = tmp_path / "out"
    args = [a.format(tmp=tmp_path) for a in argv]
    args += ["--out", str(out)]
    proc, elapsed = evolforge(*args)
    assert_user_error(proc, elapsed, out, says)


def test_retry_of_a_missing_run(tmp_path):
    proc, _ = evolforge("retry", "--out", str(tmp_path / "none"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "run.json missing" in proc.stderr


def test_resume_hint_only_when_there_is_something_to_resume(tmp_path, capsys):
    from evolforge.cli.common import failed
    from evolforge.storage.layout import RunLayout

    out = tmp_path / "out"
    out.mkdir()
    assert failed("run", RuntimeError("endpoint went away"), str(out)) == 1
    err = capsys.readouterr().err
    assert "endpoint went away" in err and "Checkpoints are kept" not in err

    part = RunLayout(out).part(1, 0)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"PAR1")
    assert failed("run", RuntimeError("endpoint went away"), str(out)) == 1
    err = capsys.readouterr().err
    assert f"Checkpoints are kept in {out}" in err and "evolforge status" in err
