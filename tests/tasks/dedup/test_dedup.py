"""Deduplication library: normalization, exact, MinHash+LSH, embeddings, incremental index, files.

Fast tests use no model (the embedding cascade is exercised with stub encoders);
tests that load all-MiniLM-L6-v2 (and build the static table on first use) are slow.
"""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from pydantic import ValidationError

from evolforge.config.sections.dedup import DedupSettings
from evolforge.tasks.dedup import components, dedup, dedup_file, pipeline
from evolforge.tasks.dedup import embedding as emb
from evolforge.tasks.dedup import minhash as mh
from evolforge.tasks.dedup.index import DedupIndex, IndexMismatch
from evolforge.tasks.dedup.normalize import exact_groups, exact_keys, normalize_many, normalize_text
from evolforge.testing.near_dup_corpus import make_corpus, word_edits  # noqa: E402

NO_EMB = dict(embedding=False)
BASE = ("Write a Python function that takes a list of customer records and returns the median purchase amount, "
        "ignoring records with missing values. Explain the time complexity of your approach.")


def py_char_jaccard(a: str, b: str, k: int = 5) -> float:
    sa = {a[i: i + k] for i in range(len(a) - k + 1)}
    sb = {b[i: i + k] for i in range(len(b) - k + 1)}
    return len(sa & sb) / len(sa | sb)


# --- normalization and exact ---------------------------------------------------

def test_normalize_nfkc_casefold_whitespace_punctuation():
    s = DedupSettings()
    assert normalize_text("  ＨＥＬＬＯ,\t  Wörld!! ", s) == "hello wörld"
    assert normalize_text("STRASSE", s) == normalize_text("straße", s)
    assert normalize_text("ﬁne   tuning", s) == "fine tuning"  # ligature folded by NFKC
    keep = DedupSettings(punctuation="keep")
    assert normalize_text("Hi, there!", keep) == "hi, there!"
    assert normalize_text("Hi, there!", s) == "hi there"
    raw = DedupSettings(nfkc=False, casefold=False, collapse_whitespace=False, punctuation="keep")
    assert normalize_text(" A  B ", raw) == " A  B "


def test_exact_groups_earliest_first_and_no_false_merge():
    s = DedupSettings()
    texts = ["Sort a list.", "completely different", "sort   a LIST", "SORT A LIST!!", "Sort a list of ints."]
    norms = normalize_many(texts, s)
    first = exact_groups(exact_keys(norms), norms)
    assert first.tolist() == [0, 1, 0, 0, 4]


def test_settings_validation():
    with pytest.raises(ValidationError, match="bands \\* rows"):
        DedupSettings(num_perm=64, bands=10, rows=8)
    with pytest.raises(ValidationError, match="score_field"):
        DedupSettings(keep="best")
    with pytest.raises(ValidationError):
        DedupSettings(unknown_field=1)
    s = DedupSettings()
    assert s.lsh_recall(0.8) >= 0.99 and s.lsh_recall(0.5) < 0.2


# --- MinHash + LSH ----------------------------------------------------------------

def test_signatures_match_datasketch():
    from datasketch import MinHash

    s = DedupSettings(num_perm=64, bands=8, rows=8)
    norms = normalize_many([BASE, "short", "another instruction about sorting numbers in rust"], s)
    sk = mh.sketch(norms, s)
    for i in range(len(norms)):
        vals = sk.values[sk.offsets[i]: sk.offsets[i + 1]]
        m = MinHash(num_perm=64, seed=s.seed, scheme="affine32", hashfunc=lambda x: x)
        m.update_batch([int(v & 0xFFFFFFFF) for v in vals])
        assert np.array_equal(m.hashvalues, sk.signatures[i])
    lean = mh.to_lean_minhash(sk.signatures[0], s)
    assert lean.jaccard(mh.to_lean_minhash(sk.signatures[0], s)) == 1.0


