"""The embedding stage's grouping: static-only (weak) pairs never chain distinct records into one group.

At 1M records, template siblings (distinct texts one slot word apart) pass the static accept cosine; as
connected components they chained into groups of tens of thousands. Leader grouping: strong pairs
(full-model confirmed, or static cosine >= static_chain_cosine) form cores transitively; a weak pair drops a
core into a directly adjacent earlier core and links nothing further.
"""

from __future__ import annotations

import numpy as np
import pytest

from evolforge.config.sections.dedup import DedupSettings
from evolforge.tasks.dedup import dedup, pipeline
from evolforge.tasks.dedup.pipeline import _groups, _leader_groups, leaders
from evolforge.testing.dedup_decisions import BagOfWords


def _reference_leaders(n, pairs, rank):
    """The greedy definition, one node at a time."""
    adj = [[] for _ in range(n)]
    for a, b in pairs.tolist():
        adj[a].append(b)
        adj[b].append(a)
    lead = np.zeros(n, bool)
    for x in sorted(range(n), key=lambda i: rank[i]):
        lead[x] = not any(lead[y] and rank[y] < rank[x] for y in adj[x])
    return lead


@pytest.mark.parametrize("seed", range(6))
def test_leaders_equal_the_greedy_walk_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    m = int(rng.integers(0, 4 * n))
    pairs = rng.integers(0, n, size=(m, 2))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    rank = rng.permutation(n)
    assert (leaders(n, pairs, rank) == _reference_leaders(n, pairs, rank)).all()


def test_a_long_chain_alternates_leaders():
    """Hostile: a path 0-1-2-...-999 (each record close to the next only): components make it one group."""
    n = 1000
    pairs = np.stack([np.arange(n - 1), np.arange(1, n)], 1)
    lead = leaders(n, pairs, np.arange(n))
    assert lead.tolist() == [i % 2 == 0 for i in range(n)]
    strong = np.zeros(n - 1, bool)
    drop, rep, _, _ = _leader_groups(0, n, strong, ~strong, pairs, np.full(n - 1, 0.9), None)
    assert (rep == drop - 1).all()          # every dropped record is next to its own representative
    assert len(_groups(0, n, pairs, np.full(n - 1, 0.9), None)[0]) == n - 1   # the old chaining drops all but one


def _decide(n, pairs, strong, sims=None, scores=None, n_hist=0):
    pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
    sims = np.full(len(pairs), 0.9) if sims is None else np.asarray(sims, float)
    drop, rep, _, _ = _leader_groups(n_hist, n, np.asarray(strong, bool), ~np.asarray(strong, bool), pairs, sims, scores)
    return dict(zip(drop.tolist(), rep.tolist()))


def test_weak_chain_a_b_c_does_not_drop_c_into_a():
    # a~b and b~c weak; a and c are distinct: b joins a, c stays
    assert _decide(3, [[0, 1], [1, 2]], [False, False]) == {1: 0}
    # connected components (the old grouping) dropped both into a
    d, r, _, _ = _groups(0, 3, np.array([[0, 1], [1, 2]]), np.ones(2), None)
    assert dict(zip(d.tolist(), r.tolist())) == {1: 0, 2: 0}


def test_strong_pairs_chain_weak_pairs_join_whole_cores_once():
    # strong 0=1 and 2=3 (cores), weak 1~2: core {2, 3} joins core {0, 1}; weak 3~4: 4 is not pulled in (no chain)
    got = _decide(5, [[0, 1], [2, 3], [1, 2], [3, 4]], [True, True, False, False])
    assert got == {1: 0, 2: 0, 3: 0}
    # strong pairs alone chain transitively
    assert _decide(4, [[0, 1], [1, 2], [2, 3]], [True] * 3) == {1: 0, 2: 0, 3: 0}


def test_a_follower_joins_its_most_similar_leader():
    # 2 touches leaders 0 (0.90) and 1 (0.93): it joins 1
    assert _decide(3, [[0, 2], [1, 2]], [False, False], sims=[0.90, 0.93]) == {2: 1}


