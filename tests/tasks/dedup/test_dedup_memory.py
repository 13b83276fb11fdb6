"""A one-process dedup's work folder in memory (storage/dedup_memory.py): the same arrays read back as from files,
and the same decisions whether the folder keeps everything in memory, nothing (files only) or some of it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage import dedup_memory
from evolforge.storage.dedup_work import (
    ArrayWriter,
    DedupWork,
    PackedStrings,
    load_array,
    load_grouped,
    mapped,
    read_rows,
    read_strings,
    release,
    save_array,
    save_grouped,
    save_strings,
    strings_count,
)
from evolforge.tasks.dedup import dedup, dedup_file, pipeline
from evolforge.testing.dedup_decisions import BagOfWords
from evolforge.testing.near_dup_corpus import make_corpus


def _exchange(work: DedupWork) -> dict:
    """One of each kind of write and read a step makes, read back."""
    a = np.arange(12, dtype=np.int64).reshape(4, 3)
    save_array(work.data("t", "a.npy"), a)
    w = ArrayWriter(work.data("t", "w"), "x", (5,), np.float32)
    w.append(np.ones(2))
    w.append(np.zeros(3))
    w.close()
    save_strings(work.data("t", "s"), "texts", ["é", "", "b\ud800c", "x"])
    save_grouped(work.data("t", "g"), {"v": np.array([5, 6, 7, 8])}, np.array([1, 0, 1, 0]), 2,
                 strings={"s": ["a", "b", "c", "d"]})
    return {"a": load_array(work.data("t", "a.npy")).tolist(), "rows": read_rows(work.data("t", "a.npy"), 1, 3).tolist(),
            "mapped": mapped(work.data("t", "a.npy")).tolist(),
            "w": load_array(work.data("t", "w.x.npy"), mmap=False).tolist(),
            "n": strings_count(work.data("t", "s"), "texts"), "some": read_strings(work.data("t", "s"), "texts", 1, 3),
            "take": PackedStrings(work.data("t", "s"), "texts").take([3, 0]),
            "g": [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in
                   load_grouped(work.data("t", "g"), r, ("v",), strings=("s",)).items()} for r in (0, 1)]}


def test_in_memory_folder_reads_back_what_files_do(tmp_path):
    files, kept = DedupWork.fresh(str(tmp_path), budget=0), DedupWork.fresh(str(tmp_path))
    try:
        assert _exchange(kept) == _exchange(files)
        assert not kept.root.exists() and files.root.exists()   # nothing written to disk
        assert {DedupWork.kind_of(p) for p, _ in kept.files()} == {"t"} and len(kept.files()) >= 6
        with pytest.raises(ValueError):   # read-only, as a memory-mapped file
            load_array(kept.data("t", "a.npy"))[0, 0] = 1
    finally:
        files.remove()
        kept.remove()
    assert dedup_memory.store_at(kept.root) is None and not files.root.exists()


def test_arrays_past_the_budget_or_the_array_limit_go_to_files(tmp_path, monkeypatch):
    monkeypatch.setattr(dedup_memory, "ARRAY_BYTES", 100)
    work = DedupWork.fresh(str(tmp_path), budget=150)
    try:
        save_array(work.data("t", "small.npy"), np.zeros(10, np.int64))    # 80 bytes: kept
        save_array(work.data("t", "big.npy"), np.zeros(20, np.int64))      # 160 > 100: a file
        save_array(work.data("t", "more.npy"), np.zeros(10, np.int64))     # 80 + 80 > 150: a file
        assert sorted(p.name for p in work.root.iterdir()) == ["t.big.npy", "t.more.npy"]
        assert load_array(work.data("t", "small.npy")).tolist() == [0] * 10
        assert load_array(work.data("t", "big.npy")).shape == (20,)
    finally:
        work.remove()
    assert not work.root.exists()


@pytest.mark.parametrize("shards", [1, 3])
def test_the_same_decisions_in_memory_in_files_and_mixed(tmp_path, monkeypatch, shards):
    monkeypatch.setattr(pipeline, "_encoder", lambda kind, s: BagOfWords(64, "stub"))
    c = make_corpus(400, seed=3)
    scores = [float(i % 7) for i in range(400)]
    s = DedupSettings(shards=shards, keep="best", score_field="score", static_candidate_cosine=0.7, static_accept_cosine=0.9,
                      cosine_threshold=0.8, ann_exact_below=0)
    got = []
    for name, budget, array_bytes in (("memory", 1 << 30, 1 << 30), ("files", 0, 0), ("mixed", 1 << 30, 4096)):
        monkeypatch.setattr(dedup_memory, "BUDGET", budget)
        monkeypatch.setattr(dedup_memory, "ARRAY_BYTES", array_bytes)
        idx = tmp_path / f"idx-{name}"
        runs = [dedup(c.texts[a:a + 100], [f"r{i}" for i in range(a, a + 100)], s, index_dir=idx,
                      scores=scores[a:a + 100]) for a in range(0, 400, 100)]
        got.append([(r.kept_ids, r.dropped) for r in runs])
    assert got[0] == got[1] == got[2]
    assert any(r[1] for r in got[0]) and any(d["method"] == "embedding" for r in got[0] for d in r[1])


def test_dedup_file_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "_encoder", lambda kind, s: BagOfWords(64, "stub"))
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_corpus(200, seed=1).texts))
    base = tmp_path / "work"
    out = dedup_file(inp, "text", tmp_path / "out", DedupSettings(shard_dir=str(base), shards=2))
    assert out["kept"] + out["dropped"] == 200 and out["stats"]["work_files"]["prep"] > 0
    assert list(base.iterdir()) == [] and not dedup_memory._STORES


def test_a_transient_array_is_kept_whatever_its_size_until_its_reader_releases_it(tmp_path, monkeypatch):
    monkeypatch.setattr(dedup_memory, "ARRAY_BYTES", 100)
    work, plain = DedupWork.fresh(str(tmp_path), budget=1000, transient=True), DedupWork.fresh(str(tmp_path), budget=1000)
    try:
        big = np.arange(50, dtype=np.int64)   # 400 bytes > ARRAY_BYTES
        save_array(work.data("t", "big.npy"), big, transient=True)
        save_array(work.data("t", "small.npy"), big[:5])             # not transient: kept, never released
        save_array(plain.data("t", "big.npy"), big, transient=True)   # a store without transient arrays: a file
        assert not work.root.exists() and sorted(p.name for p in plain.root.iterdir()) == ["t.big.npy"]
        assert load_array(work.data("t", "big.npy")).tolist() == big.tolist()
        release(work.data("t", "big.npy"), work.data("t", "small.npy"), plain.data("t", "big.npy"))
        assert dedup_memory.entry(work.data("t", "big.npy")) is None
        assert load_array(work.data("t", "small.npy")).tolist() == list(range(5))
        assert load_array(plain.data("t", "big.npy")).tolist() == big.tolist()   # a file stays
        assert dedup_memory.store_at(work.root).used == 40
        save_array(work.data("t", "past.npy"), np.zeros(200, np.int64), transient=True)   # past the budget: a file
        assert work.root.exists() and dedup_memory.entry(work.data("t", "past.npy")) is None
    finally:
        work.remove()
        plain.remove()


@pytest.mark.parametrize("shards", [1, 3])
def test_the_same_decisions_with_transient_arrays_in_memory_and_in_files(tmp_path, monkeypatch, shards):
    """No index: the sketches and vectors are transient (kept in memory whatever their size, released by their
    reader; with one shard the sketches become the shared arrays in place); the same decisions as with files
    only."""
    monkeypatch.setattr(pipeline, "_encoder", lambda kind, s: BagOfWords(64, "stub"))
    monkeypatch.setattr(dedup_memory, "ARRAY_BYTES", 64)
    c = make_corpus(400, seed=5)
    s = DedupSettings(shards=shards, static_candidate_cosine=0.7, static_accept_cosine=0.9, cosine_threshold=0.8,
                      ann_exact_below=0)
    got = []
    for budget in (1 << 30, 0):
        monkeypatch.setattr(dedup_memory, "BUDGET", budget)
        r = dedup(c.texts, [f"r{i}" for i in range(400)], s)
        got.append((r.kept_ids, r.dropped))
        assert not dedup_memory._STORES
    assert got[0] == got[1] and {d["method"] for d in got[0][1]} == {"exact", "minhash", "embedding"}
