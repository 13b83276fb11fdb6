"""A work folder kept in memory: the one-process dedup's (`DedupWork.fresh`), whose steps all run in the process
that owns the folder, so no other process needs its files.

The steps read and write the work folder through storage/dedup_work.py's functions only (save_array, load_array,
save_strings, ...). Those look here first: a path in an in-memory folder names an entry of its store (an array,
or a list of strings for save_strings) instead of a file. Nothing else changes: the same paths, the same arrays,
the same decisions. An array the store keeps is read-only, as a memory-mapped file is.

A store keeps an array (or a list of strings) of at most `ARRAY_BYTES`, and at most `BUDGET` bytes in all; any
other is written to its file as in any work folder (the folder is made on disk then, and removed with the
store). The cost the store saves is per file (create, rename, remove: a small dedup wrote hundreds of small
files), not per byte: a large dedup in one process keeps its large arrays in memory-mapped files, as before (the
page cache holds them, not the process), and only its small ones in memory, while a small dedup (an evolve
round's) makes no file at all. Whether an array is kept or written never changes what is read back.

A store opened with `transient=True` (a dedup without an index: no Index step reads a record's sketches or vectors
again) also keeps a step's large *transient* arrays, those only the next step reads (save_array(...,
transient=True): a record shard's MinHash sketches, read once by the Minhash step; its static vectors, read once
by the Embedding step), within the budget, whatever their size; that reader `release`s them when it has copied
them into its shared arrays. Such an array is in the process's memory from its making to that release, as its
memory-mapped file was while the reader read it (the step that makes it holds it whole anyway): the peak is not
raised, and the write, the page faults of the map and the removal of the file are saved.
"""

from __future__ import annotations

import os
import threading

import numpy as np

ARRAY_BYTES = 16 << 20   # the largest array a store keeps in memory; larger ones go to files
BUDGET = 512 << 20       # bytes a store keeps in memory in all; beyond them its arrays go to files

_STORES: dict[str, "MemoryStore"] = {}   # work folder (its path as a string) -> its store
_LOCK = threading.Lock()


class Strings(list):
    """The strings save_strings was given, kept as they are."""


class MemoryStore:
    """The entries of one in-memory work folder, by path (a file name in the folder's own directory)."""

    def __init__(self, root: str, budget: int, transient: bool = False):
        self.root, self.budget, self.used, self.transient = root, budget, 0, transient
        self.entries: dict[str, np.ndarray | Strings] = {}
        self.released: set[str] = set()   # transient entries: `release` drops them

    def reserve(self, nbytes: int, transient: bool = False) -> bool:
        """Room for an array of `nbytes` (taken when there is); a transient one of any size in a transient store."""
        if (nbytes > ARRAY_BYTES and not (transient and self.transient)) or self.used + nbytes > self.budget:
            return False
        self.used += nbytes
        return True

    def put_array(self, path: str, a: np.ndarray, transient: bool = False) -> bool:
        """Keeps `a` (C order, read-only) under `path` when it fits the budget; False when it does not."""
        a = np.ascontiguousarray(a)
        if not self.reserve(a.nbytes, transient):
            return False
        a = a.view()
        a.flags.writeable = False
        self.entries[path] = a
        if transient and self.transient:
            self.released.add(path)
        return True

    def release(self, path: str) -> None:
        """Drops a transient entry (its one reader is done with it); nothing for any other entry or a file."""
        if path in self.released:
            self.released.discard(path)
            e = self.entries.pop(path, None)
            if e is not None:
                self.used -= e.nbytes

    def put_strings(self, path: str, strings: list[str]) -> bool:
        kept = Strings(strings)
        if not self.reserve(8 * len(kept) + sum(map(len, kept))):
            return False
        self.entries[path] = kept
        return True

    def files(self) -> list[tuple[str, int]]:
        """(name in the folder, bytes) of every entry."""
        return [(os.path.basename(p), e.nbytes if isinstance(e, np.ndarray) else sum(map(len, e)))
                for p, e in self.entries.items()]


def open_store(root: str, budget: int | None = None, transient: bool = False) -> MemoryStore:
    """The store of a new in-memory work folder at `root` (a path no other folder uses); `transient`: it keeps
    transient arrays of any size (see the module docstring)."""
    store = MemoryStore(str(root), BUDGET if budget is None else budget, transient)
    with _LOCK:
        _STORES[store.root] = store
    return store


def close_store(root: str) -> None:
    with _LOCK:
        _STORES.pop(str(root), None)


def store_at(root) -> MemoryStore | None:
    """The store of the in-memory work folder at `root`, None when it is not one."""
    return _STORES.get(str(root))


def store_of(path) -> MemoryStore | None:
    """The store whose folder holds `path` (a work folder's data files are all in the folder itself); None for a
    file of any other folder."""
    if not _STORES:
        return None
    return _STORES.get(os.path.dirname(str(path)))


def release(path) -> None:
    """A transient array's reader is done with it: its store drops it (nothing for a file)."""
    store = store_of(path)
    if store is not None:
        store.release(str(path))


def take(path) -> np.ndarray | None:
    """A transient array taken out of its store (the taker is its one reader, and now its owner: writeable when its
    memory is the step's that made it); None when `path` is not one (a file, or kept under the plain rules)."""
    store = store_of(path)
    if store is None or str(path) not in store.released:
        return None
    store.released.discard(str(path))
    a = store.entries.pop(str(path))
    store.used -= a.nbytes
    try:
        a.flags.writeable = True
    except ValueError:
        return None
    return a


def entry(path) -> np.ndarray | Strings | None:
    """What an in-memory folder keeps under `path`; None when it is a file (not in memory, or written out)."""
    store = store_of(path)
    return None if store is None else store.entries.get(str(path))
