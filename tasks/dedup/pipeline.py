"""Deduplicate texts: exact -> MinHash+LSH -> embeddings, optionally against a persistent index.

`dedup(texts, ids, settings, index_dir)` returns the kept ids and one row per
dropped record saying why: `duplicate_of` (the kept representative of its
group), `method` (exact | minhash | embedding), `similarity` (to that
representative: 1.0, exact Jaccard, or static-model cosine), `matched_id` and
`matched_similarity` (the strongest verified edge that linked it; Jaccard, or
the static cosine, or the full-model cosine when `detail` is "full").

Each method groups the records still alive by connected components of its
verified pairs (union-find) and keeps one per group: keep="earliest" keeps the
lowest input order (indexed records count as earlier than new ones), keep="best"
the highest score (ties: earliest); a group with an indexed record keeps that.
Groups are transitive: a dropped record's similarity to the kept one can be
below the threshold when it was linked through a chain (matched_* shows the link).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.tasks.core import progress as live_progress
from evolforge.tasks.dedup import embedding as emb
from evolforge.tasks.dedup import minhash as mh
from evolforge.tasks.dedup import shards as sh
from evolforge.tasks.dedup.index import DedupIndex, empty_data, index_lock
from evolforge.tasks.dedup.normalize import exact_groups, exact_keys, normalize_many

_ENCODERS: dict[tuple, object] = {}


@dataclass
class DedupResult:
    kept_ids: list[str]
    dropped: list[dict]                       # id, duplicate_of, method, similarity, matched_id, matched_similarity, detail
    stats: dict = field(default_factory=dict)


def components(n: int, pairs: np.ndarray) -> np.ndarray:
    """Connected components (vectorized union-find: min-label hooking + pointer jumping); label = smallest member."""
    parent = np.arange(n)
    if len(pairs) == 0:
        return parent
    i, j = pairs[:, 0], pairs[:, 1]
    while True:
        pi, pj = parent[i], parent[j]
        if np.array_equal(pi, pj):
            return parent
        lo = np.minimum(pi, pj)
        np.minimum.at(parent, pi, lo)
        np.minimum.at(parent, pj, lo)
        while True:
            nxt = parent[parent]
            if np.array_equal(nxt, parent):
                break
            parent = nxt


def _keep_rank(n_hist: int, n: int, scores: np.ndarray | None) -> np.ndarray:
    """Keep order of nodes (0 = kept first): history first, then keep="earliest" by index, keep="best" by score
    (ties: earliest)."""
    if scores is None:
        return np.arange(n)
    sc = np.concatenate([np.full(n_hist, np.inf), scores])
    rank = np.empty(n, np.int64)
    rank[np.lexsort((np.arange(n), -sc))] = np.arange(n)
    return rank


def _representatives(n_hist: int, n: int, lab: np.ndarray, scores: np.ndarray | None) -> np.ndarray:
    """The representative of each node's component `lab` (label = smallest member): its member first in keep order."""
    if scores is None:
        return lab.copy()
    rank = _keep_rank(n_hist, n, scores)
    order = np.lexsort((rank, lab))
    first = np.concatenate([[True], lab[order][1:] != lab[order][:-1]])
    winner = np.empty(n, np.int64)
    winner[lab[order][first]] = order[first]
    return winner[lab]


def _drops(n_hist: int, n: int, pairs: np.ndarray, sims: np.ndarray, rep: np.ndarray):
    """(dropped nodes, their representative, best matched node, its similarity): nodes >= n_hist in a pair whose
    representative is another node."""
    in_pair = np.zeros(n, bool)
    in_pair[pairs.ravel()] = True
    drop = np.flatnonzero(in_pair & (rep != np.arange(n)) & (np.arange(n) >= n_hist))
    a = np.concatenate([pairs[:, 0], pairs[:, 1]])
    b = np.concatenate([pairs[:, 1], pairs[:, 0]])
    s = np.concatenate([sims, sims])
    order = np.lexsort((-s, a))
    head = np.concatenate([[True], a[order][1:] != a[order][:-1]])
    best_nb = np.full(n, -1)
    best_s = np.zeros(n)
    best_nb[a[order][head]] = b[order][head]
    best_s[a[order][head]] = s[order][head]
    return drop, rep[drop], best_nb[drop], best_s[drop]


def _empty_groups():
    e = np.zeros(0, np.int64)
    return e, e, e, np.zeros(0)