def test_jaccard_is_exact_on_shingle_sets():
    s = DedupSettings()
    rng = np.random.default_rng(0)
    texts = [normalize_text(BASE, s)] + [normalize_text(word_edits(BASE, k, rng), s) for k in (1, 2, 4, 8, 16)]
    sk = mh.sketch(texts, s)
    pairs = np.array([[0, i] for i in range(1, len(texts))])
    got = mh.jaccard(sk.offsets, sk.values, pairs)
    want = [py_char_jaccard(texts[0], texts[i]) for i in range(1, len(texts))]
    assert np.allclose(got, want)
    assert want[0] > 0.8 > want[-1]  # the constructed edit levels straddle the threshold


def test_minhash_finds_near_duplicates_and_only_verified_pairs():
    s = DedupSettings(embedding=False)
    c = make_corpus(400, seed=3, mix={"0.05": 0.1})
    norms = normalize_many(c.texts, s)
    sk = mh.sketch_many(norms, s)
    pairs, sims, _ = mh.verified_pairs(sk, s)
    assert (sims >= s.jaccard_threshold).all()
    for (a, b), j in zip(pairs[:50], sims[:50]):  # every reported pair really is >= threshold
        assert py_char_jaccard(norms[a], norms[b]) == pytest.approx(j)
    # brute force truth on all pairs of this small corpus
    iu, ju = np.triu_indices(len(norms), 1)
    allj = mh.jaccard(sk.offsets, sk.values, np.stack([iu, ju], 1))
    truth = {(int(a), int(b)) for a, b, j in zip(iu, ju, allj) if j >= s.jaccard_threshold}
    found = {(int(a), int(b)) for a, b in pairs}
    assert found <= truth
    assert len(truth) > 5 and len(found & truth) / len(truth) >= 0.95


def test_lsh_recall_at_threshold_matches_s_curve():
    """Pairs with Jaccard just above 0.8 must be candidates with probability >= 0.99 (S-curve)."""
    s = DedupSettings()
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(5000)]
    texts, pairs = [], []
    for _ in range(150):
        base = list(rng.choice(words, 60))
        var = list(base)
        var[int(rng.integers(55))] = "zz" + str(rng.integers(1e9))
        pairs.append((len(texts), len(texts) + 1))
        texts += [" ".join(base), " ".join(var)]
    sk = mh.sketch_many(texts, s)
    j = mh.jaccard(sk.offsets, sk.values, np.array(pairs))
    assert (j >= 0.8).mean() > 0.9
    cand = {tuple(p) for p in mh.lsh_pairs(sk.band_keys).tolist()}
    sel = [p for p, x in zip(pairs, j) if x >= 0.8]
    assert np.mean([p in cand for p in sel]) >= 0.97


def test_band_by_band_candidates_match_one_shot_lsh():
    """verified_pairs streams the candidates band by band: together exactly lsh_codes, pathological buckets included."""
    rng = np.random.default_rng(0)
    for trial in range(6):
        n, nb = 3000, 5
        keys = rng.integers(0, 400, (n, nb)).astype(np.uint64)
        keys[rng.choice(n, 1500, replace=False), 1] = 7         # buckets > 1000 records: chain + star
        keys[rng.choice(n, 1200, replace=False), 3] = 9
        is_new = None if trial % 2 == 0 else rng.random(n) < 0.5
        parts = list(mh.candidates_by_band(keys, is_new))
        got = np.sort(np.concatenate(parts))
        assert len(np.unique(got)) == len(got)
        assert np.array_equal(got, mh.lsh_codes(keys, is_new))
    # buckets whose records are all old give no candidates at all
    keys = np.full((4, 3), 5, np.uint64)
    keys[3] = 99
    is_new = np.array([False, False, False, True])
    assert [len(c) for c in mh.candidates_by_band(keys, is_new)] == [0, 0, 0] and len(mh.lsh_codes(keys, is_new)) == 0
    # and the verified pairs are the same as verifying the one-shot candidate list
    s = DedupSettings(chunk_records=50)
    c = make_corpus(600, seed=8, mix={"0.05": 0.2, "exact": 0.05})
    sk = mh.sketch_many(normalize_many(c.texts, s), s)
    pairs, sims, ncand = mh.verified_pairs(sk, s)
    cand = mh.lsh_pairs(sk.band_keys)
    j = mh.jaccard(sk.offsets, sk.values, cand)
    assert ncand == len(cand) and np.array_equal(pairs, cand[j >= s.jaccard_threshold])
    assert np.array_equal(sims, j[j >= s.jaccard_threshold])


