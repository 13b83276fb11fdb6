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
The embedding method's weak edges do not chain unless `dedup.embedding_grouping`
is "components" (see `_embedding_groups`).

One call runs these phases, in order (`_dedup`), each a function that says what it
takes and gives: `_inputs` (texts, ids, scores checked), `_open_run` (static
encoder and the index's records loaded), `_exact_phase`, `_minhash_phase`,
`_embedding_phase` (`_static_vectors`, `_embedding_edges`: candidates, full-model
confirmation, number guard) and, with an index, `_index_phase` (the kept records
appended). `_Run` holds what they share: the records still alive, the drops, the stats.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.tasks.core import progress as live_progress
from evolforge.tasks.dedup import embedding as emb
from evolforge.tasks.dedup import minhash as mh
from evolforge.tasks.dedup import shards as sh
from evolforge.tasks.dedup.index import DedupIndex, IndexData, empty_data, index_lock
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


@emb.one_thread_math()   # decisions must not depend on the thread count (tasks/dedup/embedding.py)
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
    """The phases of one dedup call, in order (each drops what it finds among the records still alive)."""
    texts, ids, sc = _inputs(texts, ids, s, scores, text_field)
    run = _open_run(texts, ids, sc, s, index_dir, progress)
    norms, keys = _exact_phase(run)
    sketches = _minhash_phase(run, norms, shard_runner)
    del norms  # only the MinHash phase reads the normalized texts
    vectors = _embedding_phase(run, shard_runner)
    kept = np.flatnonzero(run.alive)
    run.stats["kept"] = len(kept)
    if run.index is not None:
        _index_phase(run, kept, keys, sketches, vectors, index_source)
    if run.bar is not None:
        run.bar.finish(detail=f"kept {len(kept):,} of {run.n:,}")
    return DedupResult([ids[i] for i in kept], run.dropped, run.stats)


@dataclass
class _Run:
    """One dedup call's state, shared by its phases. Nodes of a phase's graph are numbered history first:
    0..H-1 the indexed records (`hist` rows), then the new records still alive when the phase started."""

    s: DedupSettings
    texts: list[str]
    ids: list[str]
    sc: np.ndarray | None          # keep="best": one score per text (NaN -> -inf); else None
    static: object | None          # the static encoder when dedup.embedding is on
    index: DedupIndex | None       # the persistent index that receives the kept records, if any
    hist: IndexData                # its records (empty without an index)
    H: int                         # len(hist)
    alive: np.ndarray              # per new record: not dropped yet
    steps: list[str]               # the phases that run, as the progress bar counts them
    bar: live_progress.StepProgress | None
    stats: dict = field(default_factory=dict)
    dropped: list[dict] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.ids)

    def live_scores(self, live: np.ndarray) -> np.ndarray | None:
        return None if self.sc is None else self.sc[live]

    def record(self, method, nodes_alive, drop, rep, nb, nb_s, rep_sim, detail) -> None:
        """Drop the new nodes `drop` of a phase's graph (`nodes_alive`: the records its new nodes stand for), each
        a duplicate of `rep` (similarity `rep_sim`) found through `nb` (`nb_s`), and count them."""
        H, hist, ids = self.H, self.hist, self.ids
        name = lambda node: hist.ids[node] if node < H else ids[nodes_alive[node - H]]  # noqa: E731
        for d, r, m, ms, rs, dt in zip(drop, rep, nb, nb_s, rep_sim, detail):
            k = int(nodes_alive[d - H])
            self.alive[k] = False
            self.dropped.append({"id": ids[k], "duplicate_of": name(int(r)), "method": method,
                                 "similarity": round(float(rs), 6), "matched_id": name(int(m)),
                                 "matched_similarity": round(float(ms), 6), "detail": dt})
        self.stats[f"dropped_{method}"] = len(drop)

    def step_done(self, name: str, started: float, seconds_key: str | None = None) -> None:
        """Charge the phase's seconds since `started` (to stats["seconds"][seconds_key or name]) and advance the
        progress bar past it."""
        self.stats["seconds"][seconds_key or name] = time.perf_counter() - started
        if self.bar is not None and name in self.steps:
            left = self.steps[self.steps.index(name) + 1:]
            self.bar.update(advance=1, detail=f"{name}: {self.stats.get('dropped_' + name, 0):,} dropped"
                            + (f"; next {left[0]} ({int(self.alive.sum()):,} records left)" if left else ""))


