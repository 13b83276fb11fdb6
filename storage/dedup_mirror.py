"""A dedup work folder on an object store (`dedup.shard_dir` = s3://..., gs://..., any fsspec URL).

The steps of the dedup on the workers memory-map .npy files, which needs local files. So a work folder at a URL
has a local mirror on every machine that runs a step:

    <tmp>/evolforge-dedup-mirror/<sha1(url)[:16]>/...   the same relative paths as URL/...

- every file a step writes is written into the mirror (under a temporary name, renamed) and then uploaded to the
  URL before the step's marker is (storage/dedup_work.py writes the marker last), so a marker on the store means
  the step's files are all there: an object store publishes an object only when its upload is complete;
- every file a step reads is taken from the mirror, and downloaded into it first when it is not there (a step
  that ran on another machine wrote it). Work files are written once per step and never changed, so a mirrored
  copy is never stale;
- markers are read from the store, never from a mirror: a worker killed between its local write and its upload
  leaves no marker anywhere, and the step is redone.

Paths in step records are mirror paths. Another machine maps them by their `evolforge-dedup-mirror/<hash>/`
part, so its temporary folder may differ. Only the shared store must be common to all machines; each one's
mirror holds the files of the steps it ran or read. Credentials come from the environment, as for output folders
(storage/fs.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

_MARK = "evolforge-dedup-mirror"
_HASH = 16   # hex digits of a mirror's name
_URLS: dict[str, tuple[object, str]] = {}   # mirror hash -> (fsspec filesystem, the URL's path on it)


def mirror_root(url: str) -> Path:
    """This machine's mirror of the work folder at `url`, registered so that its paths map to the URL."""
    h = hashlib.sha1(url.rstrip("/").encode()).hexdigest()[:_HASH]
    if h not in _URLS:
        import fsspec

        fs, path = fsspec.core.url_to_fs(url)
        _URLS[h] = (fs, path.rstrip("/"))
    return Path(tempfile.gettempdir()) / _MARK / h


def remote(path: str | Path) -> tuple[object, str, str] | None:
    """(filesystem, the file's path on it, its path in this machine's mirror) of a mirror path; None when the
    path is not in a registered mirror (a local work folder)."""
    if not _URLS:
        return None
    p = str(path)
    i = p.find(f"/{_MARK}/")
    if i < 0:
        return None
    start = i + len(_MARK) + 2   # past "/<mark>/"
    h, rest = p[start: start + _HASH], p[start + _HASH:]
    entry = _URLS.get(h)
    if entry is None:
        return None
    return entry[0], entry[1] + rest, str(Path(tempfile.gettempdir()) / _MARK / h) + rest


def local(path: str | Path) -> str:
    """The local file to read for `path`: itself in a local work folder; in a mirror, downloaded first when this
    machine does not have it yet (FileNotFoundError when the store does not have it either)."""
    r = remote(path)
    if r is None:
        return str(path)
    fs, key, mine = r
    if not os.path.exists(mine):
        os.makedirs(os.path.dirname(mine), exist_ok=True)
        tmp = f"{mine}.{uuid.uuid4().hex[:8]}.part"
        try:
            fs.get_file(key, tmp)
            os.replace(tmp, mine)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return mine


def publish(path: str | Path) -> None:
    """Upload a file just written into a mirror to the store (nothing for a local work folder)."""
    r = remote(path)
    if r is not None:
        r[0].put_file(str(path), r[1])


def read_fresh(path: str | Path) -> bytes | None:
    """A file's bytes as the shared store has them now, None when it has none: for a mirror path the store's
    object, never the mirror's copy (what markers are read with); a local file otherwise."""
    r = remote(path)
    try:
        if r is None:
            return Path(path).read_bytes()
        return r[0].cat_file(r[1])
    except FileNotFoundError:
        return None


def names(folder: str | Path, prefix: str) -> list[str]:
    """The names of the files in `folder` that start with `prefix` (on the store for a mirror path)."""
    r = remote(folder)
    try:
        if r is None:
            return sorted(f.name for f in Path(folder).iterdir() if f.name.startswith(prefix))
        return sorted(n for n in (p.rstrip("/").rsplit("/", 1)[-1] for p in r[0].ls(r[1], detail=False))
                      if n.startswith(prefix))
    except FileNotFoundError:
        return []


def files(root: str | Path) -> list[tuple[str, int]]:
    """(path relative to the folder, bytes) of every file of a work folder, local or on the store."""
    r = remote(root)
    if r is None:
        base = Path(root)
        return [(str(f.relative_to(base)), f.stat().st_size) for f in base.rglob("*") if f.is_file()]
    fs, key, _ = r
    try:
        found = fs.find(key, detail=True)
    except FileNotFoundError:
        return []
    key = key.strip("/")
    return [(p.strip("/")[len(key):].lstrip("/"), int(info.get("size") or 0))
            for p, info in found.items() if info.get("type") != "directory"]


def remove(root: str | Path) -> None:
    """A work folder: on the store, and this machine's mirror of it."""
    r = remote(root)
    if r is not None:
        fs, key, mine = r
        try:
            fs.rm(key, recursive=True)
        except FileNotFoundError:
            pass
        shutil.rmtree(mine, ignore_errors=True)
    else:
        shutil.rmtree(root, ignore_errors=True)