def test_sketch_many_prefix_and_compact_match_plain_arrays():
    s = DedupSettings(chunk_records=7, threads=2)
    c = make_corpus(100, seed=9)
    norms = normalize_many(c.texts, s)
    one = mh.sketch(norms, s)
    many = mh.sketch_many(norms, s)
    for name in ("offsets", "values", "signatures", "band_keys"):
        assert np.array_equal(getattr(one, name), getattr(many, name))
    both = mh.sketch_many(norms[60:], s, prefix=mh.sketch_many(norms[:60], s))
    for name in ("offsets", "values", "signatures", "band_keys"):
        assert np.array_equal(getattr(one, name), getattr(both, name))
    rows = np.array([0, 3, 4, 10, 57, 58, 99])
    want = one.take(rows)
    many.compact(rows)
    for name in ("offsets", "values", "signatures", "band_keys"):
        assert np.array_equal(getattr(want, name), getattr(many, name))


def test_word_shingles_and_short_texts():
    s = DedupSettings(shingle_kind="word", shingle_size=3, embedding=False)
    sk = mh.sketch(["a b", "a b", "a b c d e f", ""], s)
    assert np.diff(sk.offsets).tolist() == [1, 1, 4, 0]
    j = mh.jaccard(sk.offsets, sk.values, np.array([[0, 1], [0, 2]]))
    assert j.tolist() == [1.0, 0.0]


def test_components_chain_and_earliest():
    lab = components(7, np.array([[5, 3], [3, 1], [4, 6]]))
    assert lab.tolist() == [0, 1, 2, 1, 4, 1, 4]


# --- pipeline (no model) ---------------------------------------------------------------

def test_dedup_reasons_and_earliest_rule():
    rng = np.random.default_rng(2)
    texts = [BASE, "Translate this sentence into French please.", BASE.upper() + "!!", word_edits(BASE, 1, rng),
             "Something unrelated about the Roman Empire and its roads."]
    res = dedup(texts, ["a", "b", "c", "d", "e"], DedupSettings(**NO_EMB))
    assert res.kept_ids == ["a", "b", "e"]
    by = {d["id"]: d for d in res.dropped}
    assert by["c"]["method"] == "exact" and by["c"]["duplicate_of"] == "a" and by["c"]["similarity"] == 1.0
    assert by["d"]["method"] == "minhash" and by["d"]["duplicate_of"] == "a"
    assert 0.8 <= by["d"]["similarity"] < 1.0 and by["d"]["matched_id"] == "a"


def test_dedup_empty_none_and_records():
    s = DedupSettings(**NO_EMB)
    assert dedup([], None, s).kept_ids == []
    res = dedup([{"text": BASE}, {"text": None}, {"text": BASE.lower()}, {"other": 1}], ["a", "b", "c", "d"], s)
    assert res.kept_ids == ["a", "b"]  # None and a missing field are both the empty text
    assert {d["id"]: d["duplicate_of"] for d in res.dropped} == {"c": "a", "d": "b"}
    with pytest.raises(ValueError, match="unique"):
        dedup(["x", "y"], ["1", "1"], s)


