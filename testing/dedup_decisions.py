"""Comparing a dedup's decisions (kept ids, dropped rows with reasons) between runs, for tests of the dedup that
runs on the workers: one process is the reference."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from evolforge.testing.near_dup_corpus import make_corpus

# small, and configured so the embedding search takes the k-means (ANN) path and the full model confirms some pairs
SMALL = dict(ann_exact_below=500, ann_cluster_size=50, ann_kmeans_sample=1000, max_confirm_records=24, shards=3)


def write_corpus(path: Path, n: int = 1500, seed: int = 5) -> Path:
    """A jsonl of near-duplicate families (id, text, score)."""
    texts = make_corpus(n, seed=seed).texts
    path.write_text("".join(json.dumps({"id": f"r{i}", "text": t, "score": (i * 7919) % 101}) + "\n"
                            for i, t in enumerate(texts)))
    return path


def decisions(out: Path) -> tuple[list[str], pl.DataFrame]:
    """The kept ids and the dropped rows of a dedup output folder (jsonl input)."""
    return pl.read_ndjson(out / "kept.jsonl")["id"].to_list(), pl.read_ndjson(out / "dropped.jsonl")


def assert_same(got, want) -> None:
    """Same kept ids in the same order; same dropped rows, order and reasons (floats to 1e-5)."""
    kept, dropped = got
    assert kept == want[0]
    floats = [c for c, t in want[1].schema.items() if t.is_float()]
    assert dropped.drop(floats).equals(want[1].drop(floats))   # same rows, same order, same reasons
    for c in floats:  # float32 vectors computed in other processes may differ in the last bits
        assert (dropped[c] - want[1][c]).abs().fill_null(0).max() < 1e-5, c


class BagOfWords:
    """A deterministic text encoder without a model, for the embedding cascade in tests: each word hashed (crc32)
    into one of `dim` buckets, the counts normalized."""

    def __init__(self, dim: int = 256, fingerprint: str = "bow"):
        self.dim, self.fingerprint = dim, fingerprint

    def encode(self, texts):
        import zlib

        import numpy as np

        from evolforge.tasks.dedup import embedding as emb

        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, zlib.crc32(w.encode()) % self.dim] += 1
        return emb.normalize_rows(out)
