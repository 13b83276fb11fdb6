"""The deployment path under a hard kill: a real Prefect server, `evolforge deploy`, a process work pool worker.

The worker (and the flow-run subprocess it spawned) is SIGKILLed mid-batch. A fresh worker then runs the
deployment again - `prefect flow-run retry` when Prefect left the killed run FAILED/CRASHED, otherwise (the
run is orphaned in RUNNING: nothing is left alive to report the crash) a new `prefect deployment run` over
the same output folder, the documented resume path. The finished run holds every seed record exactly once,
no call journaled before the kill reached the model endpoint again, and its artifacts are readable via the
API. The CLI counterpart is tests/flows/test_resume_kill.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import polars as pl
import pytest

from evolforge.storage.layout import RunLayout
from evolforge.testing.prefect_server import TERMINAL
from evolforge.testing.prefect_server import run_state as _state
from evolforge.testing.prefect_server import wait_for_run as _wait
from evolforge.testing.scripted_server import ScriptedServer, reply_for

pytestmark = pytest.mark.slow

POOL = "evolforge-kill-pool"
N_SEEDS, BATCH = 32, 4  # 8 batches of one round; 2 batches x 2 records in flight, 3 calls of 0.4 s per record
LATENCY = 0.4
MIN_JOURNALED = 4  # kill once unfinished batches hold this many journaled calls (and one batch is finished)


class _Gate:
    """Holds the server's replies while the test looks at (and kills) the run, so no batch can finish between
    the check and the kill. `release(drop=True)` closes the held connections unanswered (their client is dead)."""

    def __init__(self):
        self._open = threading.Event()
        self._open.set()
        self.drop = False

    def hold(self) -> None:
        self.drop = False
        self._open.clear()

    def release(self, drop: bool = False) -> None:
        self.drop = drop
        self._open.set()

    def wait(self) -> bool:
        """Block while held; True when the held reply is to be dropped."""
        if self._open.is_set():
            return False
        self._open.wait()
        return self.drop


def _unique_replies(srv: ScriptedServer, gate: _Gate) -> None:
    """Make every reply text unique per prompt (the judge's 'Not Equal' gets the prompt's hash), and log it
    on the request entry, so a journaled response can be matched to the request that produced it. Replies
    wait at `gate` while it is held."""
    base = srv.httpd.RequestHandlerClass

    class Handler(base):
        def _act(self, action, body, entry):
            if gate.wait():
                entry["action"] = "dropped"
                return super()._act("close", body, entry)
            if action == "ok":
                msgs = body.get("messages") or [{}]
                prompt = str(msgs[-1].get("content", ""))
                text = reply_for(body, srv.judge_verdict)
                if "Your Judgement" in prompt:
                    text = f"{text} (judged {hashlib.sha1(prompt.encode()).hexdigest()[:10]})"
                entry["text"] = text
                action = "text:" + text
            return super()._act(action, body, entry)

    srv.httpd.RequestHandlerClass = Handler


def _start_worker(env: dict, log: Path) -> subprocess.Popen:
    fh = open(log, "a")
    return subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL], env=env,
                            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def _deployment_run(env: dict, params: dict) -> str:
    run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "evolve/evolve",
                          "--param", f"params={json.dumps(params)}"], env=env, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    return re.search(r"UUID: ([0-9a-f-]{36})", run.stdout).group(1)


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a live process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live descendant of `root` (as `ps` would show them)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _proc_stat(int(d.name))):
            children.setdefault(st[1], []).append(int(d.name))
    found, todo = {}, [root]
    while todo:
        for c in children.get(todo.pop(), []):
            try:
                found[c] = Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                found[c] = "?"
            todo.append(c)
    return found


def _alive(pid: int) -> bool:
    st = _proc_stat(pid)
    return st is not None and st[0] != "Z"


def _journal_texts(lay: RunLayout) -> dict[int, list[str]]:
    """batch -> response texts journaled so far in round 1 (complete lines only)."""
    out: dict[int, list[str]] = {}
    for j in sorted((lay.round_dir(1) / "journal").glob("batch_*.jsonl")):
        texts = []
        for line in j.read_bytes().splitlines():
            try:
                texts.append(json.loads(line)["value"]["text"])
            except (ValueError, KeyError, TypeError):
                pass
        out[int(j.stem.split("_")[1])] = texts
    return out


def _finished_batches(lay: RunLayout) -> set[int]:
    return {int(p.stem.split("_")[1]) for p in (lay.round_dir(1) / "parts").glob("batch_*.parquet")}


def test_worker_sigkill_mid_batch_then_rerun(prefect_server, tmp_path):  # noqa: F811
    env, api = prefect_server
    deploy = subprocess.run([sys.executable, "-m", "evolforge.cli", "deploy", "--pool", POOL, "--no-schedule"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]

    seed_ids = [f"s{i:02d}" for i in range(N_SEEDS)]
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps({"id": s, "instruction": f"Describe the history of lighthouse number {i}."})
                               for i, s in enumerate(seed_ids)) + "\n")
    out = tmp_path / "out"
    lay = RunLayout(out)
    wlog = tmp_path / "worker.log"
    workers: list[subprocess.Popen] = []
    gate = _Gate()
    try:
        with ScriptedServer(latency=LATENCY) as srv:
            _unique_replies(srv, gate)
            params = {"seeds": str(seeds), "out": str(out), "rounds": 1, "base_url": srv.base_url,
                      "overrides": {"evol_instruct": {"batch_size": BATCH, "concurrency": 2},
                                    "runner": {"max_workers": 2}, "gateway": {"concurrency": 8}}}
            workers.append(_start_worker(env, wlog))
            run_id = _deployment_run(env, params)

            def mid_round() -> bool:
                done = _finished_batches(lay) if (lay.round_dir(1) / "parts").exists() else set()
                journal = _journal_texts(lay) if (lay.round_dir(1) / "journal").exists() else {}
                return bool(done) and sum(len(t) for b, t in journal.items() if b not in done) >= MIN_JOURNALED

            # wait until the run is mid-round: a batch finished and an unfinished batch has journaled calls. Then
            # hold the server's replies, let the replies already sent land, and check again: with nothing
            # answered, no batch can finish between this check and the kill.
            deadline = time.time() + 400
            while True:
                if mid_round():
                    gate.hold()
                    time.sleep(1.0)
                    if mid_round():
                        break
                    gate.release()
                st = _state(api, run_id)
                assert st not in TERMINAL, \
                    f"run ended ({st}) before it could be killed:\n" + wlog.read_text()[-4000:]
                assert workers[0].poll() is None, "worker died on its own:\n" + wlog.read_text()[-4000:]
                assert time.time() < deadline, (f"no finished batch with journaled work in flight after 400 s "
                                                f"(run {st}):\n" + wlog.read_text()[-4000:])
                time.sleep(0.1)

            # SIGKILL the worker mid-batch, with the flow-run process it spawned. Prefect's process worker starts
            # the flow run in a session of its own (a workspace supervisor -> `prefect.engine`), so killing the
            # worker's process group alone would leave the flow run going: kill every group of the worker's tree.
            tree = _descendants(workers[0].pid)
            assert any("prefect.engine" in cmd for cmd in tree.values()), \
                f"the worker has no flow-run subprocess to kill: {tree}"
            groups = {workers[0].pid} | {stat[2] for p in tree if (stat := _proc_stat(p))}
            for g in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(g, signal.SIGKILL)
            t_kill = time.time()
            workers[0].wait(timeout=30)
            deadline = time.time() + 30
            while [p for p in tree if _alive(p)] and time.time() < deadline:
                time.sleep(0.2)
            left = {p: tree[p] for p in tree if _alive(p)}
            for p in left:  # do not leak them into later tests, but fail
                os.kill(p, signal.SIGKILL)
            assert not left, f"processes survived the SIGKILL of the worker's process groups {groups}: {left}"

            gate.release(drop=True)  # the held requests' client is dead: close them unanswered
            before = srv.posts()
            done_at_kill = _finished_batches(lay)
            journal_at_kill = _journal_texts(lay)
            assert not lay.round_success(1).exists(), "killed too late to test a mid-round resume"
            assert len(done_at_kill) < N_SEEDS // BATCH
            journaled = {t for texts in journal_at_kill.values() for t in texts}
            to_replay = sum(len(texts) for b, texts in journal_at_kill.items() if b not in done_at_kill)
            assert to_replay >= MIN_JOURNALED

            time.sleep(3)  # give the server a chance to notice anything (it has nobody left to tell it)
            killed_state = _state(api, run_id)
            assert killed_state != "COMPLETED"
            print(f"killed flow run {run_id} left in state {killed_state}; batches done {sorted(done_at_kill)}, "
                  f"{len(journaled)} calls journaled, {to_replay} in unfinished batches")

            # recovery with a fresh worker
            workers.append(_start_worker(env, wlog))
            if killed_state in {"FAILED", "CRASHED"}:
                retry = subprocess.run([sys.executable, "-m", "prefect", "flow-run", "retry", run_id], env=env,
                                       capture_output=True, text=True, timeout=180)
                assert retry.returncode == 0, retry.stdout + retry.stderr
                final_id = run_id
            else:  # orphaned: `flow-run retry` refuses a non-terminal run; a new run over the same folder resumes
                final_id = _deployment_run(env, params)
            final_state = _wait(api, final_id, timeout=600)
            assert final_state == "COMPLETED", f"rerun {final_state}:\n" + wlog.read_text()[-5000:]
            after = srv.posts()[len(before):]
    finally:
        gate.release(drop=True)
        for w in workers:
            _stop(w)

    # no call whose response was journaled before the kill reached the endpoint again (every journaled
    # response is one the server sent before the kill: the replies are unique, so the match is exact)
    assert journaled <= {r.get("text") for r in before if r["completed"]}
    assert all(r.get("text") for r in after if r["completed"])
    resent = [r for r in after if r.get("text") in journaled]
    assert resent == [], f"{len(resent)} journaled calls were sent again"
    finished_before = {r["key"] for r in before if r["completed"] and r["t"] < t_kill - 1.0}
    repeated = [r for r in after if r["key"] in finished_before]
    assert repeated == [], f"{len(repeated)} calls finished well before the kill were sent again"
    summary = json.loads(lay.summary.read_text())
    assert summary["run_id"] == final_id
    assert summary["gateway"]["replayed"] == to_replay  # every journaled call of an unfinished batch was replayed
    # only the unfinished batches ran again: at most 3 calls per record of theirs
    assert len(after) <= 3 * BATCH * (N_SEEDS // BATCH - len(done_at_kill))

    # every seed record exactly once
    lineage = pl.read_parquet(lay.lineage)
    assert lineage.height == N_SEEDS and lineage["id"].n_unique() == N_SEEDS
    assert sorted(lineage["seed_id"]) == seed_ids
    assert lineage.filter(pl.col("status") == "error").height == 0
    evolved = pl.read_parquet(lay.evolved)
    assert evolved["id"].n_unique() == evolved.height
    assert sorted(evolved.filter(pl.col("status") == "seed")["seed_id"]) == seed_ids
    accepted = evolved.filter(pl.col("status") == "accepted")
    assert accepted.height > 0 and accepted["seed_id"].n_unique() == accepted.height

    # the finished run's artifacts through the API
    arts = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [final_id]}}},
                      timeout=10).json()
    by_key = {a["key"]: a for a in arts}
    assert {"evolve-summary", "evolve-round-1", "evolve-round-1-progress"} <= set(by_key)
    assert "Cost per stage" in by_key["evolve-summary"]["data"]
    progress = httpx.get(f"{api}/artifacts/{by_key['evolve-round-1-progress']['id']}", timeout=10).json()
    assert float(progress["data"]) == 100.0
