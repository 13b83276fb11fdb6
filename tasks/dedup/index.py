"""Persistent, incremental dedup index: everything accepted so far, per dataset.

    INDEX_DIR/
      manifest.json           format version, settings fingerprint, segment list, record count, and per file
                              its records and origin ("entries": {name: {"records", "run", "source", "round"}})
      manifest.lock           the lock every transaction holds (see `index_lock`)
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

Sharing: several flows may use one index (the nightly flow keeps one per
dataset). Every transaction on it -- read the manifest, dedup, append, commit;
or a rollback -- holds the index lock (`index_lock`): other processes wait up
to `dedup.index_lock_timeout_seconds`, then fail naming the holder.

Rollback: a segment appended for an evolve run carries that run's tag and
round (`source`); `rollback_index(folder, run, from_round)` drops the files a
run appended for its rounds >= from_round (what `evolforge retry` and a redone
dedup step need), leaving every other run's and night's segments as they are.
Entries without a run tag (indexes written before format 2, the dedup flow)
are never rolled back. Format 1 indexes load and are upgraded on the next write.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.fs import AnyPath, atomic_output, ensure_dir, exists, location, read_bytes, read_text, unlink
from evolforge.storage.layout import IndexLayout
from evolforge.storage.locks import lock_file
from evolforge.tasks.dedup.minhash import Sketches, empty_sketches

FORMAT = 2          # 2: per-file "entries" (records, run, round) and a "next" file number; 1 still loads
READABLE_FORMATS = (1, 2)
log = logging.getLogger("evolforge.dedup_index")
_FINGERPRINT_KEYS = ("exact", "minhash", "embedding", "nfkc", "casefold", "collapse_whitespace", "punctuation",
                     "shingle_kind", "shingle_size", "num_perm", "bands", "rows", "seed", "embedding_model")


class IndexMismatch(ValueError):
    """The index was built with settings that make its contents incomparable."""


class IndexLocked(TimeoutError):
    """Another flow kept the index locked longer than dedup.index_lock_timeout_seconds."""


_HELD = threading.local()  # lock file -> depth, per thread: a transaction may nest (dedup step -> dedup -> append)


@contextlib.contextmanager
def index_lock(folder: str | Path | AnyPath, settings: DedupSettings | None = None) -> Iterator[None]:
    """Hold the index's lock for one transaction (read manifest -> dedup -> append -> commit).

    Reentrant within a thread. Another holder (process, machine, or thread) is waited for up to
    `index_lock_timeout_seconds`, then IndexLocked names the index and the holder. Locally the lock is
    a flock on INDEX/manifest.lock; on an object store an object created exclusively, broken when older
    than `index_lock_stale_seconds` (storage/locks.py `lock_file`).
    """
    s = settings or DedupSettings()
    folder = location(folder)
    path = IndexLayout(folder).lock
    depth = _HELD.__dict__.setdefault("depth", {})
    key = str(path)
    if depth.get(key):
        depth[key] += 1
        try:
            yield
        finally:
            depth[key] -= 1
        return
    ensure_dir(folder)
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(lock_file(path, timeout=s.index_lock_timeout_seconds,
                                      stale_seconds=s.index_lock_stale_seconds, what=f"dedup index {folder}"))
    except TimeoutError as e:
        raise IndexLocked(f"{e}. Another flow is deduplicating against the same index; it waits for it up to "
                          "dedup.index_lock_timeout_seconds") from None
    with stack:
        depth[key] = 1
        try:
            yield
        finally:
            depth.pop(key, None)


def _read_manifest(layout: IndexLayout) -> dict | None:
    if not exists(layout.manifest):
        return None
    m = json.loads(read_text(layout.manifest))
    if m.get("format") not in READABLE_FORMATS:
        raise IndexMismatch(f"{layout.manifest}: index format {m.get('format')}, this evolforge reads "
                            f"{' and '.join(map(str, READABLE_FORMATS))} (written by a newer version?)")
    m.setdefault("full", [])
    m.setdefault("entries", {})
    return m


def _take_number(m: dict) -> int:
    """The next file number: never one a file named by the manifest has (format 1 numbered by file count)."""
    if "next" not in m:
        nums = [int(x) for name in m["segments"] + m["full"] for x in re.findall(r"-(\d+)\.npz$", name)]
        m["next"] = max([len(m["segments"]) + len(m["full"]), *nums]) + 1
    n = m["next"]
    m["next"] = n + 1
    return n


def _write_manifest(layout: IndexLayout, m: dict) -> None:
    m["format"] = FORMAT
    _atomic_write(layout.manifest, lambda fh: fh.write(json.dumps(m, indent=1).encode()))


def _segment_records(layout: IndexLayout, m: dict, name: str) -> int:
    n = m["entries"].get(name, {}).get("records")
    if n is None:  # format 1: count from the segment itself
        with _load_npz(layout.file(name)) as z:
            n = len(z["ids_off"]) - 1
    return int(n)


def _rolled_back(entry: Mapping | None, run: str, from_round: int) -> bool:
    return bool(entry) and entry.get("run") == run and int(entry.get("round", -1)) >= from_round


def rollback_index(folder: str | Path | AnyPath, run: str, from_round: int,
                   settings: DedupSettings | None = None) -> dict:
    """Drop what run `run` appended for its rounds >= `from_round` (segments and full-model files), under the lock.

    The index then holds what it held before round `from_round` of that run, plus everything other runs
    appended meanwhile. Full-model vectors of the remaining rows are kept (renumbered into a new file
    when rows before them went). The manifest is replaced atomically; the dropped files are deleted
    after it. Returns {"segments", "records", "full"}: what was dropped.
    """
    folder = location(folder)
    layout = IndexLayout(folder)
    dropped = {"segments": 0, "records": 0, "full": 0}
    with index_lock(folder, settings):
        m = _read_manifest(layout)
        if m is None:
            return dropped
        entries = m["entries"]
        drop = {n for n in m["segments"] + m["full"] if _rolled_back(entries.get(n), run, from_round)}
        if not drop:
            return dropped
        sizes = {n: _segment_records(layout, m, n) for n in m["segments"]}
        keep = np.concatenate([np.full(sizes[n], n not in drop) for n in m["segments"]] or [np.zeros(0, bool)])
        new_row = np.where(keep, np.cumsum(keep) - 1, -1)
        remove = set(drop)
        full = []
        for name in m["full"]:
            if name in drop:
                continue
            with _load_npz(layout.file(name)) as z:
                rows, vecs = z["rows"], z["vecs"]
            moved = new_row[rows]
            if (moved == rows).all():
                full.append(name)
                continue
            remove.add(name)
            ok = moved >= 0
            if ok.any():
                renamed = f"full-{_take_number(m):06d}.npz"
                _atomic_write(layout.file(renamed), lambda fh: np.savez(fh, rows=moved[ok], vecs=vecs[ok]))
                entries[renamed] = {**entries.get(name, {}), "records": int(ok.sum())}
                full.append(renamed)
        dropped = {"segments": sum(n in drop for n in m["segments"]),
                   "records": sum(sizes[n] for n in m["segments"] if n in drop), "full": sum(n in drop for n in m["full"])}
        m["segments"] = [n for n in m["segments"] if n not in drop]
        m["full"] = full
        m["count"] = int(keep.sum())
        m["entries"] = {n: e for n, e in entries.items() if n not in remove}
        _write_manifest(layout, m)
        for name in remove:
            unlink(layout.file(name))
    log.info("dedup index %s: rolled back run %s from round %d: %s", folder, run, from_round, dropped)
    return dropped


def index_state(folder: str | Path | AnyPath) -> str:
    """A digest of the index's committed state (its manifest; "" for an index without one): it changes with every
    append and rollback."""
    path = IndexLayout(location(folder)).manifest
    return hashlib.sha1(read_bytes(path)).hexdigest()[:16] if exists(path) else ""


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
        m = _read_manifest(self.layout)
        if m is None:
            return {"format": FORMAT, "fingerprint": self.fp, "segments": [], "full": [], "count": 0, "entries": {},
                    "next": 1}
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
               static: np.ndarray, full_new: dict[int, np.ndarray] | None = None,
               source: Mapping | None = None) -> None:
        """Add accepted records (and full-model embeddings of any indexed rows) and save atomically.

        `source` ({"run", "source", "round"}) is recorded with the new files, for `rollback_index`.
        Call it inside `index_lock` together with the `load` it extends (pipeline.dedup does).
        """
        ensure_dir(self.folder)
        m = self._manifest()
        origin = dict(source or {})
        if len(ids):
            name = f"seg-{_take_number(m):06d}.npz"
            i_data, i_off = _pack(ids)
            t_data, t_off = _pack(texts)
            arrays = dict(ids=i_data, ids_off=i_off, texts=t_data, texts_off=t_off, exact=np.asarray(exact, np.uint64),
                          sh_off=sketches.offsets, sh_val=sketches.values, sig=sketches.signatures, bands=sketches.band_keys,
                          static=np.asarray(static, np.float16))
            _atomic_write(self.layout.file(name), lambda fh: np.savez(fh, **arrays))
            m["segments"].append(name)
            m["entries"][name] = {"records": len(ids), **origin}
            m["count"] += len(ids)
        if full_new:
            name = f"full-{_take_number(m):06d}.npz"
            rows = np.array(sorted(full_new), dtype=np.int64)
            vecs = np.stack([full_new[int(r)] for r in rows]).astype(np.float16)
            _atomic_write(self.layout.file(name), lambda fh: np.savez(fh, rows=rows, vecs=vecs))
            m["full"].append(name)
            m["entries"][name] = {"records": len(rows), **origin}
        _write_manifest(self.layout, m)
