"""The grouping steps of the dedup on the workers: one task per bucket or group shard, then one per record shard.

    exact/bucket-b         the records whose exact key falls in bucket b (every shard's prep wrote them sorted
                           by bucket): exact groups, representatives (`dedup.keep`), drops
    minhash-group/shard-g  group shard g's components (tasks/dedup/graph.py): representatives, drops, Jaccard
    embedding-uncertain/shard-g   group shard g's edges the static model is unsure of (below
                           static_accept_cosine)
    confirm                the uncertain edges of every group in the order of one merged search: the full-model
                           budget (`max_confirm_records`) spent highest static cosine first, as in one process;
                           the only one-task step, and it holds the uncertain edges and that budget only
    embedding-group/shard-g  the confirmations applied, the number guard, the leader grouping, drops
    collect/shard-s        record shard s: its records dropped by the phase, in record order, and its alive mask

A group's drops are rows (record numbers), sorted by record shard; names are resolved by the write step. Every
function here is the one-process rule of tasks/dedup/pipeline.py applied to a bucket's records or a group's
components, renumbered in record order, which keeps the order every tie-break uses.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.dedup_work import (
    DedupWork,
    PackedStrings,
    load_array,
    load_grouped,
    read_rows,
    read_strings,
    save_array,
    save_grouped,
    write_table,
)
from evolforge.tasks.dedup import graph
from evolforge.tasks.dedup import minhash as mh
from evolforge.tasks.dedup import pipeline as pl_
from evolforge.tasks.dedup.index import empty_data
from evolforge.tasks.dedup.normalize import exact_groups

DETAILS = ("normalized text", "jaccard", "static", "full")
_DROP_COLS = ("row", "dup_row", "matched_row", "similarity", "matched_similarity", "detail")


class Records:
    """Single records of the work folder's record shards, read from memory-mapped arrays: scores and texts by
    record number, and the record numbers of a phase's nodes (its records alive, in order)."""

    def __init__(self, work: DedupWork, bounds: list, s: DedupSettings):
        self.work, self.s = work, s
        self.starts = np.array([a for a, _ in bounds] + [bounds[-1][1]], np.int64)
        self._texts: dict[int, PackedStrings] = {}

    def _shards(self, rows: np.ndarray):
        k = np.searchsorted(self.starts, rows, side="right") - 1
        for r in np.unique(k).tolist():
            yield r, np.flatnonzero(k == r)

    def scores(self, rows: np.ndarray) -> np.ndarray | None:
        """keep="best": the scores (NaN -> -inf) of these records; else None."""
        if self.s.keep != "best":
            return None
        out = np.empty(len(rows), np.float64)
        for k, sel in self._shards(rows):
            out[sel] = load_array(self.work.record_arrays(k) / "scores.npy")[rows[sel] - self.starts[k]]
        return out

    def texts(self, rows: np.ndarray) -> list[str]:
        out: list[str] = [""] * len(rows)
        for k, sel in self._shards(rows):
            if k not in self._texts:
                self._texts[k] = PackedStrings(self.work.record_arrays(k), "texts")
            for i, t in zip(sel.tolist(), self._texts[k].take(rows[sel] - self.starts[k])):
                out[i] = t
        return out

    def of_nodes(self, phase_alive: str, counts: list[int], nodes: np.ndarray) -> np.ndarray:
        """The record numbers of nodes of a phase whose records are those alive after `phase_alive` (`counts`:
        alive per record shard)."""
        base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        k = np.searchsorted(base, nodes, side="right") - 1
        out = np.empty(len(nodes), np.int64)
        for r in np.unique(k).tolist():
            sel = np.flatnonzero(k == r)
            rows = np.flatnonzero(load_array(self.work.alive(phase_alive, r)))
            out[sel] = rows[nodes[sel] - base[r]] + self.starts[r]
        return out

    def shard_of(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, rows, side="right") - 1


def _save_drops(work: DedupWork, folder, recs: Records, rec, drop, rep, nb, nb_s, rep_sim, detail) -> int:
    """Drops in a group's numbering (`rec`: its nodes' record numbers) saved sorted by record shard."""
    row = rec[drop]
    cols = {"row": row, "dup_row": rec[rep], "matched_row": rec[nb],
            "similarity": np.array([round(float(x), 6) for x in rep_sim], np.float64),
            "matched_similarity": np.array([round(float(x), 6) for x in nb_s], np.float64),
            "detail": np.array([DETAILS.index(d) for d in detail], np.int8)}
    # one (drops, 6) float64 array (record numbers are exact below 2**53): a receiver reads one slice per sender
    table = np.stack([np.asarray(cols[k], np.float64).reshape(-1) for k in _DROP_COLS], 1).reshape(-1, len(_DROP_COLS))
    table = table[np.argsort(row, kind="stable")]
    save_grouped(folder, {"drops": table}, recs.shard_of(table[:, 0].astype(np.int64)), len(recs.starts) - 1)
    return len(row)