class _SketchRows(NamedTuple):
    """The MinHash phase's sketches of the records alive after it (history rows first), kept only for the index."""

    sketches: mh.Sketches | None
    rows: np.ndarray               # per new record: its row in `sketches` (-1: none)


class _VectorRows(NamedTuple):
    """The embedding phase's static vectors (history rows first) and the full-model vectors it computed, kept
    only for the index."""

    vectors: np.ndarray | None
    rows: np.ndarray               # per new record: its row in `vectors` (-1: none)
    full: dict[int, np.ndarray]    # node -> full-model vector


def _inputs(texts, ids, s: DedupSettings, scores, text_field: str):
    """Takes the caller's texts (strings or records), ids (None: "0", "1", ...) and scores; gives (texts as strings,
    ids as strings, keep="best" scores as an array or None). ValueError for ids that are not unique and one per
    text, or keep="best" without one score per text."""
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
    return texts, ids, sc


def _open_run(texts: list[str], ids: list[str], sc: np.ndarray | None, s: DedupSettings, index_dir,
              progress: bool) -> _Run:
    """Takes the checked inputs; loads the static encoder (when embeddings run) and the index's records (when
    `index_dir` is given); gives the call's _Run with every record alive and the progress bar started."""
    n = len(texts)
    static = _encoder("static", s) if s.embedding else None
    dim = static.dim if static else 0
    index = DedupIndex(index_dir, s, static.fingerprint if static else "") if index_dir else None
    hist = index.load(dim) if index else empty_data(s, dim)
    steps = [m for m in ("exact", "minhash", "embedding") if getattr(s, m)] + (["index"] if index else [])
    bar = live_progress.StepProgress("dedup", len(steps), unit="steps") if progress else None
    run = _Run(s=s, texts=texts, ids=ids, sc=sc, static=static, index=index, hist=hist, H=len(hist),
               alive=np.ones(n, bool), steps=steps, bar=bar,
               stats={"records": n, "indexed_before": len(hist), "seconds": {}})
    if bar is not None:
        bar.update(detail=f"{n:,} records: {steps[0] if steps else 'nothing to do'}")
    return run


def _exact_phase(run: _Run) -> tuple[list[str], np.ndarray]:
    """Normalizes every text and keys it; with dedup.exact, drops the records whose normalized text an indexed or
    an earlier record has. Gives (normalized texts, exact keys), both for every record."""
    t0 = time.perf_counter()
    s, hist, H, n = run.s, run.hist, run.H, run.n
    norms = normalize_many(run.texts, s)
    keys = exact_keys(norms)
    if s.exact:
        live = np.flatnonzero(run.alive)
        hk = hist.exact
        order = np.argsort(hk, kind="stable")
        pos = np.minimum(np.searchsorted(hk[order], keys), max(H - 1, 0))
        hit = (hk[order][pos] == keys) if H else np.zeros(n, bool)
        first = exact_groups(keys, norms)
        pairs = [np.stack([order[pos[hit]], H + np.flatnonzero(hit)], 1)] if H else []
        own = np.flatnonzero(first != np.arange(n))
        pairs.append(np.stack([H + first[own], H + own], 1))
        p = np.concatenate(pairs).astype(np.int64)
        g = _groups(H, H + n, p, np.ones(len(p)), run.live_scores(live))
        run.record("exact", live, *g, np.ones(len(g[0])), ["normalized text"] * len(g[0]))
    run.step_done("exact", t0)
    return norms, keys


