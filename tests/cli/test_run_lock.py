"""One writer per output folder: a run holds OUT/.evolforge.lock for its whole length (storage/locks.py run_lock);
a second run over the folder (run, retry, a stage command, the nightly chain, a flow started any other way) is
refused with one line naming the holder before any call is sent, or waits for it with --wait. A holder that
died leaves no lock (local: flock; remote: pid + host, heartbeat)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from evolforge.cli import main
from evolforge.storage.locks import RUN_LOCK, FolderLocked, holder_is_dead, run_lock
from evolforge.testing.scripted_server import ScriptedServer

pytestmark = pytest.mark.usefixtures("prefect_harness")

HOLD = """
import sys
from evolforge.storage.locks import run_lock
with run_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder():
    """Another process holding the run lock of a folder until the test ends (or `release()`)."""
    procs = []

    def hold(folder):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "held"
        procs.append(proc)
        return proc

    yield hold
    for proc in procs:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=30)


def release(proc) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture
def seeds(tmp_path):
    path = tmp_path / "seeds.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Add {i} and {i + 3}, then explain."}) + "\n"
                            for i in range(3)))
    return path


def test_a_second_holder_is_refused_naming_the_first_and_a_dead_holder_leaves_no_lock(tmp_path, holder):
    out = tmp_path / "out"
    proc = holder(out)
    with pytest.raises(FolderLocked, match=rf"in use by another run \(host {socket.gethostname()} pid {proc.pid}"):
        with run_lock(out):
            pass
    proc.kill()  # dies holding it: the OS releases a local lock
    proc.wait()
    with run_lock(out) as record:
        assert record["pid"] != proc.pid


def test_the_lock_waits_when_asked_and_leaves_no_folder_it_made_for_nothing(tmp_path, holder):
    out = tmp_path / "out"
    proc = holder(out)
    t0 = time.monotonic()
    with pytest.raises(FolderLocked, match="waited 0.5 s"):
        with run_lock(out, wait=0.5):
            pass
    assert time.monotonic() - t0 >= 0.5
    release(proc)
    assert not out.exists()  # the holder made it and wrote nothing else: gone with its lock
    with run_lock(out):
        (out / "data.txt").write_text("x")
    assert (out / "data.txt").exists() and (out / RUN_LOCK).read_text() == ""


def test_a_remote_lock_is_stale_when_its_holder_died_or_its_heartbeat_stopped(monkeypatch):
    from evolforge.storage import locks
    from evolforge.storage.fs import location

    root = location("memory://lock-test/out")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = {"host": socket.gethostname(), "pid": int(dead.stdout), "time": time.time(), "beat": time.time(),
             "since": "then", "token": "t-dead"}
    assert holder_is_dead(stale)
    assert holder_is_dead({"host": "elsewhere", "pid": 1, "beat": time.time() - 3600})
    assert not holder_is_dead({"host": "elsewhere", "pid": 1, "beat": time.time()})
    (root / RUN_LOCK).parent.mkdir(parents=True, exist_ok=True)
    (root / RUN_LOCK).write_bytes(json.dumps(stale).encode())
    with run_lock(root) as record:  # broken at once: its holder is gone
        assert record["pid"] != stale["pid"]
        locks._HELD.clear()  # as another process would see it: alive, beating
        with pytest.raises(FolderLocked, match="in use by another run"):
            with run_lock(root):
                pass


def test_a_second_run_over_the_folder_is_refused_before_any_call(tmp_path, seeds, holder, capsys):
    out = tmp_path / "out"
    proc = holder(out)
    with ScriptedServer() as srv:
        code = main(["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "1", "--base-url", srv.base_url,
                     "--model", "scripted"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert srv.posts() == []  # nothing paid twice
    assert err.startswith("evolforge run: ") and len(err.strip().splitlines()) == 1, err
    assert f"pid {proc.pid}" in err and "--wait" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ("retry", "--out", "{out}"),
    ("nightly", "--dataset", "{out}", "--seeds", "{seeds}", "--new"),
    ("synthesize", "--seeds", "{seeds}", "--out", "{out}", "--base-url", "{url}", "--model", "scripted"),
], ids=["retry", "nightly", "synthesize"])
def test_retry_nightly_and_stage_commands_take_the_same_lock(tmp_path, seeds, holder, capsys, argv, monkeypatch):
    out = tmp_path / "out"
    holder(out)
    with ScriptedServer() as srv:
        if argv[0] == "retry":  # a run to retry: its record names this endpoint
            out.mkdir(exist_ok=True)
            (out / "run.json").write_text(json.dumps({"seeds": str(seeds), "settings": {
                "gateway": {"base_url": srv.base_url}, "models": {"default": "scripted"}}}))
            argv = (*argv, "--base-url", "{url}")
        monkeypatch.setenv("EVOLFORGE__SYNTHESIS__BUDGET_USD_PER_TASK", "0")
        code = main([a.format(out=out, seeds=seeds, url=srv.base_url) for a in argv])
        err = capsys.readouterr().err
        assert srv.posts() == []
    assert code == 2, err
    assert "is in use by another run" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.long("a whole run through the command (the lock's wait itself: the quick test above)")
def test_with_wait_the_second_run_goes_on_once_the_first_ends(tmp_path, seeds, holder, capsys):
    out = tmp_path / "out"
    proc = holder(out)
    import threading

    threading.Timer(1.0, release, (proc,)).start()
    with ScriptedServer() as srv:
        code = main(["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "1", "--base-url", srv.base_url,
                     "--model", "scripted", "--wait", "120"])
    assert code == 0, capsys.readouterr().err
    assert (out / "dataset" / "evolved.parquet").exists()


def test_a_flow_started_without_the_cli_takes_the_lock_too(tmp_path, seeds, holder):
    from evolforge.flows.evolve import evolve_flow
    from evolforge.tasks.evolve.stage import EvolveParams

    out = tmp_path / "out"
    holder(out)
    with ScriptedServer() as srv:
        with pytest.raises(FolderLocked):
            evolve_flow(EvolveParams(seeds=str(seeds), out=str(out), rounds=1, base_url=srv.base_url,
                                     model="scripted"))
        assert srv.posts() == []
