"""The persistent dedup index shared by several flows: segments tagged with their run and round, rolled back
per run, older (format 1) indexes still loading; and the lock every transaction on the index holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.fs import location
from evolforge.storage.locks import lock_file, lock_holder
from evolforge.tasks.dedup import dedup
from evolforge.tasks.dedup.index import DedupIndex, IndexLocked, IndexMismatch, index_lock, rollback_index
from evolforge.testing.near_dup_corpus import unrelated_texts

S = DedupSettings(embedding=False)
texts = unrelated_texts  # n unrelated texts (no two near duplicates), the same for the same tag


def add(idx, tag: str, n: int, run: str | None, rnd: int):
    return dedup(texts(tag, n), [f"{tag}-{i}" for i in range(n)], S, idx,
                 index_source=None if run is None else {"run": run, "source": f"/runs/{run}", "round": rnd})


def manifest(idx: Path) -> dict:
    return json.loads((idx / "manifest.json").read_text())


def test_rollback_drops_only_that_runs_later_rounds(tmp_path):
    idx = tmp_path / "idx"
    add(idx, "A0", 3, "A", 0)   # run A's seeds
    add(idx, "B0", 2, "B", 0)   # another night sharing the index
    add(idx, "A1", 4, "A", 1)
    add(idx, "A2", 2, "A", 2)
    add(idx, "B1", 3, "B", 1)
    add(idx, "F", 1, None, 0)   # the dedup flow: no run, never rolled back
    before = manifest(idx)
    assert before["format"] == 2 and before["count"] == 15
    assert [before["entries"][n].get("round") for n in before["segments"]] == [0, 0, 1, 2, 1, None]

    assert rollback_index(idx, "A", 1, S) == {"segments": 2, "records": 6, "full": 0}
    m = manifest(idx)
    assert DedupIndex(idx, S).load().ids == [f"{t}-{i}" for t, n in (("A0", 3), ("B0", 2), ("B1", 3), ("F", 1))
                                              for i in range(n)]
    assert m["count"] == 9 and len(m["segments"]) == 4 and set(m["entries"]) == set(m["segments"])
    assert sorted(p.name for p in idx.glob("seg-*.npz")) == sorted(m["segments"])  # the dropped files are gone
    assert rollback_index(idx, "A", 1, S)["segments"] == 0  # idempotent

    # the redone round sees the index as it was before round 1 of run A: its records are new again
    again = add(idx, "A1", 4, "A", 1)
    assert again.kept_ids == [f"A1-{i}" for i in range(4)] and again.stats["indexed_before"] == 9
    m = manifest(idx)
    assert len(set(m["segments"])) == 5 and m["next"] > max(int(n[4:10]) for n in m["segments"])
    assert len(DedupIndex(idx, S).load()) == m["count"] == 13
    # rolling back from round 0 empties run A only
    rollback_index(idx, "A", 0, S)
    assert {i.split("-")[0] for i in DedupIndex(idx, S).load().ids} == {"B0", "B1", "F"}


def test_rollback_keeps_and_renumbers_full_model_vectors(tmp_path):
    idx = tmp_path / "idx"
    add(idx, "A0", 2, "A", 0)   # rows 0-1
    add(idx, "A1", 3, "A", 1)   # rows 2-4
    add(idx, "B0", 2, "B", 0)   # rows 5-6
    vec = {r: np.full(4, r, np.float32) for r in (0, 3, 5, 6)}
    index = DedupIndex(idx, S)
    empty = np.zeros(0, np.uint64)
    index.append([], [], empty, None, None, full_new=vec, source={"run": "B", "round": 0})
    index.append([], [], empty, None, None, full_new={1: vec[0] + 9}, source={"run": "A", "round": 1})
    assert set(index.load().full) == {0, 1, 3, 5, 6}

    dropped = rollback_index(idx, "A", 1, S)
    assert dropped == {"segments": 1, "records": 3, "full": 1}
    data = index.load()
    assert data.ids == ["A0-0", "A0-1", "B0-0", "B0-1"]
    # row 3 was in the dropped segment; rows 5 and 6 are now rows 2 and 3; A's round-1 file is gone
    assert {r: float(v[0]) for r, v in data.full.items()} == {0: 0.0, 2: 5.0, 3: 6.0}
    m = manifest(idx)
    assert len(m["full"]) == 1 and m["entries"][m["full"][0]]["run"] == "B"
    assert sorted(p.name for p in idx.glob("*.npz")) == sorted(m["segments"] + m["full"])


def test_format_1_index_loads_is_never_rolled_back_and_is_extended_safely(tmp_path):
    idx = tmp_path / "idx"
    add(idx, "A0", 2, "A", 0)
    add(idx, "A1", 2, "A", 1)
    m = manifest(idx)
    old = {"format": 1, "fingerprint": m["fingerprint"], "segments": m["segments"], "full": [], "count": m["count"]}
    (idx / "manifest.json").write_text(json.dumps(old))  # as an evolforge before segments carried their run wrote it
    (idx / "seg-000003.npz").write_bytes(b"orphan of an interrupted append")  # never named by the manifest

    assert len(DedupIndex(idx, S).load()) == 4
    assert rollback_index(idx, "A", 0, S)["segments"] == 0  # untagged entries belong to no run
    add(idx, "A2", 2, "A", 2)
    m = manifest(idx)
    assert m["format"] == 2 and m["segments"][:2] == old["segments"] and m["segments"][2] == "seg-000003.npz"
    assert rollback_index(idx, "A", 0, S) == {"segments": 1, "records": 2, "full": 0}
    assert DedupIndex(idx, S).load().ids == ["A0-0", "A0-1", "A1-0", "A1-1"]

    (idx / "manifest.json").write_text(json.dumps({**old, "format": 3}))
    with pytest.raises(IndexMismatch, match="format 3"):
        DedupIndex(idx, S).load()


# --- the lock -------------------------------------------------------------------------------

def _python(code: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def test_second_process_waits_for_the_lock_then_fails_naming_the_holder(tmp_path):
    idx = tmp_path / "idx"
    holder = _python(f"""
        import time
        from evolforge.tasks.dedup.index import index_lock
        with index_lock({str(idx)!r}):
            print("locked", flush=True)
            time.sleep(4)
        """)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert lock_holder(idx / "manifest.lock")["pid"] == holder.pid
        short = S.model_copy(update={"index_lock_timeout_seconds": 0.5})
        t0 = time.monotonic()
        with pytest.raises(IndexLocked) as e:
            dedup(["a text that waits for the index"], ["w"], short, idx)
        assert time.monotonic() - t0 >= 0.5
        assert str(idx) in str(e.value) and f"pid {holder.pid}" in str(e.value)
        assert "index_lock_timeout_seconds" in str(e.value)
        # with a longer timeout it waits for the holder and then goes ahead
        res = dedup(["a text that waits for the index"], ["w"], S.model_copy(update={"index_lock_timeout_seconds": 60}),
                    idx)
        assert res.kept_ids == ["w"] and holder.wait(timeout=30) == 0
    finally:
        holder.kill()
        holder.wait()


def test_two_processes_appending_to_one_index_lose_nothing(tmp_path):
    idx, go = tmp_path / "idx", tmp_path / "go"
    code = """
        import os, time
        from evolforge.config.sections.dedup import DedupSettings
        from evolforge.testing.near_dup_corpus import unrelated_texts as texts
        from evolforge.tasks.dedup import dedup
        S = DedupSettings(embedding=False)
        p = {p}
        while not os.path.exists({go!r}):
            time.sleep(0.01)
        for i in range(12):
            dedup(texts(f"P{{p}}-{{i}}", 3), [f"P{{p}}-{{i}}-{{k}}" for k in range(3)], S, {idx!r})
        """
    procs = [_python(code.format(p=p, go=str(go), idx=str(idx))) for p in (0, 1)]
    time.sleep(1.5)  # both imported and waiting
    go.write_text("")
    for proc in procs:
        out = proc.communicate(timeout=300)[0]
        assert proc.returncode == 0, out[-3000:]
    m = manifest(idx)
    ids = DedupIndex(idx, S).load().ids
    assert m["count"] == len(ids) == len(set(ids)) == 2 * 12 * 3
    assert len(m["segments"]) == len(set(m["segments"])) == 24


def test_object_store_lock_is_an_exclusive_object():
    url = location(f"memory://evolforge-lock-test-{os.getpid()}/idx")
    lock = url / "manifest.lock"
    held, release = threading.Event(), threading.Event()

    def hold():
        with index_lock(url, S):
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        holder = lock_holder(lock)
        assert holder["pid"] == os.getpid() and holder["host"]
        # another thread (same process) is another holder: it waits, then fails naming the index and the holder
        with pytest.raises(IndexLocked, match=f"dedup index {url}.*locked by host"):
            with index_lock(url, S.model_copy(update={"index_lock_timeout_seconds": 0.3})):
                pass
    finally:
        release.set()
        t.join()
    assert lock_holder(lock) is None  # released: the object is gone
    # the whole dedup transaction on an object-store index takes and releases it
    assert dedup(texts("M", 2), ["m0", "m1"], S, url).kept_ids == ["m0", "m1"]
    assert lock_holder(lock) is None and len(DedupIndex(url, S).load()) == 2
    # nested transactions in one thread do not wait for themselves
    with index_lock(url, S), index_lock(url, S):
        rollback_index(url, "nobody", 0, S)


def test_object_store_lock_breaks_only_a_stale_lock():
    url = location(f"memory://evolforge-stale-test-{os.getpid()}/idx")
    lock = url / "manifest.lock"
    fs = lock.fs
    dead = {"host": "gone-host", "pid": 4242, "time": time.time() - 7200, "since": "long ago", "token": "t-dead"}
    fs.pipe_file(lock.path, json.dumps(dead).encode())
    with lock_file(lock, timeout=2, stale_seconds=3600) as mine:  # older than stale_seconds: broken
        assert lock_holder(lock)["token"] == mine["token"]
    alive = {**dead, "time": time.time(), "token": "t-alive"}
    fs.pipe_file(lock.path, json.dumps(alive).encode())
    with pytest.raises(TimeoutError, match="host gone-host pid 4242"):
        with lock_file(lock, timeout=0.3, stale_seconds=3600, what="dedup index X"):
            pass
    assert lock_holder(lock)["token"] == "t-alive"  # a live holder's lock is left alone