def test_dedup_best_rule_uses_scores():
    rng = np.random.default_rng(3)
    texts = [BASE, word_edits(BASE, 1, rng), word_edits(BASE, 1, rng)]
    s = DedupSettings(keep="best", score_field="score", **NO_EMB)
    res = dedup(texts, ["x", "y", "z"], s, scores=[0.1, 0.9, 0.5])
    assert res.kept_ids == ["y"]
    assert {d["duplicate_of"] for d in res.dropped} == {"y"}


class _BowEncoder:
    """Deterministic stand-in for both encoders: hashed bag of words (no model needed)."""

    dim, fingerprint = 4096, "stub"

    def __init__(self, noise: float = 0.0):
        self.noise = noise
        self.calls = 0

    def encode(self, texts):
        self.calls += len(texts)
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, zlib.crc32(w.encode()) % self.dim] += 1  # stable across processes
        return emb.normalize_rows(out + self.noise)


def test_embedding_cascade_with_stub_encoders(monkeypatch, tmp_path):
    static, full = _BowEncoder(), _BowEncoder()
    monkeypatch.setattr(pipeline, "_encoder", lambda kind, s: static if kind == "static" else full)
    texts = ["alpha beta gamma delta epsilon zeta", "alpha beta gamma delta epsilon eta",
             "one two three four five six", "one two three four seven eight", "red green blue"]
    s = DedupSettings(exact=False, minhash=False, static_candidate_cosine=0.6, static_accept_cosine=0.8,
                      cosine_threshold=0.65, max_confirm_records=10)
    res = dedup(texts, None, s, index_dir=tmp_path / "idx")
    by = {d["id"]: d for d in res.dropped}
    assert by["1"]["method"] == "embedding" and by["1"]["duplicate_of"] == "0" and by["1"]["detail"] == "static"
    assert by["3"]["detail"] == "full" and by["3"]["duplicate_of"] == "2"  # cos 0.667: uncertain, confirmed
    assert full.calls == 2 and res.stats["embedding_confirmed"] == 1
    # a stricter full-model threshold rejects it; no budget leaves it unconfirmed (kept)
    res2 = dedup(texts, None, s.model_copy(update={"cosine_threshold": 0.9}))
    assert "3" in res2.kept_ids
    res3 = dedup(texts, None, s.model_copy(update={"max_confirm_records": 0}))
    assert "3" in res3.kept_ids and res3.stats["embedding_confirm_checked"] == 0
    # incremental: history embeddings come from the index, not from re-encoding
    static.calls = 0
    res4 = dedup(["alpha beta gamma delta epsilon theta", "brand new words here"], ["n1", "n2"], s, index_dir=tmp_path / "idx")
    assert static.calls == 2
    assert res4.dropped[0]["duplicate_of"] == "0" and res4.kept_ids == ["n2"]