def _groups(n_hist: int, n: int, pairs: np.ndarray, sims: np.ndarray, scores: np.ndarray | None):
    """Connected components of `pairs`, one representative each: (dropped nodes, their representative, best
    matched node, its similarity) for nodes >= n_hist (keep="best": history nodes always win, ties by lowest index)."""
    if len(pairs) == 0:
        return _empty_groups()
    return _drops(n_hist, n, pairs, sims, _representatives(n_hist, n, components(n, pairs), scores))


def leaders(n: int, pairs: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Leader (star) grouping: the greedy maximal independent set in `rank` order (lower rank first).

    Walking the nodes in rank order, a node with no earlier leader among its neighbours becomes a
    leader; a node next to one becomes its follower. Computed in rounds over the edges (a node is
    decided once all its earlier neighbours are), not a loop per node. Returns True for leaders
    (nodes without edges included)."""
    state = np.ones(n, np.int8)  # 1 leader, 2 follower, 0 undecided
    if len(pairs) == 0:
        return state == 1
    a, b = pairs[:, 0], pairs[:, 1]
    swap = rank[a] > rank[b]
    u, v = np.where(swap, b, a), np.where(swap, a, b)   # u comes before v
    state[u] = 0
    state[v] = 0
    while len(u):
        und_u = state[u]
        led = np.zeros(n, bool)
        led[v[und_u == 1]] = True       # an earlier neighbour leads: follower
        state[(state == 0) & led] = 2
        blocked = np.zeros(n, bool)
        blocked[v[state[u] != 2]] = True  # an earlier neighbour is undecided (or leads): wait
        state[(state == 0) & ~blocked] = 1
        live = state[v] == 0            # edges into decided nodes are done
        u, v = u[live], v[live]
    return state == 1


def _leader_groups(n_hist: int, n: int, strong: np.ndarray, weak: np.ndarray, pairs: np.ndarray, sims: np.ndarray,
                   scores: np.ndarray | None):
    """_groups without chains through weak edges: cores are the connected components of the `strong` edges (each
    keeps its representative as _groups does); a weak edge never chains: it drops a whole core into a directly
    adjacent earlier core's representative (leader grouping over the cores in keep order)."""
    if len(pairs) == 0:
        return _empty_groups()
    sp = pairs[strong]
    lab = components(n, sp)
    rep = _representatives(n_hist, n, lab, scores)   # each core's own representative
    wp = lab[pairs[weak]]
    ws = sims[weak]
    wp, ws = wp[wp[:, 0] != wp[:, 1]], ws[wp[:, 0] != wp[:, 1]]
    # a core's rank is its representative's keep order (history first; "best": highest score, ties earliest)
    rank = _keep_rank(n_hist, n, scores)[rep]
    lead = leaders(n, wp, rank)
    # a follower core joins the most similar leader core it touches (ties: the earlier one)
    u, v = wp[:, 0], wp[:, 1]
    fl = np.concatenate([v[lead[u] & ~lead[v]], u[lead[v] & ~lead[u]]])
    ld = np.concatenate([u[lead[u] & ~lead[v]], v[lead[v] & ~lead[u]]])
    fs = np.concatenate([ws[lead[u] & ~lead[v]], ws[lead[v] & ~lead[u]]])
    core_rep = np.arange(n)
    if len(fl):
        order = np.lexsort((rank[ld], -fs, fl))
        head = np.concatenate([[True], fl[order][1:] != fl[order][:-1]])
        core_rep[fl[order][head]] = ld[order][head]
    final = rep[core_rep[lab]]
    return _drops(n_hist, n, pairs, sims, final)


_NUMBER = re.compile(r"\d+")


def _one_edit(x: str, y: str) -> bool:
    """x and y differ by at most one edit (a replaced, dropped or added character, or two neighbours swapped)."""
    if x == y:
        return True
    if len(x) == len(y):
        d = [k for k in range(len(x)) if x[k] != y[k]]
        return len(d) == 1 or (len(d) == 2 and d[1] == d[0] + 1 and x[d[0]] == y[d[1]] and x[d[1]] == y[d[0]])
    if abs(len(x) - len(y)) > 1:
        return False
    short, long_ = (x, y) if len(x) < len(y) else (y, x)
    return any(long_[:k] + long_[k + 1:] == short for k in range(len(long_)))


def numbers_substituted(pairs: np.ndarray, text_of) -> np.ndarray:
    """For each pair, whether numbers (digit runs) were substituted between its two texts: more than one number
    of either text missing from the other while the other has its own instead, or one number replaced by one
    that is not a typo of it (see `dedup.number_guard`). Numbers only added or only removed are not."""
    cache: dict[int, Counter] = {}

    def nums(x: int) -> Counter:
        c = cache.get(x)
        if c is None:
            c = cache[x] = Counter(_NUMBER.findall(text_of(x)))
        return c

    out = np.zeros(len(pairs), bool)
    for k, (a, b) in enumerate(pairs.tolist()):
        A, B = nums(a), nums(b)
        if A == B:
            continue
        x, y = A - B, B - A
        if not x or not y:
            continue
        if sum(x.values()) == 1 and sum(y.values()) == 1 and _one_edit(next(iter(x)), next(iter(y))):
            continue
        out[k] = True
    return out


def _embedding_groups(n_hist: int, n: int, pairs: np.ndarray, sims: np.ndarray, detail: np.ndarray, s: DedupSettings,
                      scores: np.ndarray | None):
    """The embedding stage's groups (see `dedup.embedding_grouping`): static-only edges below
    static_chain_cosine are weak (no chains); full-model-confirmed edges and surer static ones are strong."""
    if s.embedding_grouping == "components":
        return _groups(n_hist, n, pairs, sims, scores)
    strong = (detail == "full") | (sims >= s.static_chain_cosine)
    return _leader_groups(n_hist, n, strong, ~strong, pairs, sims, scores)


def _encoder(kind: str, settings: DedupSettings):
    key = (kind, str(emb.model_dir(settings)), str(emb.static_cache_dir(settings)), settings.static_dim,
           settings.max_seq_length, settings.batch_size)
    if key not in _ENCODERS:
        _ENCODERS[key] = emb.StaticEncoder(settings) if kind == "static" else emb.FullEncoder(settings)
    return _ENCODERS[key]


def dedup(texts: Sequence[str] | Sequence[Mapping], ids: Sequence[str] | None = None, settings: DedupSettings | None = None,
          index_dir: str | Path | None = None, scores: Sequence[float] | None = None, text_field: str = "text",
          index_source: Mapping | None = None, shard_runner: sh.ShardRunner | None = None,
          progress: bool = False) -> DedupResult:
    """Deduplicate `texts` (strings, or records whose `text_field` holds the text) in input order,
    and against the index in `index_dir` (created if missing), which then receives the kept records.
    `ids` default to "0", "1", ...; `scores` are needed for keep="best".

    With an index, the whole call (load, dedup, append) holds the index lock (`index.index_lock`), so
    flows sharing the index take turns; `index_source` ({"run", "source", "round"}) tags the appended
    segment for `index.rollback_index`.

    The MinHash and embedding searches run in `dedup.shards` shards (tasks/dedup/shards.py) on `shard_runner`
    (default: in this process, one after the other); the decisions do not depend on where they ran.
    With `progress`, each finished step is published as a "dedup" progress (tasks/core/progress.py: the
    CLI's progress bar)."""
    s = settings or DedupSettings()
    if index_dir is None:
        return _dedup(texts, ids, s, None, scores, text_field, None, shard_runner, progress)
    if s.embedding:
        _encoder("static", s)  # load (or build) the model before taking the lock: others need not wait for it
    with index_lock(index_dir, s):
        return _dedup(texts, ids, s, index_dir, scores, text_field, index_source, shard_runner, progress)


def _dedup(texts, ids, s: DedupSettings, index_dir, scores, text_field: str, index_source: Mapping | None,
           shard_runner: sh.ShardRunner | None = None, progress: bool = False) -> DedupResult:
    n = len(texts)
    texts = [t.get(text_field) if isinstance(t, Mapping) else t for t in texts]
    texts = ["" if t is None else str(t) for t in texts]
    ids = [str(i) for i in range(n)] if ids is None else [str(i) for i in ids]
    if len(ids) != n or len(set(ids)) != n:
        raise ValueError("ids must be unique and one per text")
    sc = None
    if s.keep == "best":
        if scores is None or len(scores) != n:
            raise ValueError("keep='best' needs one score per text")
        sc = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf)
    static = _encoder("static", s) if s.embedding else None
    dim = static.dim if static else 0
    index = DedupIndex(index_dir, s, static.fingerprint if static else "") if index_dir else None
    hist = index.load(dim) if index else empty_data(s, dim)
    H = len(hist)
    alive = np.ones(n, bool)
    dropped: list[dict] = []
    stats: dict = {"records": n, "indexed_before": H, "seconds": {}}
    steps = [m for m in ("exact", "minhash", "embedding") if getattr(s, m)] + (["index"] if index else [])
    bar = live_progress.StepProgress("dedup", len(steps), unit="steps") if progress else None

    def step_done(name: str) -> None:
        if bar is not None and name in steps:
            left = steps[steps.index(name) + 1:]
            bar.update(advance=1, detail=f"{name}: {stats.get('dropped_' + name, 0):,} dropped"
                       + (f"; next {left[0]} ({int(alive.sum()):,} records left)" if left else ""))

    if bar is not None:
        bar.update(detail=f"{n:,} records: {steps[0] if steps else 'nothing to do'}")

    def record(method, nodes_alive, drop, rep, nb, nb_s, rep_sim, detail):
        name = lambda node: hist.ids[node] if node < H else ids[nodes_alive[node - H]]  # noqa: E731
        for d, r, m, ms, rs, dt in zip(drop, rep, nb, nb_s, rep_sim, detail):
            k = int(nodes_alive[d - H])
            alive[k] = False
            dropped.append({"id": ids[k], "duplicate_of": name(int(r)), "method": method, "similarity": round(float(rs), 6),
                            "matched_id": name(int(m)), "matched_similarity": round(float(ms), 6), "detail": dt})
        stats[f"dropped_{method}"] = len(drop)

    t0 = time.perf_counter()
    norms = normalize_many(texts, s)
    keys = exact_keys(norms)
    if s.exact:
        live = np.flatnonzero(alive)
        hk = hist.exact
        order = np.argsort(hk, kind="stable")
        pos = np.minimum(np.searchsorted(hk[order], keys), max(H - 1, 0))
        hit = (hk[order][pos] == keys) if H else np.zeros(n, bool)
        first = exact_groups(keys, norms)
        pairs = [np.stack([order[pos[hit]], H + np.flatnonzero(hit)], 1)] if H else []
        own = np.flatnonzero(first != np.arange(n))
        pairs.append(np.stack([H + first[own], H + own], 1))
        p = np.concatenate(pairs).astype(np.int64)
        g = _groups(H, H + n, p, np.ones(len(p)), None if sc is None else sc[live])
        record("exact", live, *g, np.ones(len(g[0])), ["normalized text"] * len(g[0]))
    stats["seconds"]["exact"] = time.perf_counter() - t0
    step_done("exact")

    t0 = time.perf_counter()
    sk_rows = np.full(n, -1)   # row of each live record in `allsk` (history rows first)
    allsk = None
    if s.minhash:
        live = np.flatnonzero(alive)
        # history rows are copied in first (no concatenation of history + new afterwards)
        allsk = mh.sketch_many([norms[i] for i in live], s, prefix=hist.sketches if H else None)
        hist.sketches = mh.empty_sketches(s)
        sk_rows[live] = H + np.arange(len(live))
        is_new = np.arange(H + len(live)) >= H
        p, sim, ncand = sh.minhash_pairs(allsk, s, is_new, shard_runner)
        g = _groups(H, H + len(live), p, sim, None if sc is None else sc[live])
        rep_sim = mh.jaccard(allsk.offsets, allsk.values, np.stack([g[0], g[1]], 1)) if len(g[0]) else np.zeros(0)
        record("minhash", live, *g, rep_sim, ["jaccard"] * len(g[0]))
        stats.update(minhash_candidates=ncand, minhash_verified_pairs=len(p))
        del p, sim, g, rep_sim, is_new
        if index is None:  # the sketches are only needed again to append the kept records to an index
            allsk = None
        else:  # keep only the records still alive (a superset of the kept ones), compacted in place
            rows = sk_rows[alive]
            allsk.compact(rows)
            sk_rows[alive] = np.arange(len(rows))
    del norms
    stats["seconds"]["minhash"] = time.perf_counter() - t0
    step_done("minhash")

    t0 = time.perf_counter()
    st_rows = np.full(n, -1)   # row of each live record in `E` (history rows first)
    E = None
    full_new: dict[int, np.ndarray] = {}
    if s.embedding:
        live = np.flatnonzero(alive)
        if H:  # history rows first; the new vectors are copied once, then freed
            E = np.empty((H + len(live), dim), np.float32)
            E[:H] = hist.static
            hist.static = None
            E[H:] = static.encode([texts[i] for i in live])
        else:
            E = static.encode([texts[i] for i in live])
        st_rows[live] = H + np.arange(len(live))
        is_new = np.arange(H + len(live)) >= H
        p, sim = sh.neighbor_pairs(E, s.static_candidate_cosine, s, is_new if H else None, shard_runner)
        del is_new
        sure = sim >= s.static_accept_cosine
        unc = np.flatnonzero(~sure)
        detail = np.array(["static"] * len(p), dtype=object)
        ok, full_vecs = _confirm(p[unc], sim[unc], s, hist, [texts[i] for i in live], H) if s.confirm else (None, {})
        keep_edge = sure.copy()
        fsim = sim.astype(np.float64)
        if ok is not None and len(ok[0]):
            keep_edge[unc[ok[0]]] = ok[1] >= s.cosine_threshold
            fsim[unc[ok[0]]] = ok[1]
            detail[unc[ok[0]]] = "full"
        guarded = 0
        if s.number_guard:  # weak static-only pairs whose numbers were substituted are distinct tasks
            weak = np.flatnonzero(keep_edge & (detail == "static") & (fsim < s.static_chain_cosine))
            live_texts = [texts[i] for i in live]
            text_of = lambda x: hist.texts[x] if x < H else live_texts[x - H]  # noqa: E731
            bad = weak[numbers_substituted(p[weak], text_of)]
            keep_edge[bad] = False
            guarded = len(bad)
        p, fsim, detail = p[keep_edge], fsim[keep_edge], detail[keep_edge]
        g = _embedding_groups(H, H + len(live), p, fsim, detail, s, None if sc is None else sc[live])
        rep_sim = np.einsum("ij,ij->i", E[g[0]], E[g[1]]) if len(g[0]) else np.zeros(0)
        dt = _edge_detail(p, detail, g[0], g[2], H + len(live))
        record("embedding", live, *g, rep_sim, dt)
        full_new = full_vecs
        stats.update(embedding_candidates=len(sim), embedding_static_accepted=int(sure.sum()), embedding_uncertain=len(unc),
                     embedding_confirm_checked=0 if ok is None else len(ok[0]),
                     embedding_confirmed=0 if ok is None else int((ok[1] >= s.cosine_threshold).sum()),
                     embedding_number_guarded=guarded)
        del p, sim, fsim, detail, g, rep_sim, dt
        if index is None:
            E = None
    stats["seconds"]["embedding"] = time.perf_counter() - t0
    step_done("embedding")

    kept = np.flatnonzero(alive)
    stats["kept"] = len(kept)
    if index is not None:
        t0 = time.perf_counter()
        sk = allsk.take(sk_rows[kept]) if s.minhash else _blank_sketches(len(kept), s)
        st = E[st_rows[kept]] if s.embedding else np.zeros((len(kept), 0), np.float32)
        # full-model vectors computed for this call, keyed by their row in the index after this append
        row_of_live = {int(st_rows[k]): H + i for i, k in enumerate(kept)} if s.embedding else {}
        full_rows = {node if node < H else row_of_live[node]: v for node, v in full_new.items()
                     if node < H or node in row_of_live}
        index.append([ids[i] for i in kept], [texts[i] for i in kept], keys[kept], sk, st, full_rows, index_source)
        stats["seconds"]["index_save"] = time.perf_counter() - t0
        step_done("index")
    if bar is not None:
        bar.finish(detail=f"kept {len(kept):,} of {n:,}")
    return DedupResult([ids[i] for i in kept], dropped, stats)


