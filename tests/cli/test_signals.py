"""Signals stop a run (tasks/core/stopping.py): the first SIGINT or SIGTERM sends no new call, cuts the calls in
flight, keeps what finished (journal and ledger: a cut-off call is a `cancelled` ledger row), marks the run
stopped and exits 130 / 143, long before the endpoint's slow calls would have answered; a resumed run repeats no
finished call. A SIGINT inherited as ignored (a background job) stays ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolforge.testing.scripted_server import ScriptedServer

pytestmark = pytest.mark.usefixtures("prefect_harness")

HANG = 90.0  # what every slow call takes: a run that waited for its calls would take at least this long


@pytest.fixture(autouse=True)
def _no_stop_left_behind():
    """The in-process test stops its own process's run: the stop must not outlive it (a flow called directly later on
    the same test worker, not through the CLI, which resets it, would stop at once)."""
    from evolforge.tasks.core import stopping

    yield
    stopping.reset()


@pytest.fixture
def seeds(tmp_path):
    path = tmp_path / "seeds.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Add {i} and {i + 3}, then explain."}) + "\n"
                            for i in range(6)))
    return path


def start_run(seeds: Path, out: Path, url: str, ignore_sigint: bool = False) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY")}
    env["EVOLFORGE__GATEWAY__BACKOFF_BASE_SECONDS"] = "0"
    # MinHash dedup only: the embedding model's load (torch, sentence-transformers: ~4 s of CPU per command) is
    # not what a signal test is about; the dedup tests cover that stage's resume
    env["EVOLFORGE__DEDUP__EMBEDDING"] = "false"
    pre = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    return subprocess.Popen([sys.executable, "-m", "evolforge.cli", "run", "--seeds", str(seeds), "--out", str(out),
                             "--rounds", "1", "--base-url", url, "--model", "scripted"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=pre)


def wait_for(cond, timeout: float = 240.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended first: {proc.returncode}\n{proc.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def ledger_rows(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((out / "ledger").glob("*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]


def in_flight(srv: ScriptedServer) -> int:
    with srv.lock:
        return sum(1 for r in srv.requests if r["action"] == "hang")


def test_a_signal_stops_the_run_long_before_its_calls_answer_and_keeps_what_finished(tmp_path, seeds, capsys):
    """In-process (the command's main thread gets the signal): the graceful path, without the forced exit."""
    import threading

    from evolforge.cli import main

    out = tmp_path / "out"
    argv = ["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "1", "--base-url", "{url}", "--model",
            "scripted", "--config", str(fast_config(tmp_path))]
    with ScriptedServer(default="hang", hang_seconds=HANG) as srv:
        srv.script(*["ok"] * 3)  # three calls answer, every later one hangs
        signalled: list[float] = []

        def send() -> None:
            wait_for(lambda: in_flight(srv) >= 2)
            time.sleep(0.3)
            signalled.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=send, daemon=True).start()
        code = main([a.format(url=srv.base_url) for a in argv])
        stopped_after = time.monotonic() - signalled[0]
        err = capsys.readouterr().err
        assert code == 143, err[-3000:]
        assert stopped_after < HANG / 3, stopped_after
        assert "stopped by SIGTERM" in err and "finished calls are kept" in err, err[-3000:]
        rows = ledger_rows(out)
        assert sum(1 for r in rows if r["outcome"] == "ok" and r["stage"] != "preflight") == 3, rows
        assert sum(1 for r in rows if r["outcome"] == "cancelled") == in_flight(srv), rows
        journaled = [json.loads(line) for f in out.rglob("journal/*.jsonl") for line in f.read_text().splitlines()
                     if line.strip()]
        assert len(journaled) == 3  # what a resume replays instead of sending (the long test below resumes)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the command's handlers are gone


def fast_config(tmp_path: Path) -> Path:
    path = tmp_path / "fast.toml"
    path.write_text("[gateway]\nbackoff_base_seconds = 0.0\n")
    return path


@pytest.mark.long("two `evolforge run` processes (~12 s CPU): what only a process shows (its exit status, a SIGINT "
                  "inherited as ignored)")
def test_sigint_inherited_as_ignored_stays_ignored_sigterm_stops_and_resume_repeats_nothing(tmp_path, seeds):
    out = tmp_path / "out"
    with ScriptedServer(default="hang", hang_seconds=HANG) as srv:
        srv.script(*["ok"] * 3)
        proc = start_run(seeds, out, srv.base_url, ignore_sigint=True)
        try:
            wait_for(lambda: in_flight(srv) >= 1, proc=proc)
            proc.send_signal(signal.SIGINT)
            time.sleep(2.0)
            assert proc.poll() is None  # a background job's Ctrl-C does not reach it
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=HANG)
            stopped_after = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 143, err[-3000:]
        assert stopped_after < HANG / 3 and "Traceback" not in err, err[-3000:]
        sent_before = len(srv.requests)
        answered = {r["key"] for r in srv.requests if r["action"] == "ok"}
        assert answered

        srv.default = "ok"  # resume: every call answers
        again = start_run(seeds, out, srv.base_url)
        _, err2 = again.communicate(timeout=600)
        assert again.returncode == 0, err2[-3000:]
        repeated = [r for r in srv.requests[sent_before:] if r["key"] in answered]
        assert repeated == []  # a finished call is replayed from the journal, never sent again


def test_a_second_signal_exits_at_once(tmp_path, seeds):
    out = tmp_path / "out"
    with ScriptedServer(default="hang", hang_seconds=HANG) as srv:
        proc = start_run(seeds, out, srv.base_url)
        try:
            wait_for(lambda: in_flight(srv) >= 1, proc=proc)
            proc.send_signal(signal.SIGINT)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=HANG)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