def test_ann_kmeans_recall_vs_exact():
    rng = np.random.default_rng(0)
    base = emb.normalize_rows(rng.normal(size=(3000, 48)).astype(np.float32))
    noisy = emb.normalize_rows(base[:1500] + 0.25 * rng.normal(size=(1500, 48)).astype(np.float32) / np.sqrt(48))
    E = np.concatenate([base, noisy])
    s = DedupSettings(ann_exact_below=0, ann_cluster_size=50, ann_probes=3)
    exact, _ = emb.exact_pairs(E, 0.9)
    ann, sims = emb.neighbor_pairs(E, 0.9, s)
    assert (sims >= 0.9).all() and len(exact) >= 1400
    ex = set(map(tuple, exact.tolist()))
    assert len(ex & set(map(tuple, ann.tolist()))) / len(ex) >= 0.99
    # two levels: ~n / ann_cluster_size fine clusters in ~sqrt(k) coarse cells
    C1, Cf, fine_start, near = emb.two_level_kmeans(E, len(E) // 50, s)
    assert len(C1) == 9 and abs(len(Cf) - 90) <= 9 and fine_start[-1] == len(Cf) and near.shape == (len(E), 4)
    # incremental: only pairs touching a new vector
    is_new = np.arange(len(E)) >= 2000
    ann_new, _ = emb.neighbor_pairs(E, 0.9, s, is_new)
    assert is_new[ann_new].any(axis=1).all()
    ex_new = {p for p in ex if is_new[p[0]] or is_new[p[1]]}
    assert len(ex_new & set(map(tuple, ann_new.tolist()))) / len(ex_new) >= 0.99


# --- persistent index and files --------------------------------------------------------

def test_incremental_index_matches_one_shot(tmp_path):
    c = make_corpus(600, seed=5)
    s = DedupSettings(**NO_EMB)
    one = dedup(c.texts, None, s)
    idx = tmp_path / "idx"
    a = dedup(c.texts[:300], [str(i) for i in range(300)], s, index_dir=idx)
    b = dedup(c.texts[300:], [str(i) for i in range(300, 600)], s, index_dir=idx)
    kept = sorted(a.kept_ids + b.kept_ids, key=int)
    # groups are transitive, so a chain through a later record can differ from one shot; never by much
    assert abs(len(kept) - len(one.kept_ids)) <= 0.01 * len(c.texts)
    # and no two kept records (history and new) are duplicates of each other
    sk = mh.sketch_many(normalize_many([c.texts[int(i)] for i in kept], s), s)
    assert len(mh.verified_pairs(sk, s)[0]) == 0
    assert len(set(exact_keys(normalize_many([c.texts[int(i)] for i in kept], s)).tolist())) == len(kept)
    assert b.stats["indexed_before"] == len(a.kept_ids)
    assert any(int(d["duplicate_of"]) < 300 for d in b.dropped)  # found against history
    m = json.loads((idx / "manifest.json").read_text())
    assert m["count"] == len(a.kept_ids) + len(b.kept_ids) and len(m["segments"]) == 2
    assert not list(idx.glob("*.tmp")) and not list(idx.glob(".*"))
    data = DedupIndex(idx, s).load()
    assert len(data) == m["count"] and data.sketches.signatures.shape == (m["count"], s.num_perm)
    with pytest.raises(IndexMismatch, match="num_perm"):
        dedup(["x"], None, DedupSettings(num_perm=128, bands=16, rows=8, **NO_EMB), index_dir=idx)


def test_index_survives_failed_save(tmp_path, monkeypatch):
    s = DedupSettings(**NO_EMB)
    idx = tmp_path / "idx"
    dedup(["first text here to keep", "second distinct text"], ["a", "b"], s, index_dir=idx)
    before = (idx / "manifest.json").read_text()

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError):
        dedup(["a third completely new record"], ["c"], s, index_dir=idx)
    monkeypatch.undo()
    assert (idx / "manifest.json").read_text() == before
    assert len(DedupIndex(idx, s).load()) == 2


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_dedup_file_formats(tmp_path, fmt):
    import polars as pl

    rng = np.random.default_rng(4)
    texts = [BASE, word_edits(BASE, 1, rng), "An unrelated request about volcanoes.", BASE]
    df = pl.DataFrame({"uid": ["u1", "u2", "u3", "u4"], "prompt": texts, "n": [1, 2, 3, 4]})
    path = tmp_path / f"in.{fmt}"
    {"jsonl": df.write_ndjson, "csv": df.write_csv, "parquet": df.write_parquet}[fmt](path)
    summary = dedup_file(path, "prompt", tmp_path / "out", DedupSettings(**NO_EMB), id_field="uid")
    read = {"jsonl": pl.read_ndjson, "csv": pl.read_csv, "parquet": pl.read_parquet}[fmt]
    kept, dropped = read(tmp_path / "out" / f"kept.{fmt}"), read(tmp_path / "out" / f"dropped.{fmt}")
    assert kept["uid"].to_list() == ["u1", "u3"] and kept.columns == ["uid", "prompt", "n"]
    assert sorted(dropped["dedup_method"].to_list()) == ["exact", "minhash"]
    assert set(dropped["dedup_duplicate_of"].to_list()) == {"u1"}
    assert summary["kept"] == 2 and (tmp_path / "out" / "summary.json").exists()
    with pytest.raises(ValueError, match="no column"):
        dedup_file(path, "missing", tmp_path / "o2", DedupSettings(**NO_EMB))