def _edge_detail(pairs: np.ndarray, detail: np.ndarray, a: np.ndarray, b: np.ndarray, n: int) -> list[str]:
    """detail of the edge {a[k], b[k]} among `pairs` (i < j), "static" when it is not one."""
    if len(a) == 0:
        return []
    code = pairs[:, 0] * n + pairs[:, 1]
    order = np.argsort(code, kind="stable")
    code = code[order]
    q = np.minimum(a, b) * n + np.maximum(a, b)
    pos = np.minimum(np.searchsorted(code, q), max(len(code) - 1, 0))
    hit = code[pos] == q if len(code) else np.zeros(len(q), bool)
    return [str(detail[order[i]]) if h else "static" for i, h in zip(pos.tolist(), hit.tolist())]


def _blank_sketches(n: int, s: DedupSettings) -> mh.Sketches:
    return mh.Sketches(np.zeros(n + 1, np.int64), np.zeros(0, np.uint64), np.full((n, s.num_perm), 2**32 - 1, np.uint32),
                       np.zeros((n, s.bands), np.uint64))


def _confirm(pairs: np.ndarray, sims: np.ndarray, s: DedupSettings, hist, new_texts: list[str], H: int):
    """Full-model cosine for the uncertain pairs that fit the budget (highest static cosine first)."""
    if len(pairs) == 0 or s.max_confirm_records == 0:
        return (np.zeros(0, np.int64), np.zeros(0)), {}
    chosen, nodes = [], set()
    for k in np.argsort(-sims, kind="stable"):
        a, b = int(pairs[k, 0]), int(pairs[k, 1])
        extra = {x for x in (a, b) if x not in nodes and not (x < H and x in hist.full)}
        if len(nodes) + len(extra) > s.max_confirm_records:
            continue
        nodes |= extra
        chosen.append(k)
    need = sorted(nodes)
    text_of = lambda x: hist.texts[x] if x < H else new_texts[x - H]  # noqa: E731
    F = _encoder("full", s).encode([text_of(x) for x in need])
    vec = {x: F[i] for i, x in enumerate(need)}
    vec.update({x: hist.full[x] for x in np.unique(pairs[chosen]).tolist() if x < H and x in hist.full})
    ch = np.asarray(chosen, dtype=np.int64)
    cos = np.array([float(vec[int(a)] @ vec[int(b)]) for a, b in pairs[ch]])
    return (ch, cos), {x: vec[x] for x in need}


