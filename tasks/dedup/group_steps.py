"""The deciding steps of the dedup engine (tasks/dedup/plan.py): one per exact bucket or group shard, then one per
record shard.

    exact/bucket-b         the records whose exact key falls in bucket b (every shard's prep, and the history,
                           wrote them sorted by bucket): exact groups, representatives (`dedup.keep`), drops
    minhash-group/shard-g  group shard g's components (tasks/dedup/graph.py): representatives, drops, Jaccard
    embedding-uncertain/shard-g   group shard g's edges the static model is unsure of (below
                           static_accept_cosine)
    confirm                the uncertain edges of every group in the order of one merged search: the full-model
                           budget (`max_confirm_records`) spent highest static cosine first; the only one-task
                           step here, and it holds the uncertain edges and that budget only
    embedding-group/shard-g  the confirmations applied, the number guard, the leader grouping, drops
    collect/shard-s        record shard s: its records dropped by the phase, in record order, and its alive mask

A group's drops are record numbers (an indexed record h is -(h + 1)), sorted by record shard; names are resolved
when the decisions are read (`distributed.decisions`). Every function here applies the rules of
tasks/dedup/rules.py to a bucket's records or a group's components, renumbered in record order with the indexed
records first, which keeps the order every tie-break uses.
"""

from __future__ import annotations

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.dedup_work import (
    DedupWork,
    PackedStrings,
    load_array,
    load_grouped,
    load_named,
    release,
    save_array,
    save_arrays,
    save_grouped,
)
from evolforge.tasks.dedup import graph
from evolforge.tasks.dedup import minhash as mh
from evolforge.tasks.dedup.index import empty_data
from evolforge.tasks.dedup.normalize import exact_groups
from evolforge.tasks.dedup.plan import (
    Collect,
    Confirm,
    EmbeddingGroup,
    EmbeddingUncertain,
    Exact,
    MinhashGroup,
    StepEnv,
)
from evolforge.tasks.dedup.rules import _confirm, _edge_detail, _embedding_groups, _groups, numbers_substituted

DETAILS = ("normalized text", "jaccard", "static", "full")
_DROP_COLS = ("row", "dup_row", "matched_row", "similarity", "matched_similarity", "detail")


class Records:
    """Single records of the work folder, read from memory-mapped arrays: scores and texts by record number (an
    indexed record h is -(h + 1)), and the record numbers of a phase's nodes (the `hist` indexed records, then
    the records alive, in order)."""

    def __init__(self, work: DedupWork, bounds: list, s: DedupSettings, hist: int = 0):
        self.work, self.s, self.hist = work, s, hist
        self.starts = np.array([a for a, _ in bounds] + [bounds[-1][1]], np.int64)
        self._texts: dict[int, PackedStrings] = {}

    def _shards(self, rows: np.ndarray):
        k = np.searchsorted(self.starts, rows, side="right") - 1
        for r in np.unique(k).tolist():
            yield r, np.flatnonzero(k == r)

    def scores(self, rows: np.ndarray) -> np.ndarray | None:
        """keep="best": the scores (NaN -> -inf) of these (new) records; else None."""
        if self.s.keep != "best":
            return None
        out = np.empty(len(rows), np.float64)
        for k, sel in self._shards(rows):
            out[sel] = self.work.record_scores(k)[rows[sel] - self.starts[k]]
        return out

    def texts(self, rows: np.ndarray) -> list[str]:
        rows = np.asarray(rows, np.int64)
        out: list[str] = [""] * len(rows)
        old = np.flatnonzero(rows < 0)
        if len(old):
            if -1 not in self._texts:
                self._texts[-1] = PackedStrings(self.work.history, "texts")
            for i, t in zip(old.tolist(), self._texts[-1].take(-rows[old] - 1)):
                out[i] = t
        new = np.flatnonzero(rows >= 0)
        for k, sel in self._shards(rows[new]):
            if k not in self._texts:
                self._texts[k] = self.work.record_strings(k, "texts")
            for i, t in zip(new[sel].tolist(), self._texts[k].take(rows[new][sel] - self.starts[k])):
                out[i] = t
        return out

    def of_nodes(self, phase_alive: str, counts: list[int], nodes: np.ndarray) -> np.ndarray:
        """The record numbers of nodes of a phase whose new records are those alive after `phase_alive`
        (`counts`: alive per record shard), after the `hist` indexed ones."""
        nodes = np.asarray(nodes, np.int64)
        base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64) + self.hist
        out = np.where(nodes < self.hist, -(nodes + 1), 0)
        k = np.searchsorted(base, nodes, side="right") - 1
        for r in np.unique(k[nodes >= self.hist]).tolist():
            sel = np.flatnonzero((k == r) & (nodes >= self.hist))
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


