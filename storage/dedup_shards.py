"""The arrays the dedup driver and its shard workers exchange (tasks/dedup/shards.py, flows/dedup.py).

    SHARD_DIR/<stage>-<n>/<name>.npy          the stage's shared inputs (sketches, or vectors + the ANN plan)
    SHARD_DIR/<stage>-<n>/out-<i>/<name>.npy  shard i's result

Plain .npy files, so every worker memory-maps the shared inputs read-only (one copy in the page cache for all
workers on a machine, not one per worker). SHARD_DIR is a local folder that every worker sees (on one machine
any local folder; across machines a shared file system mounted at the same path) or a URL of any fsspec
filesystem, which each machine reaches through a local mirror (storage/dedup_mirror.py). The driver removes
a stage's folder once it has read the results.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import numpy as np

from evolforge.storage import dedup_mirror as mirror
from evolforge.storage.fs import is_url


def new_stage_dir(root: str | Path | None, stage: str) -> Path:
    """A fresh folder for one sharded stage under `root` (default: the system temporary folder)."""
    if root and is_url(root):  # on the store, through this machine's mirror (storage/dedup_mirror.py)
        base = mirror.mirror_root(str(root))
    else:
        base = Path(root) if root else Path(tempfile.gettempdir()) / "evolforge-dedup-shards"
    d = base / f"{stage}-{uuid.uuid4().hex[:12]}"
    d.mkdir(parents=True)
    return d


def save_arrays(folder: str | Path, arrays: dict[str, np.ndarray]) -> dict[str, str]:
    """Write each array to folder/<name>.npy (written under a temporary name, then renamed); returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, a in arrays.items():
        path = folder / f"{name}.npy"
        tmp = folder / f".{name}.{uuid.uuid4().hex[:8]}.npy"
        np.save(tmp, np.ascontiguousarray(a), allow_pickle=False)
        tmp.replace(path)
        mirror.publish(path)
        out[name] = str(path)
    return out


def load_arrays(paths: dict[str, str], mmap: bool = True) -> dict[str, np.ndarray]:
    """The arrays at `paths` (memory-mapped read-only by default)."""
    return {name: np.load(mirror.local(p), mmap_mode="r" if mmap else None, allow_pickle=False)
            for name, p in paths.items()}


def register_store(root: str | None) -> None:
    """A worker of a sharded stage whose SHARD_DIR is a URL: map the stage's mirror paths to the store."""
    if root and is_url(root):
        mirror.mirror_root(root)


def remove_stage_dir(folder: str | Path) -> None:
    mirror.remove(folder)
