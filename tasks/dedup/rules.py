"""The decision rules of the dedup: which records group together and which one each group keeps.

Every step of the engine that decides (tasks/dedup/group_steps.py) applies these to its bucket's records or its
group shard's components, renumbered in record order; nothing else decides.

    components(n, pairs)          connected components (label = smallest member)
    _groups(n_hist, n, ...)       components, one representative each (`dedup.keep`), the drops with their best
                                  matched record: (dropped nodes, representative, matched node, its similarity)
    _leader_groups, leaders       the embedding grouping without chains through weak edges
    _embedding_groups             `dedup.embedding_grouping`: "components" or "leader"
    numbers_substituted           the number guard (`dedup.number_guard`)
    _confirm                      the full model's budget (`max_confirm_records`), highest static cosine first
    _edge_detail, _blank_sketches the detail of a drop's edge; the sketches of records not sketched

Nodes of a phase's graph are numbered history first: 0..n_hist-1 indexed records (never dropped, always kept
first), then the new records still alive. keep="earliest" keeps the lowest node, keep="best" the highest score
(ties: earliest). Groups are transitive: a dropped record's similarity to the kept one can be below the threshold
when it was linked through a chain (its matched record shows the link).
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.tasks.dedup import embedding as emb
from evolforge.tasks.dedup import minhash as mh


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


def _confirm(pairs: np.ndarray, sims: np.ndarray, s: DedupSettings, hist, new_texts, H: int, encoder=emb.encoder):
    """Full-model cosine for the uncertain pairs that fit the budget (highest static cosine first): ((chosen pair
    positions, their cosine), the full-model vectors computed, by node). `hist` has the indexed records' `texts`
    and `full` vectors (row -> vector); `new_texts[x - H]` is node x's text."""
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
    F = encoder("full", s).encode([text_of(x) for x in need])
    vec = {x: F[i] for i, x in enumerate(need)}
    vec.update({x: hist.full[x] for x in np.unique(pairs[chosen]).tolist() if x < H and x in hist.full})
    ch = np.asarray(chosen, dtype=np.int64)
    cos = np.array([float(vec[int(a)] @ vec[int(b)]) for a, b in pairs[ch]])
    return (ch, cos), {x: vec[x] for x in need}

