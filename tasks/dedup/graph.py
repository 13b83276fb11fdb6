"""Connected components of a phase's candidate graph in shard steps, and its edges routed to group shards.

A phase's edges (MinHash: the band shards' verified pairs; embedding: the search shards' neighbours) are in E
part files, its nodes 0..L-1 (the records alive when the phase started) in S node ranges. The components come
from rounds of two steps, each one task per part or per range, exchanging files only:

    hook/part-e   (round r)   the edges of part e with both ends' current labels; within the part, every label
                              gets the smallest label of its local component (one `components` call on the
                              labels' graph): proposals (label, smaller label), one file sorted by node range
    apply/range-k (round r)   range k's labels: each the smallest of itself and its proposals, then one pointer
                              jump (label <- label of label, from round r's labels)

until a hook round has no proposal: every edge then has one label at both ends, and that label is the smallest
member of the component (labels only decrease, always name a member, and the smallest member keeps its own).
Then `route/part-e` sends each edge to group shard label % G (one file sorted by group), so a group shard holds
whole components, with their edges in the order of one merged search: the grouping rules (representatives, the
leader grouping, the number guard, the best matched record) decide per component, so a group shard decides as
one process over all edges does. No step holds more than its part's edges, its range's labels and the labels
its edges touch (memory-mapped): nothing grows with the records on one worker or on the driver.
"""

from __future__ import annotations

import numpy as np

from evolforge.storage.dedup_work import DedupWork, load_array, load_grouped, mapped, save_array, save_grouped
from evolforge.tasks.dedup.embedding import row_ranges
from evolforge.tasks.dedup.rules import components


def part_edges(part: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """A search part's edges (i < j, not unique across parts) and their similarity, in the part's order."""
    if "rec" in part:
        rec, other = np.asarray(load_array(part["rec"])), np.asarray(load_array(part["other"]))
        return np.stack([np.minimum(rec, other), np.maximum(rec, other)], 1), np.asarray(load_array(part["sim"]))
    return np.asarray(load_array(part["pairs"])).reshape(-1, 2), np.asarray(load_array(part["sims"]))


def node_ranges(n_nodes: int, shards: int) -> list[tuple[int, int]]:
    return row_ranges(n_nodes, shards) or [(0, 0)]


class Labels:
    """Round r's labels of every node, read from the range files (memory-mapped); round 0 is the identity."""

    def __init__(self, work: DedupWork, phase: str, round_: int, ranges: list):
        self.round, self.starts = round_, np.array([a for a, _ in ranges] + [ranges[-1][1]], np.int64)
        self.files = [None] * len(ranges) if round_ == 0 else \
            [mapped(work.labels(phase, round_, k)) for k in range(len(ranges))]

    def of(self, nodes: np.ndarray) -> np.ndarray:
        nodes = np.asarray(nodes, np.int64)
        if self.round == 0:
            return nodes.copy()
        out = np.empty(len(nodes), np.int64)
        k = np.searchsorted(self.starts, nodes, side="right") - 1
        for r in np.unique(k).tolist():
            sel = k == r
            out[sel] = self.files[r][nodes[sel] - self.starts[r]]
        return out


def hook(work: DedupWork, phase: str, round_: int, part_no: int, part: dict, ranges: list) -> int:
    """One part's proposals for round `round_` (module docstring); their count."""
    pairs, _ = part_edges(part)
    lab = Labels(work, phase, round_, ranges)
    li, lj = lab.of(pairs[:, 0]), lab.of(pairs[:, 1])
    diff = li != lj
    li, lj = li[diff], lj[diff]
    u = np.unique(np.concatenate([li, lj]))
    comp = components(len(u), np.stack([np.searchsorted(u, li), np.searchsorted(u, lj)], 1))
    move = np.flatnonzero(comp != np.arange(len(u)))
    node, to = u[move], u[comp[move]]
    starts = np.array([a for a, _ in ranges], np.int64)
    dest = np.searchsorted(starts, node, side="right") - 1
    save_grouped(work.proposals(phase, round_, part_no), {"node": node, "to": to}, dest, len(ranges))
    return len(node)


def apply(work: DedupWork, phase: str, round_: int, node_range: int, parts: int, ranges: list) -> int:
    """Range `node_range`'s labels of round `round_` + 1 from round `round_`'s and its proposals; how many changed."""
    a, b = ranges[node_range]
    lab = Labels(work, phase, round_, ranges)
    cur = lab.of(np.arange(a, b))
    before = cur.copy()
    for e in range(parts):
        got = load_grouped(work.proposals(phase, round_, e), node_range, ("node", "to"))
        np.minimum.at(cur, got["node"] - a, got["to"])
    cur = np.minimum(cur, lab.of(cur))   # one pointer jump
    save_array(work.labels(phase, round_ + 1, node_range), cur)
    return int((cur != before).sum())


def route(work: DedupWork, phase: str, round_: int, part_no: int, part: dict, ranges: list, groups: int) -> int:
    """Part `part_no`'s edges sent to their group shard (final labels: round `round_`); the edge count."""
    pairs, sims = part_edges(part)
    g = Labels(work, phase, round_, ranges).of(pairs[:, 0]) % groups
    save_grouped(work.routed(phase, part_no), {"pairs": pairs, "sims": sims}, g, groups)
    return len(pairs)


def group_edges(work: DedupWork, phase: str, group: int, parts: int, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Group shard `group`'s unique edges sorted by (i, j), each with the similarity of its first occurrence in
    part order: the edges of its components exactly as one merged search has them."""
    got = [load_grouped(work.routed(phase, e), group, ("pairs", "sims")) for e in range(parts)]
    pairs = np.concatenate([np.zeros((0, 2), np.int64)] + [x["pairs"].reshape(-1, 2) for x in got])
    sims = np.concatenate([x["sims"] for x in got]) if got else np.zeros(0)   # the parts' dtype, as one search
    if not len(pairs):
        return pairs, sims
    _, first = np.unique(pairs[:, 0] * n_nodes + pairs[:, 1], return_index=True)
    return pairs[first], sims[first]