def test_keep_best_and_history_decide_the_walk_order():
    # keep="best": record 2 has the best score, so it leads and both neighbours join it
    scores = np.array([0.1, 0.2, 0.9])
    assert _decide(3, [[0, 2], [1, 2], [0, 1]], [False] * 3, scores=scores) == {0: 2, 1: 2}
    # history node 0 always leads (never dropped); new node 2 chained through new node 1 stays
    got = _decide(3, [[0, 1], [1, 2]], [False, False], scores=np.array([5.0, 9.0]), n_hist=1)
    assert got == {1: 0}




def test_dedup_does_not_chain_siblings_through_a_shared_neighbour(monkeypatch):
    enc = BagOfWords(256, "bow")
    monkeypatch.setattr(pipeline, "_encoder", lambda kind, s: enc)
    words = "ant bee cat dog eel fox gnu hen ibis jay kiwi lark mole newt owl puma".split()
    a = " ".join(words)
    b = " ".join(words[:15] + ["yak"])            # a~b and b~c: cosine 15/16 = 0.9375
    c = " ".join(words[:14] + ["zebu", "yak"])      # a~c: 14/16 = 0.875, below the accept cosine
    s = DedupSettings(exact=False, minhash=False, confirm=False, static_candidate_cosine=0.9, static_accept_cosine=0.9,
                      static_chain_cosine=0.99)
    res = dedup([a, b, c], None, s)
    assert res.kept_ids == ["0", "2"]
    assert [(d["id"], d["duplicate_of"], d["similarity"] >= 0.9) for d in res.dropped] == [("1", "0", True)]
    old = dedup([a, b, c], None, s.model_copy(update={"embedding_grouping": "components"}))
    assert old.kept_ids == ["0"]             # the chain through b dropped c, distinct from a
    # a strong (surer) link chains as before
    assert dedup([a, b, c], None, s.model_copy(update={"static_chain_cosine": 0.93})).kept_ids == ["0"]


def test_numbers_substituted_catches_other_quantities_not_typos():
    from evolforge.tasks.dedup.pipeline import numbers_substituted

    texts = ["A tank holds 120 units and loses 15 every hour.",     # 0
             "A tank holds 120 units and loses 15 every hour!",     # 1 same numbers
             "A tank holds 87 units and loses 45 every hour.",      # 2 two substituted: distinct
             "A tank holds 1200 units and loses 15 every hour.",    # 3 one typo (an added digit)
             "A tank holds 120 units and loses every hour.",        # 4 a number removed only
             "A tank holds 480 units and loses 15 every hour.",     # 5 one replaced, not a typo
             "A tank holds 210 units and loses 15 every hour."]     # 6 two digits swapped: a typo
    pairs = np.array([[0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [4, 2]])
    got = numbers_substituted(pairs, texts.__getitem__).tolist()
    assert got == [False, True, False, False, True, False, True]


def test_number_guard_keeps_template_siblings_apart(monkeypatch):
    """Hostile: same template, other quantities: the static model scores them alike; the guard keeps both."""
    enc = BagOfWords(256, "bow")
    monkeypatch.setattr(pipeline, "_encoder", lambda kind, s: enc)
    a = "a water tank has a volume of 120 units and loses 15 units every hour how long until it drops below 30 units"
    b = a.replace("120", "300").replace("15 units", "45 units")
    c = a + " thanks"   # a true near duplicate: no number changed
    s = DedupSettings(exact=False, minhash=False, confirm=False, static_candidate_cosine=0.8, static_accept_cosine=0.8)
    res = dedup([a, b, c], None, s)
    assert res.kept_ids == ["0", "1"] and res.stats["embedding_number_guarded"] == 2  # b~a and b~c
    assert dedup([a, b, c], None, s.model_copy(update={"number_guard": False})).kept_ids == ["0"]