# --- the real model (slow: loads all-MiniLM-L6-v2, builds the static table once) -------------

@pytest.mark.slow
def test_real_models_edits_and_paraphrases():
    s = DedupSettings()
    static = pipeline._encoder("static", s)
    full = pipeline._encoder("full", s)
    rng = np.random.default_rng(11)
    n_words = len(BASE.split())
    v5 = word_edits(BASE, int(np.ceil(0.05 * n_words)), rng)
    v10 = word_edits(BASE, int(np.ceil(0.10 * n_words)), rng)
    para = ("Implement a Python function which, given a list of customer records, computes the median purchase "
            "amount while skipping records that have missing values, and explain its time complexity.")
    other = ("Write a short poem about the ocean at night for a ten year old, using simple words and a hopeful tone, "
             "and explain the rhyme scheme you chose.")
    E = static.encode([BASE, v5, v10, para, other])
    F = full.encode([BASE, v5, v10, para, other])
    assert E[0] @ E[1] >= s.static_accept_cosine and E[0] @ E[2] >= s.static_candidate_cosine
    assert E[0] @ E[4] < s.static_candidate_cosine and F[0] @ F[4] < 0.5
    assert F[0] @ F[3] > 0.85 > F[0] @ F[4] + 0.3   # the full model sees the paraphrase
    res = dedup([BASE, v5, v10, other], None, s.model_copy(update={"minhash": False}))
    assert res.kept_ids == ["0", "3"]


def _brute_pairs(E, thr, is_new=None):
    S = E @ E.T
    n = len(E)
    out = set()
    for i in range(n):
        for j in range(i + 1, n):
            if S[i, j] >= thr and (is_new is None or is_new[i] or is_new[j]):
                out.add((i, j))
    return out


def test_exact_pairs_uncapped_equal_brute_force_with_and_without_history():
    from evolforge.tasks.dedup.embedding import exact_pairs, normalize_rows

    rng = np.random.default_rng(3)
    base = normalize_rows(rng.normal(size=(40, 16)).astype(np.float32))
    E = normalize_rows(np.repeat(base, 5, axis=0) + 0.15 * rng.normal(size=(200, 16)).astype(np.float32))
    for is_new in (None, np.arange(200) >= 120):
        p, s = exact_pairs(E, 0.9, is_new, block=64)
        assert {tuple(x) for x in p.tolist()} == _brute_pairs(E, 0.9, is_new)
        assert np.allclose(s, np.einsum("ij,ij->i", E[p[:, 0]], E[p[:, 1]]), atol=1e-5)


@pytest.mark.parametrize("ann", [False, True])
def test_templated_input_keeps_candidates_linear_and_still_links_every_record(ann):
    """Hostile: thousands of records that differ in one number are all within the candidate cosine of each other.
    Candidates must stay O(n * max_neighbors) (not n^2 / 2), and every record must still be linked."""
    from evolforge.config.sections.dedup import DedupSettings
    from evolforge.tasks.dedup.embedding import neighbor_pairs, normalize_rows

    rng = np.random.default_rng(0)
    n = 3000
    E = normalize_rows(np.ones((n, 32), np.float32) + 0.01 * rng.normal(size=(n, 32)).astype(np.float32))
    s = DedupSettings(max_neighbors=8, ann_exact_below=100 if ann else 10_000, ann_cluster_size=100)
    p, sims = neighbor_pairs(E, 0.9, s)
    assert len(p) <= n * 8 and (sims >= 0.9).all()
    assert len(np.unique(p)) == n  # nobody is left without a neighbour
    assert (p[:, 0] < p[:, 1]).all() and len(np.unique(p[:, 0] * n + p[:, 1])) == len(p)