def _split_at(nodes: np.ndarray, hist: int) -> int:
    """How many of the (sorted) nodes are indexed records."""
    return int(np.searchsorted(nodes, hist))


# ----------------------------------------------------------------- exact

def step_exact_bucket(env: StepEnv, st: Exact) -> dict:
    """Exact bucket `st.shard`: the records of every record shard whose exact key falls in it, after the indexed
    records of that bucket (a new record with an indexed record's key is its duplicate: the earliest one)."""
    work, b = env.work, st.shard
    recs = Records(work, st.bounds, env.s, st.hist)
    rows, keys, norms = [], [], []
    for k in range(len(st.bounds)):
        got = load_grouped(work.bucketed(k), b, ("rows", "keys"), strings=("norms",))
        rows.append(got["rows"])
        keys.append(got["keys"])
        norms.extend(got["norms"])
    rows = np.concatenate([np.zeros(0, np.int64)] + rows)
    keys = np.concatenate([np.zeros(0, np.uint64)] + keys)
    old = load_grouped(work.bucketed(None), b, ("rows", "keys")) if st.hist else \
        {"rows": np.zeros(0, np.int64), "keys": np.zeros(0, np.uint64)}
    Hb, m = len(old["rows"]), len(rows)
    pairs = []
    if Hb:   # the earliest indexed record of each key
        order = np.argsort(old["keys"], kind="stable")
        pos = np.minimum(np.searchsorted(old["keys"][order], keys), Hb - 1)
        hit = old["keys"][order][pos] == keys
        pairs.append(np.stack([order[pos[hit]], Hb + np.flatnonzero(hit)], 1))
    first = exact_groups(keys, norms)
    own = np.flatnonzero(first != np.arange(m))
    pairs.append(np.stack([Hb + first[own], Hb + own], 1))
    p = np.concatenate(pairs).astype(np.int64)
    g = _groups(Hb, Hb + m, p, np.ones(len(p)), recs.scores(rows))
    rec = np.concatenate([-(np.asarray(old["rows"], np.int64) + 1), rows])
    n = _save_drops(work, work.bucket(b), recs, rec, *g, np.ones(len(g[0])), ["normalized text"] * len(g[0]))
    return {"dropped": n}


def exact_buckets(keys: np.ndarray, buckets: int) -> np.ndarray:
    """The exact bucket of each key (every record with one normalized text lands in one bucket)."""
    return (keys % np.uint64(buckets)).astype(np.int64)


# ----------------------------------------------------------------- components

def _component_nodes(pairs: np.ndarray):
    nodes = np.unique(pairs)
    return nodes, np.searchsorted(nodes, pairs)


def step_minhash_group(env: StepEnv, st: MinhashGroup) -> dict:
    recs = Records(env.work, st.bounds, env.s, st.hist)
    pairs, sims = graph.group_edges(env.work, "minhash", st.shard, st.parts, st.n_nodes)
    nodes, lp = _component_nodes(pairs)
    rec = recs.of_nodes("exact", st.counts, nodes)
    h = _split_at(nodes, st.hist)
    g = _groups(h, len(nodes), lp, sims, recs.scores(rec[h:]))
    offsets, values = load_array(st.inputs["offsets"]), load_array(st.inputs["values"])
    rep_sim = mh.jaccard(offsets, values, np.stack([nodes[g[0]], nodes[g[1]]], 1)) if len(g[0]) else np.zeros(0)
    n = _save_drops(env.work, env.work.group("minhash", st.shard), recs, rec, *g, rep_sim, ["jaccard"] * len(g[0]))
    if len(st.bounds) == 1:   # the one group step, the shared arrays' last reader: an in-memory folder drops them
        del offsets, values
        release(*st.inputs.values())
    return {"dropped": n, "pairs": len(pairs)}


