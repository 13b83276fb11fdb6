"""Dedup scale-out: MinHash band shards and embedding search shards as Prefect tasks on a real local Dask
cluster (two worker processes) decide exactly what one process decides on the same input and settings."""

from __future__ import annotations

import json
import os

import numpy as np
import polars as pl
import pytest

from evolforge.config.sections.dedup import DedupSettings
from evolforge.flows.dedup import DedupParams, dedup_flow
from evolforge.tasks.dedup import dedup_file
from evolforge.tasks.dedup import minhash as mh
from evolforge.tasks.dedup import shards as sh
from evolforge.tasks.dedup.normalize import normalize_many
from evolforge.testing.lazy import needs
from evolforge.testing.near_dup_corpus import make_corpus

pytestmark = needs("prefect_dask")

# small enough for a fast test, configured so the embedding search takes the k-means (ANN) path, not exact search
SMALL = dict(ann_exact_below=500, ann_cluster_size=50, ann_kmeans_sample=1000, max_confirm_records=24, shards=2)


@pytest.fixture(scope="module")
def corpus():
    return make_corpus(3000, seed=3)


def test_minhash_band_shards_give_exactly_the_one_shot_pairs(corpus):
    s = DedupSettings()
    sk = mh.sketch_many(normalize_many(corpus.texts, s), s)
    p1, j1, _ = mh.verified_pairs(sk, s)
    assert len(p1) > 100
    for shards in (2, 5, 32):
        p, j, _ = sh.minhash_pairs(sk, s.model_copy(update={"shards": shards}))
        assert np.array_equal(p, p1) and np.array_equal(j, j1)
    # with history rows (an index): only pairs touching a new record, the same either way
    is_new = np.arange(len(sk)) >= 1000
    p1, j1, _ = mh.verified_pairs(sk, s, is_new)
    p, j, _ = sh.minhash_pairs(sk, s.model_copy(update={"shards": 3}), is_new)
    assert np.array_equal(p, p1) and np.array_equal(j, j1)


def test_one_shard_is_the_unsharded_search_and_shards_keep_their_rows(corpus):
    from evolforge.tasks.dedup import embedding as emb
    from evolforge.tasks.dedup.pipeline import _encoder

    s = DedupSettings(**{**SMALL, "shards": 1})
    E = _encoder("static", s).encode(corpus.texts)
    plan = emb.ann_plan(E, s)
    whole = emb.ann_search(E, plan, (0, len(E)), s.static_candidate_cosine, s.max_neighbors)
    parts = [emb.ann_search(E, plan, r, s.static_candidate_cosine, s.max_neighbors) for r in emb.row_ranges(len(E), 4)]
    for part, (r0, r1) in zip(parts, emb.row_ranges(len(E), 4)):
        assert ((part["rec"] >= r0) & (part["rec"] < r1)).all()
    p1, s1 = emb.merge_neighbors([whole], len(E))
    p4, s4 = emb.merge_neighbors(parts, len(E))
    assert len(p1) > 50
    # the same neighbour pairs (cosines may differ in the last bit: other matrix blocks)
    assert np.array_equal(p1, p4) and np.allclose(s1, s4, atol=1e-6)


def _write(tmp_path, name, texts, start):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{start + i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


def _decisions(out):
    kept = pl.read_ndjson(out / "kept.jsonl")["id"].to_list()
    dropped = pl.read_ndjson(out / "dropped.jsonl").sort("id")
    return kept, dropped


@pytest.mark.usefixtures("prefect_harness")
def test_dask_two_workers_decide_exactly_as_one_process(tmp_path, corpus):
    """The second half of the corpus against the index the first half left (history rows in every shard)."""
    import shutil

    first, second = _write(tmp_path, "a", corpus.texts[:1500], 0), _write(tmp_path, "b", corpus.texts[1500:], 1500)
    s = DedupSettings(**SMALL)
    dedup_file(first, "text", tmp_path / "first", s, id_field="id", index_dir=tmp_path / "idx-one")
    shutil.copytree(tmp_path / "idx-one", tmp_path / "idx-dask")
    # one process: the shards one after the other, here
    dedup_file(second, "text", tmp_path / "one", s, id_field="id", index_dir=tmp_path / "idx-one")
    # the flow on a local Dask cluster with two single-threaded worker processes
    summary = dedup_flow(DedupParams(input=str(second), text_field="text", id_field="id", out=str(tmp_path / "dask"),
                                     index=str(tmp_path / "idx-dask"),
                                     overrides={"dedup": SMALL, "runner": {"kind": "dask", "max_workers": 2}}))
    kept_one, dropped_one = _decisions(tmp_path / "one")
    kept_dask, dropped_dask = _decisions(tmp_path / "dask")
    assert kept_dask == kept_one
    # the same decisions (who, against whom, how), and the same similarities up to float32's last bits: the
    # encoder's vectors computed in another process may differ there (seen: 9 of 600 rows in the 6th decimal)
    floats = [c for c, t in dropped_one.schema.items() if t.is_float()]
    assert dropped_dask.drop(floats).equals(dropped_one.drop(floats))
    for c in floats:
        assert (dropped_dask[c] - dropped_one[c]).abs().fill_null(0).max() < 1e-5, c
    stats = summary["stats"]
    # every method dropped something (history included), so every path was compared
    assert all(stats.get(f"dropped_{m}", 0) > 0 for m in ("exact", "minhash", "embedding")), stats
    assert stats["indexed_before"] > 1000
    # the shards ran as tasks in two worker processes, not in this one
    assert len(stats["shard_workers"]) == 2 and str(os.getpid()) not in stats["shard_workers"]
    assert len(stats["shard_seconds"]["minhash"]) == 2 and len(stats["shard_seconds"]["ann"]) == 2


def test_dedup_file_publishes_its_steps_as_progress(tmp_path, corpus):
    """The `dedup` command's progress bar: one step per method, then finished with the kept count."""
    from evolforge.tasks.core import progress as live_progress

    path = _write(tmp_path, "in", corpus.texts[:400], 0)
    seen = []
    with live_progress.listening(seen.append):
        dedup_file(path, "text", tmp_path / "out", DedupSettings(embedding=False), id_field="id")
    assert all(s["what"] == "dedup" and s["unit"] == "steps" for s in seen)
    assert [s["records_done"] for s in seen] == [0, 1, 2, 2] and seen[-1]["finished"]
    assert seen[-1]["records_total"] == 2 and "kept" in seen[-1]["detail"]
    assert "minhash" in seen[1]["detail"] and "next minhash" in seen[1]["detail"]