def _minhash_phase(run: _Run, norms: list[str], shard_runner: sh.ShardRunner | None) -> _SketchRows:
    """Takes the normalized texts; with dedup.minhash, sketches the records alive (the indexed sketches are moved
    in, not copied), finds their verified Jaccard pairs in shards and drops the groups' duplicates. Gives the
    sketches of the records still alive when an index will receive them, else none."""
    t0 = time.perf_counter()
    s, hist, H = run.s, run.hist, run.H
    sk_rows = np.full(run.n, -1)   # row of each live record in `allsk` (history rows first)
    allsk = None
    if s.minhash:
        live = np.flatnonzero(run.alive)
        # history rows are copied in first (no concatenation of history + new afterwards)
        allsk = mh.sketch_many([norms[i] for i in live], s, prefix=hist.sketches if H else None)
        hist.sketches = mh.empty_sketches(s)
        sk_rows[live] = H + np.arange(len(live))
        is_new = np.arange(H + len(live)) >= H
        p, sim, ncand = sh.minhash_pairs(allsk, s, is_new, shard_runner)
        g = _groups(H, H + len(live), p, sim, run.live_scores(live))
        rep_sim = mh.jaccard(allsk.offsets, allsk.values, np.stack([g[0], g[1]], 1)) if len(g[0]) else np.zeros(0)
        run.record("minhash", live, *g, rep_sim, ["jaccard"] * len(g[0]))
        run.stats.update(minhash_candidates=ncand, minhash_verified_pairs=len(p))
        del p, sim, g, rep_sim, is_new
        if run.index is None:  # the sketches are only needed again to append the kept records to an index
            allsk = None
        else:  # keep only the records still alive (a superset of the kept ones), compacted in place
            rows = sk_rows[run.alive]
            allsk.compact(rows)
            sk_rows[run.alive] = np.arange(len(rows))
    run.step_done("minhash", t0)
    return _SketchRows(allsk, sk_rows)


def _embedding_phase(run: _Run, shard_runner: sh.ShardRunner | None) -> _VectorRows:
    """With dedup.embedding, embeds the records alive (static model; the indexed vectors are moved in), keeps the
    candidate pairs `_embedding_edges` accepts, groups them (`dedup.embedding_grouping`) and drops the groups'
    duplicates. Gives the static vectors and the full-model vectors computed, when an index will receive them."""
    t0 = time.perf_counter()
    s, H = run.s, run.H
    st_rows = np.full(run.n, -1)   # row of each live record in `E` (history rows first)
    E = None
    full_new: dict[int, np.ndarray] = {}
    if s.embedding:
        live = np.flatnonzero(run.alive)
        E = _static_vectors(run, live)
        st_rows[live] = H + np.arange(len(live))
        p, fsim, detail, full_new, counts = _embedding_edges(run, live, E, shard_runner)
        g = _embedding_groups(H, H + len(live), p, fsim, detail, s, run.live_scores(live))
        rep_sim = np.einsum("ij,ij->i", E[g[0]], E[g[1]]) if len(g[0]) else np.zeros(0)
        dt = _edge_detail(p, detail, g[0], g[2], H + len(live))
        run.record("embedding", live, *g, rep_sim, dt)
        run.stats.update(counts)
        del p, fsim, detail, g, rep_sim, dt
        if run.index is None:
            E = None
    run.step_done("embedding", t0)
    return _VectorRows(E, st_rows, full_new)


def _static_vectors(run: _Run, live: np.ndarray) -> np.ndarray:
    """Takes the new records alive; gives the static vectors of the history (moved out of `hist`) then of them."""
    H, hist = run.H, run.hist
    new_texts = [run.texts[i] for i in live]
    if not H:
        return run.static.encode(new_texts)
    # history rows first; the new vectors are copied once, then freed
    E = np.empty((H + len(live), run.static.dim), np.float32)
    E[:H] = hist.static
    hist.static = None
    E[H:] = run.static.encode(new_texts)
    return E


