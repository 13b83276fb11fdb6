"""The two costly searches in shards: one part of the search each, the same pairs however they are split.

`dedup.shards` = S splits each search into S independent parts (the engine's `bands` and `ann` steps,
tasks/dedup/plan.py):
  minhash    the LSH bands in S contiguous ranges: a part finds the candidate pairs of its bands and verifies
             them (exact Jaccard); the verified pairs of all parts, made unique, are exactly those of all bands
             (a pair is verified on its own shingle sets, whichever band found it; a pair found in two parts'
             bands is verified twice).
  ann        the query rows of the embedding search in S contiguous ranges: a part keeps the best neighbours of
             its rows only (`embedding.ann_search`); the k-means plan is fitted once, before the parts.
A part reads the shared arrays (memory-mapped) and returns its pairs; the components of the pairs then come from
the parts' files (tasks/dedup/graph.py). `merge_minhash` and `minhash_pairs` give the merged pairs of one process
(what the parts' pairs, made unique, are: tests/flows/test_dedup_scale.py).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.tasks.dedup import embedding as emb
from evolforge.tasks.dedup import minhash as mh

_PLAN_KEYS = ("m_order", "m_start", "q_rec", "q_start")


def band_ranges(bands: int, shards: int) -> list[tuple[int, int]]:
    """`shards` contiguous, near-equal ranges of LSH bands [j0, j1) (at most one per band)."""
    return emb.row_ranges(bands, shards)


def run_shard(kind: str, shared: dict[str, np.ndarray], job: dict, settings: DedupSettings) -> dict[str, np.ndarray]:
    """One part's work on the shared arrays (possibly memory-mapped)."""
    if kind == "minhash":
        sk = mh.Sketches(shared["offsets"], shared["values"], shared["signatures"], shared["band_keys"])
        p, sims, ncand = mh.verified_pairs(sk, settings, shared.get("is_new"), bands=tuple(job["bands"]))
        return {"pairs": p, "sims": sims, "candidates": np.array([ncand], np.int64)}
    if kind == "ann":
        plan = {k: shared[k] for k in _PLAN_KEYS}
        with emb.one_thread_math():
            return emb.ann_search(shared["E"], plan, tuple(job["rows"]), float(job["threshold"]),
                                  settings.max_neighbors)
    raise ValueError(f"unknown dedup search kind {kind!r}")


def merge_minhash(parts: Sequence[dict[str, np.ndarray]], n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The parts' verified pairs, unique and sorted by code (the order of one search over all bands)."""
    pairs = np.concatenate([np.zeros((0, 2), np.int64)] + [np.asarray(p["pairs"]) for p in parts])
    sims = np.concatenate([np.zeros(0)] + [np.asarray(p["sims"]) for p in parts])
    ncand = int(sum(int(p["candidates"][0]) for p in parts))
    _, first = np.unique(pairs[:, 0] * n + pairs[:, 1], return_index=True)
    return pairs[first], sims[first], ncand


def minhash_pairs(sk: mh.Sketches, settings: DedupSettings,
                  is_new: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """mh.verified_pairs in settings.shards band parts, one after the other here (the same pairs and Jaccard)."""
    shared = {"offsets": sk.offsets, "values": sk.values, "signatures": sk.signatures, "band_keys": sk.band_keys}
    if is_new is not None:
        shared["is_new"] = is_new
    parts = [run_shard("minhash", shared, {"bands": list(b)}, settings)
             for b in band_ranges(settings.bands, settings.shards)]
    return merge_minhash(parts, len(sk))
