"""The connected components of tasks/dedup/graph.py in hook/apply rounds over part files: the labels of one
`components` call over all edges (the smallest member of each component), and the routing that gives every
group shard whole components with the edges of one merged search, in its order."""

from __future__ import annotations

import numpy as np
import pytest

from evolforge.storage.dedup_work import DedupWork, save_array
from evolforge.tasks.dedup import graph
from evolforge.tasks.dedup.pipeline import components
from evolforge.tasks.dedup.shards import merge_minhash


def _parts(work: DedupWork, pairs: np.ndarray, sims: np.ndarray, n_parts: int, rng) -> list[dict]:
    cut = np.sort(rng.choice(np.arange(1, len(pairs)), n_parts - 1, replace=False)) if len(pairs) > n_parts else []
    out = []
    for e, (p, s) in enumerate(zip(np.split(pairs, cut), np.split(sims, cut))):
        out.append({"pairs": save_array(work.root / f"in/{e}/pairs.npy", p),
                    "sims": save_array(work.root / f"in/{e}/sims.npy", s)})
    return out


def _run(work: DedupWork, parts: list[dict], n: int, shards: int) -> tuple[np.ndarray, int]:
    ranges = [list(r) for r in graph.node_ranges(n, shards)]
    r = 0
    while True:
        moved = sum(graph.hook(work, "t", r, e, part, ranges) for e, part in enumerate(parts))
        if not moved:
            break
        for k in range(len(ranges)):
            graph.apply(work, "t", r, k, len(parts), ranges)
        r += 1
    for e, part in enumerate(parts):
        graph.route(work, "t", r, e, part, ranges, shards)
    return graph.Labels(work, "t", r, ranges).of(np.arange(n)), r


def _graph(kind: str, n: int, rng) -> np.ndarray:
    if kind == "chain":   # the longest path: n - 1 edges in a shuffled order, the worst case for label rounds
        perm = rng.permutation(n)
        e = np.stack([perm[:-1], perm[1:]], 1)
    elif kind == "stars":
        centre = rng.integers(0, n, n // 50)
        e = np.stack([rng.choice(centre, n), np.arange(n)], 1)
    else:
        e = rng.integers(0, n, (n, 2))
    e = np.stack([e.min(1), e.max(1)], 1)
    e = e[e[:, 0] != e[:, 1]]
    return e[rng.permutation(len(e))]


@pytest.mark.parametrize("kind", ["random", "chain", "stars"])
@pytest.mark.parametrize("shards", [1, 3, 7])
def test_rounds_give_the_labels_of_one_components_call(tmp_path, kind, shards):
    rng = np.random.default_rng(shards)
    n = 3000
    pairs = _graph(kind, n, rng)
    # every part finds some of the others' pairs too, as band shards do
    dup = pairs[rng.choice(len(pairs), len(pairs) // 5)]
    all_pairs = np.concatenate([pairs, dup])
    sims = rng.random(len(all_pairs))
    work = DedupWork(tmp_path / "w")
    parts = _parts(work, all_pairs, sims, shards, rng)
    labels, rounds = _run(work, parts, n, shards)
    assert np.array_equal(labels, components(n, pairs))
    if kind == "chain" and shards > 1:
        assert rounds > 1   # the test exercises more than one round
    # group shards: whole components, each with the merged search's edges (first occurrence's value)
    merged_p, merged_s, _ = merge_minhash([{"pairs": np.load(p["pairs"]), "sims": np.load(p["sims"]),
                                            "candidates": np.zeros(1, np.int64)} for p in parts], n)
    seen = []
    for g in range(shards):
        gp, gs = graph.group_edges(work, "t", g, len(parts), n)
        assert set((labels[gp[:, 0]] % shards).tolist()) <= {g}
        seen.append((gp, gs))
    gp = np.concatenate([p for p, _ in seen])
    gs = np.concatenate([s for _, s in seen])
    order = np.lexsort((gp[:, 1], gp[:, 0]))
    assert np.array_equal(gp[order], merged_p) and np.array_equal(gs[order], merged_s)


def test_no_edges_is_one_round_and_every_node_its_own_label(tmp_path):
    work = DedupWork(tmp_path / "w")
    parts = _parts(work, np.zeros((0, 2), np.int64), np.zeros(0), 2, np.random.default_rng(0))
    labels, rounds = _run(work, parts, 10, 2)
    assert rounds == 0 and np.array_equal(labels, np.arange(10))