def _embedding_edges(run: _Run, live: np.ndarray, E: np.ndarray, shard_runner: sh.ShardRunner | None):
    """Takes the new records alive and the static vectors (history rows first). Finds the candidate pairs over
    static_candidate_cosine (in shards); accepts those over static_accept_cosine, confirms the uncertain rest with
    the full model within its budget (dedup.confirm), and (dedup.number_guard) refuses weak static-only pairs
    whose numbers were substituted. Gives (the accepted pairs, their cosine: full-model where confirmed, each
    pair's detail "static" | "full", the full-model vectors computed by node, the counts for the stats)."""
    H = run.H
    is_new = np.arange(H + len(live)) >= H
    p, sim = sh.neighbor_pairs(E, run.s.static_candidate_cosine, run.s, is_new if H else None, shard_runner)
    del is_new
    return _accept_edges(run, live, p, sim)


def _accept_edges(run: _Run, live: np.ndarray, p: np.ndarray, sim: np.ndarray):
    """`_embedding_edges` after the search: takes the candidate pairs and their static cosine; gives the same."""
    s, hist, H = run.s, run.hist, run.H
    sure = sim >= s.static_accept_cosine
    unc = np.flatnonzero(~sure)
    detail = np.array(["static"] * len(p), dtype=object)
    live_texts = [run.texts[i] for i in live]
    ok, full_vecs = _confirm(p[unc], sim[unc], s, hist, live_texts, H) if s.confirm else (None, {})
    keep_edge = sure.copy()
    fsim = sim.astype(np.float64)
    if ok is not None and len(ok[0]):
        keep_edge[unc[ok[0]]] = ok[1] >= s.cosine_threshold
        fsim[unc[ok[0]]] = ok[1]
        detail[unc[ok[0]]] = "full"
    guarded = 0
    if s.number_guard:  # weak static-only pairs whose numbers were substituted are distinct tasks
        weak = np.flatnonzero(keep_edge & (detail == "static") & (fsim < s.static_chain_cosine))
        text_of = lambda x: hist.texts[x] if x < H else live_texts[x - H]  # noqa: E731
        bad = weak[numbers_substituted(p[weak], text_of)]
        keep_edge[bad] = False
        guarded = len(bad)
    counts = {"embedding_candidates": len(sim), "embedding_static_accepted": int(sure.sum()),
              "embedding_uncertain": len(unc), "embedding_confirm_checked": 0 if ok is None else len(ok[0]),
              "embedding_confirmed": 0 if ok is None else int((ok[1] >= s.cosine_threshold).sum()),
              "embedding_number_guarded": guarded}
    return p[keep_edge], fsim[keep_edge], detail[keep_edge], full_vecs, counts