# ----------------------------------------------------------------- exact

def step_exact_bucket(work: DedupWork, s: DedupSettings, shard: int, bounds: list) -> dict:
    """Exact bucket `shard`: the records of every record shard whose exact key falls in it."""
    recs = Records(work, bounds, s)
    rows, keys, norms = [], [], []
    for k in range(len(bounds)):
        folder = work.step("prep") / f"shard-{k:05d}" / "bucketed"
        got = load_grouped(folder, shard, ("rows", "keys"))
        start = read_rows(folder / "start.npy")
        rows.append(got["rows"])
        keys.append(got["keys"])
        norms.extend(read_strings(folder, "norms", int(start[shard]), int(start[shard + 1])))
    rows = np.concatenate([np.zeros(0, np.int64)] + rows)
    keys = np.concatenate([np.zeros(0, np.uint64)] + keys)
    m = len(rows)
    first = exact_groups(keys, norms)
    own = np.flatnonzero(first != np.arange(m))
    p = np.stack([first[own], own], 1).astype(np.int64)
    g = pl_._groups(0, m, p, np.ones(len(p)), recs.scores(rows)) if len(p) else pl_._empty_groups()
    n = _save_drops(work, work.step("exact") / f"bucket-{shard:05d}", recs, rows, *g, np.ones(len(g[0])),
                    ["normalized text"] * len(g[0]))
    return {"dropped": n}


def exact_buckets(keys: np.ndarray, buckets: int) -> np.ndarray:
    """The exact bucket of each key (every record with one normalized text lands in one bucket)."""
    return (keys % np.uint64(buckets)).astype(np.int64)


# ----------------------------------------------------------------- components

def _component_nodes(pairs: np.ndarray):
    nodes = np.unique(pairs)
    return nodes, np.searchsorted(nodes, pairs)


def step_minhash_group(work: DedupWork, s: DedupSettings, shard: int, bounds: list, parts: int, n_nodes: int,
                       counts: list, inputs: dict) -> dict:
    recs = Records(work, bounds, s)
    pairs, sims = graph.group_edges(work, "minhash", shard, parts, n_nodes)
    nodes, lp = _component_nodes(pairs)
    rec = recs.of_nodes("exact", counts, nodes)
    g = pl_._groups(0, len(nodes), lp, sims, recs.scores(rec))
    offsets, values = load_array(inputs["offsets"]), load_array(inputs["values"])
    rep_sim = mh.jaccard(offsets, values, np.stack([nodes[g[0]], nodes[g[1]]], 1)) if len(g[0]) else np.zeros(0)
    n = _save_drops(work, work.group("minhash", shard), recs, rec, *g, rep_sim, ["jaccard"] * len(g[0]))
    return {"dropped": n, "pairs": len(pairs)}


def step_embedding_uncertain(work: DedupWork, s: DedupSettings, shard: int, parts: int, n_nodes: int) -> dict:
    pairs, sims = graph.group_edges(work, "embedding", shard, parts, n_nodes)
    unc = sims < s.static_accept_cosine
    d = work.step("embedding-uncertain") / f"shard-{shard:05d}"
    save_array(d / "pairs.npy", pairs[unc])
    save_array(d / "sims.npy", sims[unc])
    return {"uncertain": int(unc.sum())}


class _NodeTexts:
    """texts[node] for `_confirm`, read on demand."""

    def __init__(self, recs: Records, alive_step: str, counts: list):
        self.recs, self.alive_step, self.counts = recs, alive_step, counts

    def __getitem__(self, node: int) -> str:
        return self.recs.texts(self.recs.of_nodes(self.alive_step, self.counts, np.array([node])))[0]


def step_confirm(work: DedupWork, s: DedupSettings, bounds: list, groups: int, n_nodes: int, alive_step: str,
                 counts: list) -> dict:
    """The full-model budget over every group's uncertain edges, in the order of one merged search."""
    folders = [work.step("embedding-uncertain") / f"shard-{g:05d}" for g in range(groups)]
    pairs = np.concatenate([np.zeros((0, 2), np.int64)] + [np.asarray(load_array(f / "pairs.npy")).reshape(-1, 2)
                                                           for f in folders])
    sims = np.concatenate([np.zeros(0)] + [np.asarray(load_array(f / "sims.npy")) for f in folders])
    order = np.argsort(pairs[:, 0] * n_nodes + pairs[:, 1], kind="stable")
    pairs, sims = pairs[order], sims[order]
    if s.confirm:
        texts = _NodeTexts(Records(work, bounds, s), alive_step, counts)
        (ch, cos), _ = pl_._confirm(pairs, sims, s, empty_data(s), texts, 0)
    else:
        ch, cos = np.zeros(0, np.int64), np.zeros(0)
    codes = pairs[ch, 0] * n_nodes + pairs[ch, 1]
    order = np.argsort(codes)
    d = work.step("confirm")
    save_array(d / "codes.npy", codes[order])
    save_array(d / "cos.npy", np.asarray(cos, np.float64)[order])
    return {"embedding_confirm_checked": len(ch) if s.confirm else 0,
            "embedding_confirmed": int((np.asarray(cos) >= s.cosine_threshold).sum()) if s.confirm else 0,
            "confirm_ran": bool(s.confirm)}