def dedup_file(path: str | Path, text_field: str, out_dir: str | Path, settings: DedupSettings | None = None,
               id_field: str | None = None, index_dir: str | Path | None = None,
               shard_runner: sh.ShardRunner | None = None) -> dict:
    """Dedup a .jsonl/.parquet/.csv file on `text_field`.

    Writes OUT/kept.<fmt> (the kept rows, all columns, input order), OUT/dropped.<fmt>
    (dropped rows plus dedup_duplicate_of, dedup_method, dedup_similarity,
    dedup_matched_id, dedup_matched_similarity, dedup_detail) and OUT/summary.json.
    Ids are `id_field` values, else the 0-based row number. Returns the summary.
    """
    import json

    import polars as pl

    from evolforge.storage.datasets import read_any_table, write_any_table
    from evolforge.storage.fs import ensure_dir, location, write_text_atomic
    from evolforge.storage.layout import DedupOutLayout

    s = settings or DedupSettings()
    path, lay = location(path), DedupOutLayout(out_dir)
    df, fmt = read_any_table(path)
    if text_field not in df.columns:
        raise ValueError(f"{path}: no column {text_field!r} (columns: {df.columns})")
    ids = [str(x) for x in df[id_field].to_list()] if id_field else [str(i) for i in range(df.height)]
    scores = df[s.score_field].cast(pl.Float64).to_list() if s.keep == "best" else None
    res = dedup(df[text_field].to_list(), ids, s, index_dir=index_dir, scores=scores, shard_runner=shard_runner,
                progress=True)
    ensure_dir(lay.root)
    pos = {k: i for i, k in enumerate(ids)}
    kept_rows = sorted(pos[k] for k in res.kept_ids)
    write_any_table(df[kept_rows], lay.kept(fmt), fmt)
    d = res.dropped
    reasons = pl.DataFrame({
        "dedup_duplicate_of": [r["duplicate_of"] for r in d], "dedup_method": [r["method"] for r in d],
        "dedup_similarity": [r["similarity"] for r in d], "dedup_matched_id": [r["matched_id"] for r in d],
        "dedup_matched_similarity": [r["matched_similarity"] for r in d], "dedup_detail": [r["detail"] for r in d],
    }, schema={"dedup_duplicate_of": pl.Utf8, "dedup_method": pl.Utf8, "dedup_similarity": pl.Float64,
               "dedup_matched_id": pl.Utf8, "dedup_matched_similarity": pl.Float64, "dedup_detail": pl.Utf8})
    dropped_df = pl.concat([df[[pos[r["id"]] for r in d]], reasons], how="horizontal")
    write_any_table(dropped_df, lay.dropped(fmt), fmt)
    summary = {"input": str(path), "text_field": text_field, "kept": len(res.kept_ids), "dropped": len(d),
               "kept_path": str(lay.kept(fmt)), "dropped_path": str(lay.dropped(fmt)), "stats": res.stats}
    write_text_atomic(lay.summary, json.dumps(summary, indent=1, default=float))
    return summary