def _index_phase(run: _Run, kept: np.ndarray, keys: np.ndarray, sketches: _SketchRows, vectors: _VectorRows,
                 index_source: Mapping | None) -> None:
    """Appends the kept records to the index: ids, texts, exact keys, sketches, static vectors and the full-model
    vectors this call computed (for indexed records too), tagged with `index_source`."""
    t0 = time.perf_counter()
    s, H, ids, texts = run.s, run.H, run.ids, run.texts
    sk = sketches.sketches.take(sketches.rows[kept]) if s.minhash else _blank_sketches(len(kept), s)
    st = vectors.vectors[vectors.rows[kept]] if s.embedding else np.zeros((len(kept), 0), np.float32)
    # full-model vectors computed for this call, keyed by their row in the index after this append
    row_of_live = {int(vectors.rows[k]): H + i for i, k in enumerate(kept)} if s.embedding else {}
    full_rows = {node if node < H else row_of_live[node]: v for node, v in vectors.full.items()
                 if node < H or node in row_of_live}
    run.index.append([ids[i] for i in kept], [texts[i] for i in kept], keys[kept], sk, st, full_rows, index_source)
    run.step_done("index", t0, seconds_key="index_save")


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
    import polars as pl

    from evolforge.storage.datasets import read_any_table
    from evolforge.storage.dedup_sets import DedupOutLayout
    from evolforge.storage.fs import location

    s = settings or DedupSettings()
    path, lay = location(path), DedupOutLayout(out_dir)
    df, fmt = read_any_table(path)
    if text_field not in df.columns:
        raise ValueError(f"{path}: no column {text_field!r} (columns: {df.columns})")
    ids = [str(x) for x in df[id_field].to_list()] if id_field else [str(i) for i in range(df.height)]
    scores = df[s.score_field].cast(pl.Float64).to_list() if s.keep == "best" else None
    res = dedup(df[text_field].to_list(), ids, s, index_dir=index_dir, scores=scores, shard_runner=shard_runner,
                progress=True)
    return write_outputs(df, fmt, path, text_field, ids, res.kept_ids, res.dropped, res.stats, lay)


def _free_names(columns: list[str], taken: list[str]) -> dict[str, str]:
    """{input column: its new name} for the input columns named like one of `taken`: input_<name>, with the prefix
    repeated until the name is neither an input column nor taken (nor given to another)."""
    used, out = set(columns) | set(taken), {}
    for c in columns:
        if c in taken:
            new = f"input_{c}"
            while new in used:
                new = f"input_{new}"
            used.add(new)
            out[c] = new
    return out


def write_outputs(df, fmt: str, path, text_field: str, ids: list[str], kept_ids: Sequence[str], d: list[dict],
                  stats: dict, lay) -> dict:
    """OUT/kept.<fmt>, OUT/dropped.<fmt> and OUT/summary.json of a dedup of `df` (see `dedup_file`)."""
    import json

    import polars as pl

    from evolforge.storage.datasets import write_any_table
    from evolforge.storage.fs import ensure_dir, write_text_atomic

    pos = {k: i for i, k in enumerate(ids)}
    kept_rows = sorted(pos[k] for k in kept_ids)
    reasons = pl.DataFrame({
        "dedup_duplicate_of": [r["duplicate_of"] for r in d], "dedup_method": [r["method"] for r in d],
        "dedup_similarity": [r["similarity"] for r in d], "dedup_matched_id": [r["matched_id"] for r in d],
        "dedup_matched_similarity": [r["matched_similarity"] for r in d], "dedup_detail": [r["detail"] for r in d],
    }, schema={"dedup_duplicate_of": pl.Utf8, "dedup_method": pl.Utf8, "dedup_similarity": pl.Float64,
               "dedup_matched_id": pl.Utf8, "dedup_matched_similarity": pl.Float64, "dedup_detail": pl.Utf8})
    # an input that is itself an output (evolved.parquet has dedup_similarity): its own columns keep their values
    # as input_<name>, this dedup's reasons take the names; a dedup's own dropped table already has input_<name>
    # beside <name>, so the prefix repeats until the name is free (input_input_<name>)
    dropped_rows = df[[pos[r["id"]] for r in d]]
    dropped_rows = dropped_rows.rename(_free_names(dropped_rows.columns, reasons.columns))
    dropped_df = pl.concat([dropped_rows, reasons], how="horizontal")  # before any write: nothing half-written
    ensure_dir(lay.root)
    write_any_table(df[kept_rows], lay.kept(fmt), fmt)
    write_any_table(dropped_df, lay.dropped(fmt), fmt)
    summary = {"input": str(path), "text_field": text_field, "kept": len(kept_ids), "dropped": len(d),
               "kept_path": str(lay.kept(fmt)), "dropped_path": str(lay.dropped(fmt)), "stats": stats}
    write_text_atomic(lay.summary, json.dumps(summary, indent=1, default=float))
    return summary