def step_embedding_group(work: DedupWork, s: DedupSettings, shard: int, bounds: list, parts: int, n_nodes: int,
                         alive_step: str, counts: list, inputs: dict) -> dict:
    """`_accept_edges` + `_embedding_groups` of tasks/dedup/pipeline.py on group shard `shard`'s components."""
    recs = Records(work, bounds, s)
    pairs, sims = graph.group_edges(work, "embedding", shard, parts, n_nodes)
    sure = sims >= s.static_accept_cosine
    unc = np.flatnonzero(~sure)
    detail = np.array(["static"] * len(pairs), dtype=object)
    keep_edge, fsim = sure.copy(), sims.astype(np.float64)
    if s.confirm:
        codes, cos = load_array(work.step("confirm") / "codes.npy"), load_array(work.step("confirm") / "cos.npy")
        q = pairs[unc, 0] * n_nodes + pairs[unc, 1]
        pos = np.minimum(np.searchsorted(codes, q), max(len(codes) - 1, 0))
        hit = np.flatnonzero(codes[pos] == q) if len(codes) else np.zeros(0, np.int64)
        keep_edge[unc[hit]] = cos[pos[hit]] >= s.cosine_threshold
        fsim[unc[hit]] = cos[pos[hit]]
        detail[unc[hit]] = "full"
    nodes, lp = _component_nodes(pairs)
    rec = recs.of_nodes(alive_step, counts, nodes)
    guarded = 0
    if s.number_guard:
        weak = np.flatnonzero(keep_edge & (detail == "static") & (fsim < s.static_chain_cosine))
        need = np.unique(lp[weak])
        text = dict(zip(need.tolist(), recs.texts(rec[need])))
        bad = weak[pl_.numbers_substituted(lp[weak], text.__getitem__)]
        keep_edge[bad] = False
        guarded = len(bad)
    p, fs, dt_ = lp[keep_edge], fsim[keep_edge], detail[keep_edge]
    g = pl_._embedding_groups(0, len(nodes), p, fs, dt_, s, recs.scores(rec))
    E = load_array(inputs["E"])
    rep_sim = np.einsum("ij,ij->i", E[nodes[g[0]]], E[nodes[g[1]]]) if len(g[0]) else np.zeros(0)
    detail_out = pl_._edge_detail(p, dt_, g[0], g[2], len(nodes))
    n = _save_drops(work, work.group("embedding", shard), recs, rec, *g, rep_sim, detail_out)
    return {"dropped": n, "embedding_candidates": len(sims), "embedding_static_accepted": int(sure.sum()),
            "embedding_uncertain": len(unc), "embedding_number_guarded": guarded}


# ----------------------------------------------------------------- collect

def step_collect(work: DedupWork, s: DedupSettings, shard: int, phase: str, bounds: list, prev: str | None,
                 senders: list[str]) -> dict:
    """Record shard `shard` after `phase`: its drops (from every sender folder), in record order, and its alive
    mask (the previous phase's, less the drops)."""
    a, b = bounds[shard]
    got = [load_grouped(work.root / f, shard, ("drops",))["drops"].reshape(-1, len(_DROP_COLS)) for f in senders]
    t = np.concatenate([np.zeros((0, len(_DROP_COLS)))] + got)
    t = t[np.argsort(t[:, 0], kind="stable")]
    cols = {k: t[:, i] for i, k in enumerate(_DROP_COLS)}
    for k in ("row", "dup_row", "matched_row", "detail"):
        cols[k] = cols[k].astype(np.int64)
    order = cols["row"]
    alive = np.ones(b - a, bool) if prev is None else np.array(load_array(work.alive(prev, shard)))
    alive[cols["row"].astype(np.int64) - a] = False
    table = pa.table({"row": pa.array(cols["row"], pa.int64()), "dup_row": pa.array(cols["dup_row"], pa.int64()),
                      "method": pa.array([phase] * len(order), pa.string()),
                      "similarity": pa.array(cols["similarity"], pa.float64()),
                      "matched_row": pa.array(cols["matched_row"], pa.int64()),
                      "matched_similarity": pa.array(cols["matched_similarity"], pa.float64()),
                      "detail": pa.array([DETAILS[int(c)] for c in cols["detail"]], pa.string())})
    write_table(work.drops(phase, shard), table)
    save_array(work.alive(phase, shard), alive)
    return {"dropped": len(order), "alive": int(alive.sum())}