def step_embedding_uncertain(env: StepEnv, st: EmbeddingUncertain) -> dict:
    pairs, sims = graph.group_edges(env.work, "embedding", st.shard, st.parts, st.n_nodes)
    unc = sims < env.s.static_accept_cosine
    save_arrays(env.work.uncertain(st.shard), {"pairs": pairs[unc], "sims": sims[unc]})
    return {"uncertain": int(unc.sum())}


class _NodeTexts:
    """new_texts[i] for `_confirm`: the text of the phase's node hist + i, read on demand."""

    def __init__(self, recs: Records, alive_step: str, counts: list):
        self.recs, self.alive_step, self.counts = recs, alive_step, counts

    def __getitem__(self, i: int) -> str:
        return self.recs.texts(self.recs.of_nodes(self.alive_step, self.counts, np.array([self.recs.hist + i])))[0]


class _Indexed:
    """The indexed records as `_confirm` reads them: texts by row (on demand) and the full-model vectors."""

    def __init__(self, work: DedupWork):
        got = load_named(work.history, "full_rows", "full_vecs")
        self.full = {int(r): np.asarray(v) for r, v in zip(np.asarray(got["full_rows"]).tolist(), got["full_vecs"])}
        self._texts = PackedStrings(work.history, "texts")
        self.texts = self

    def __getitem__(self, row: int) -> str:
        return self._texts.take([row])[0]


def step_confirm(env: StepEnv, st: Confirm) -> dict:
    """The full-model budget over every group's uncertain edges, in the order of one merged search; the cosines
    by pair code, and the vectors computed (for the index)."""
    s, work = env.s, env.work
    folders = [load_named(work.uncertain(g), "pairs", "sims") for g in range(st.groups)]
    pairs = np.concatenate([np.zeros((0, 2), np.int64)] + [np.asarray(f["pairs"]).reshape(-1, 2) for f in folders])
    sims = np.concatenate([np.zeros(0)] + [np.asarray(f["sims"]) for f in folders])
    order = np.argsort(pairs[:, 0] * st.n_nodes + pairs[:, 1], kind="stable")
    pairs, sims = pairs[order], sims[order]
    full: dict = {}
    if s.confirm:
        recs = Records(work, st.bounds, s, st.hist)
        indexed = _Indexed(work) if st.hist else empty_data(s)
        (ch, cos), full = _confirm(pairs, sims, s, indexed, _NodeTexts(recs, st.alive_step, st.counts), st.hist,
                                   env.encoder)
    else:
        ch, cos = np.zeros(0, np.int64), np.zeros(0)
    codes = pairs[ch, 0] * st.n_nodes + pairs[ch, 1]
    order = np.argsort(codes)
    nodes = np.array(sorted(full), np.int64)
    save_arrays(work.confirmed, {"codes": codes[order], "cos": np.asarray(cos, np.float64)[order], "full_nodes": nodes,
                                 "full_vecs": np.stack([full[int(x)] for x in nodes]) if len(nodes)
                                 else np.zeros((0, 0), np.float32)})
    return {"embedding_confirm_checked": len(ch) if s.confirm else 0,
            "embedding_confirmed": int((np.asarray(cos) >= s.cosine_threshold).sum()) if s.confirm else 0,
            "confirm_ran": bool(s.confirm)}


