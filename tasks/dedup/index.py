"""Persistent, incremental dedup index: everything accepted so far, per dataset.

    INDEX_DIR/
      manifest.json           format version, settings fingerprint, segment list, record count
      seg-000001.npz ...      one segment per dedup call that accepted records (append-only)
      full-000001.npz ...     full-model embeddings computed later for indexed records (row, vector)

A segment holds, for its records: ids and original texts (UTF-8 + offsets),
exact keys, MinHash shingle sets (CSR), signatures and band keys, and static
embeddings (float16). New records are checked against all of it without
re-hashing or re-embedding history. Every file is written atomically
(storage/fs.py: temporary file, fsync, rename; or a whole object on a remote
store), and the manifest is replaced last: a crash leaves the previous index
intact (an orphan segment not named in the manifest is ignored and
overwritten later). INDEX_DIR may be a local folder or an fsspec URL.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.fs import atomic_output, ensure_dir, exists, location, read_bytes, read_text
from evolforge.storage.layout import IndexLayout
from evolforge.tasks.dedup.minhash import Sketches, empty_sketches

FORMAT = 1
_FINGERPRINT_KEYS = ("exact", "minhash", "embedding", "nfkc", "casefold", "collapse_whitespace", "punctuation",
                     "shingle_kind", "shingle_size", "num_perm", "bands", "rows", "seed", "embedding_model")


class IndexMismatch(ValueError):
    """The index was built with settings that make its contents incomparable."""


def fingerprint(settings: DedupSettings, static_model: str = "") -> dict:
    fp = {k: getattr(settings, k) for k in _FINGERPRINT_KEYS}
    fp["static_model"] = static_model
    return fp


def _pack(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    enc = [s.encode("utf-8") for s in strings]
    off = np.concatenate([[0], np.cumsum([len(b) for b in enc])]).astype(np.int64)
    return np.frombuffer(b"".join(enc), dtype=np.uint8), off


def _unpack(data: np.ndarray, off: np.ndarray) -> list[str]:
    raw = data.tobytes()
    return [raw[off[i]: off[i + 1]].decode("utf-8") for i in range(len(off) - 1)]


def _atomic_write(path, write) -> None:
    with atomic_output(path, "wb") as fh:
        write(fh)


def _load_npz(path):
    return np.load(io.BytesIO(read_bytes(path)))


@dataclass
class IndexData:
    """In-memory view of indexed (accepted) records; row order = acceptance order."""

    ids: list[str]
    texts: list[str]
    exact: np.ndarray
    sketches: Sketches
    static: np.ndarray                                          # float32 (n, d) or (n, 0)
    full: dict[int, np.ndarray] = field(default_factory=dict)   # row -> full-model embedding

    def __len__(self) -> int:
        return len(self.ids)


def empty_data(settings: DedupSettings, dim: int = 0) -> IndexData:
    return IndexData([], [], np.zeros(0, np.uint64), empty_sketches(settings), np.zeros((0, dim), np.float32))


class DedupIndex:
    def __init__(self, folder: str | Path, settings: DedupSettings, static_model: str = ""):
        self.folder = location(folder)
        self.settings = settings
        self.fp = fingerprint(settings, static_model)
        self.layout = IndexLayout(self.folder)
        self.manifest_path = self.layout.manifest

    def _manifest(self) -> dict:
        if not exists(self.manifest_path):
            return {"format": FORMAT, "fingerprint": self.fp, "segments": [], "full": [], "count": 0}
        m = json.loads(read_text(self.manifest_path))
        if m.get("format") != FORMAT:
            raise IndexMismatch(f"{self.manifest_path}: index format {m.get('format')}, expected {FORMAT}")
        diff = {k: (m["fingerprint"].get(k), v) for k, v in self.fp.items() if m["fingerprint"].get(k) != v}
        if diff:
            raise IndexMismatch(f"{self.folder}: built with different dedup settings {diff} (index value, current value); "
                                "use a new index folder or the original settings")
        return m

    def load(self, dim: int = 0) -> IndexData:
        m = self._manifest()
        if not m["segments"]:
            return empty_data(self.settings, dim)
        ids, texts, exact, parts, static = [], [], [], [], []
        for name in m["segments"]:
            with _load_npz(self.layout.file(name)) as z:
                ids += _unpack(z["ids"], z["ids_off"])
                texts += _unpack(z["texts"], z["texts_off"])
                exact.append(z["exact"])
                parts.append(Sketches(z["sh_off"], z["sh_val"], z["sig"], z["bands"]))
                static.append(z["static"].astype(np.float32))
        full: dict[int, np.ndarray] = {}
        for name in m.get("full", []):
            with _load_npz(self.layout.file(name)) as z:
                full.update(zip(z["rows"].tolist(), z["vecs"].astype(np.float32)))
        st = np.concatenate(static) if static else np.zeros((0, dim), np.float32)
        return IndexData(ids, texts, np.concatenate(exact), Sketches.concat(parts, self.settings), st, full)

    def append(self, ids: Sequence[str], texts: Sequence[str], exact: np.ndarray, sketches: Sketches,
               static: np.ndarray, full_new: dict[int, np.ndarray] | None = None) -> None:
        """Add accepted records (and full-model embeddings of any indexed rows) and save atomically."""
        ensure_dir(self.folder)
        m = self._manifest()
        n_seg = len(m["segments"]) + len(m.get("full", [])) + 1
        if len(ids):
            name = f"seg-{n_seg:06d}.npz"
            i_data, i_off = _pack(ids)
            t_data, t_off = _pack(texts)
            arrays = dict(ids=i_data, ids_off=i_off, texts=t_data, texts_off=t_off, exact=np.asarray(exact, np.uint64),
                          sh_off=sketches.offsets, sh_val=sketches.values, sig=sketches.signatures, bands=sketches.band_keys,
                          static=np.asarray(static, np.float16))
            _atomic_write(self.layout.file(name), lambda fh: np.savez(fh, **arrays))
            m["segments"].append(name)
            m["count"] += len(ids)
            n_seg += 1
        if full_new:
            name = f"full-{n_seg:06d}.npz"
            rows = np.array(sorted(full_new), dtype=np.int64)
            vecs = np.stack([full_new[int(r)] for r in rows]).astype(np.float16)
            _atomic_write(self.layout.file(name), lambda fh: np.savez(fh, rows=rows, vecs=vecs))
            m.setdefault("full", []).append(name)
        _atomic_write(self.manifest_path, lambda fh: fh.write(json.dumps(m, indent=1).encode()))
