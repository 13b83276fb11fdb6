"""Sharded MinHash and embedding search: the same decisions in one process or spread over workers.

`dedup.shards` = S splits the two costly searches into S independent shards:
  minhash    the LSH bands in S contiguous ranges: a shard finds the candidate pairs of its bands and verifies
             them (exact Jaccard); the verified pairs of all shards, made unique, are exactly those of all bands
             (a pair is verified on its own shingle sets, whichever band found it; a pair found in two shards'
             bands is verified twice).
  ann        the query rows of the embedding search in S contiguous ranges: a shard keeps the best neighbours of
             its rows only (`embedding.ann_search`); the k-means plan is fitted once, before the shards.
Then one deterministic merge (pairs sorted by code, first occurrence in row order) and the usual grouping.

A shard runner maps (kind, shared arrays, jobs, settings) to one result per job, in job order. `run_here` runs
them in this process one after the other (what `dedup()` does by default); the dedup flow runs one Prefect
task per shard on its task runner (threads, Dask or Ray: flows/dedup.py). Both call `run_shard`, so the
decisions depend on the settings (S included), never on where the shards ran.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.tasks.dedup import embedding as emb
from evolforge.tasks.dedup import minhash as mh

ShardRunner = Callable[[str, dict, list, DedupSettings], list]
_PLAN_KEYS = ("m_order", "m_start", "q_rec", "q_start")


def band_ranges(bands: int, shards: int) -> list[tuple[int, int]]:
    """`shards` contiguous, near-equal ranges of LSH bands [j0, j1) (at most one per band)."""
    return emb.row_ranges(bands, shards)


def run_shard(kind: str, shared: dict[str, np.ndarray], job: dict, settings: DedupSettings) -> dict[str, np.ndarray]:
    """One shard's work on the shared arrays (possibly memory-mapped)."""
    if kind == "minhash":
        sk = mh.Sketches(shared["offsets"], shared["values"], shared["signatures"], shared["band_keys"])
        p, sims, ncand = mh.verified_pairs(sk, settings, shared.get("is_new"), bands=tuple(job["bands"]))
        return {"pairs": p, "sims": sims, "candidates": np.array([ncand], np.int64)}
    if kind == "ann":
        plan = {k: shared[k] for k in _PLAN_KEYS}
        with emb.one_thread_math():
            return emb.ann_search(shared["E"], plan, tuple(job["rows"]), float(job["threshold"]),
                                  settings.max_neighbors)
    raise ValueError(f"unknown dedup shard kind {kind!r}")


def run_here(kind: str, shared: dict, jobs: list, settings: DedupSettings) -> list:
    return [run_shard(kind, shared, job, settings) for job in jobs]


def merge_minhash(parts: Sequence[dict[str, np.ndarray]], n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The shards' verified pairs, unique and sorted by code (the order of one search over all bands)."""
    pairs = np.concatenate([np.zeros((0, 2), np.int64)] + [np.asarray(p["pairs"]) for p in parts])
    sims = np.concatenate([np.zeros(0)] + [np.asarray(p["sims"]) for p in parts])
    ncand = int(sum(int(p["candidates"][0]) for p in parts))
    _, first = np.unique(pairs[:, 0] * n + pairs[:, 1], return_index=True)
    return pairs[first], sims[first], ncand


def minhash_pairs(sk: mh.Sketches, settings: DedupSettings, is_new: np.ndarray | None = None,
                  runner: ShardRunner | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """mh.verified_pairs in settings.shards band shards on `runner` (the same pairs and Jaccard values)."""
    if settings.shards == 1 and runner is None:
        return mh.verified_pairs(sk, settings, is_new)
    shared = {"offsets": sk.offsets, "values": sk.values, "signatures": sk.signatures, "band_keys": sk.band_keys}
    if is_new is not None:
        shared["is_new"] = is_new
    jobs = [{"bands": list(b)} for b in band_ranges(settings.bands, settings.shards)]
    return merge_minhash((runner or run_here)("minhash", shared, jobs, settings), len(sk))


def neighbor_pairs(E: np.ndarray, threshold: float, settings: DedupSettings, is_new: np.ndarray | None = None,
                   runner: ShardRunner | None = None) -> tuple[np.ndarray, np.ndarray]:
    """emb.neighbor_pairs with its search in settings.shards shards of query rows on `runner`."""
    def run(plan, rows):
        jobs = [{"rows": list(r), "threshold": threshold} for r in rows]
        return (runner or run_here)("ann", {"E": E, **plan}, jobs, settings)

    return emb.neighbor_pairs(E, threshold, settings, is_new, shards=settings.shards,
                              run_shards=None if runner is None else run)