def step_embedding_group(env: StepEnv, st: EmbeddingGroup) -> dict:
    """The static acceptance, the confirmations, the number guard and `_embedding_groups` on group shard
    `st.shard`'s components."""
    s, work = env.s, env.work
    recs = Records(work, st.bounds, s, st.hist)
    pairs, sims = graph.group_edges(work, "embedding", st.shard, st.parts, st.n_nodes)
    sure = sims >= s.static_accept_cosine
    unc = np.flatnonzero(~sure)
    detail = np.array(["static"] * len(pairs), dtype=object)
    keep_edge, fsim = sure.copy(), sims.astype(np.float64)
    if s.confirm:
        got = load_named(work.confirmed, "codes", "cos")
        codes, cos = got["codes"], got["cos"]
        q = pairs[unc, 0] * st.n_nodes + pairs[unc, 1]
        pos = np.minimum(np.searchsorted(codes, q), max(len(codes) - 1, 0))
        hit = np.flatnonzero(codes[pos] == q) if len(codes) else np.zeros(0, np.int64)
        keep_edge[unc[hit]] = cos[pos[hit]] >= s.cosine_threshold
        fsim[unc[hit]] = cos[pos[hit]]
        detail[unc[hit]] = "full"
    nodes, lp = _component_nodes(pairs)
    rec = recs.of_nodes(st.alive_step, st.counts, nodes)
    guarded = 0
    if s.number_guard:  # weak static-only pairs whose numbers were substituted are distinct tasks
        weak = np.flatnonzero(keep_edge & (detail == "static") & (fsim < s.static_chain_cosine))
        need = np.unique(lp[weak])
        text = dict(zip(need.tolist(), recs.texts(rec[need])))
        bad = weak[numbers_substituted(lp[weak], text.__getitem__)]
        keep_edge[bad] = False
        guarded = len(bad)
    p, fs, dt_ = lp[keep_edge], fsim[keep_edge], detail[keep_edge]
    h = _split_at(nodes, st.hist)
    g = _embedding_groups(h, len(nodes), p, fs, dt_, s, recs.scores(rec[h:]))
    E = load_array(st.inputs["E"])
    rep_sim = np.einsum("ij,ij->i", E[nodes[g[0]]], E[nodes[g[1]]]) if len(g[0]) else np.zeros(0)
    detail_out = _edge_detail(p, dt_, g[0], g[2], len(nodes))
    n = _save_drops(work, work.group("embedding", st.shard), recs, rec, *g, rep_sim, detail_out)
    return {"dropped": n, "embedding_candidates": len(sims), "embedding_static_accepted": int(sure.sum()),
            "embedding_uncertain": len(unc), "embedding_number_guarded": guarded}


# ----------------------------------------------------------------- collect

def step_collect(env: StepEnv, st: Collect) -> dict:
    """Record shard `st.shard` after `st.phase`: its drops (from every sender folder), in record order, and its
    alive mask (the previous phase's, less the drops)."""
    work = env.work
    a, b = st.bounds[st.shard]
    got = [load_grouped(work.drop_sender(st.phase, i), st.shard, ("drops",))["drops"].reshape(-1, len(_DROP_COLS))
           for i in range(st.senders)]
    t = np.concatenate([np.zeros((0, len(_DROP_COLS)))] + got)
    t = t[np.argsort(t[:, 0], kind="stable")]
    alive = np.ones(b - a, bool) if st.prev is None else np.array(load_array(work.alive(st.prev, st.shard)))
    alive[t[:, 0].astype(np.int64) - a] = False
    save_array(work.drops(st.phase, st.shard), t)
    save_array(work.alive(st.phase, st.shard), alive)
    return {"dropped": len(t), "alive": int(alive.sum())}


def read_drops(work: DedupWork, phase: str, shard: int) -> dict[str, list]:
    """Record shard `shard`'s drops by `phase` in record order, by column: row, dup_row, matched_row (record
    numbers), similarity, matched_similarity, detail. Flat lists of numbers, not a container per drop: a large
    dedup's process holds many objects, which every collection of the garbage collector that a container per drop
    set off would walk."""
    t = np.asarray(load_array(work.drops(phase, shard), mmap=False)).reshape(-1, len(_DROP_COLS))
    ints = t[:, [0, 1, 2, 5]].astype(np.int64)
    return {"row": ints[:, 0].tolist(), "dup_row": ints[:, 1].tolist(), "matched_row": ints[:, 2].tolist(),
            "similarity": t[:, 3].tolist(), "matched_similarity": t[:, 4].tolist(),
            "detail": [DETAILS[c] for c in ints[:, 3].tolist()]}
