"""The work folder of a dedup whose per-record work runs on the workers (tasks/dedup/distributed.py).

    WORK/<step>/done.json                the step's completion marker: its counts and the files it wrote
    WORK/<step>/started-<pid>.json       one per attempt: the worker process that took the step
    WORK/records/shard-<s>.parquet       shard s's records: id, text (and score for keep="best")
    WORK/records/shard-<s>/              the same texts packed (texts.npy + text_offsets.npy) and the scores
                                         (scores.npy): arrays a worker gathers single records from
    WORK/prep/shard-<s>/<name>.npy       shard s's exact keys and MinHash sketches (every record of the shard);
                                         bucketed/: its exact keys, rows and packed texts sorted by exact bucket
    WORK/<phase>/alive-<s>.npy           per record of shard s: alive after the phase; drops-<s>.parquet its
                                         records dropped by the phase (rows, reasons), in record order
    WORK/<phase>-cc/r<r>/...             the connected-components rounds: labels per node range, proposals per
                                         edge part (one file each, sorted by node range, with offsets)
    WORK/<phase>-route/part-<e>/...      edge part e's edges sorted by group (one file each, with offsets)
    WORK/<phase>-group/shard-<g>/...     group g's drops, in record order
    WORK/minhash/..., WORK/embedding/... the shared arrays (sketches, vectors, the ANN plan), the search parts

Every file is written under a temporary name and renamed; a step's marker is written last, so a step with a
marker is whole and a re-run (same input, same settings: the same WORK) takes it as done, and a step without
one (its worker was killed) is redone from its inputs. No file count grows with the records: a step writes a
fixed number of files per shard, and every many-to-many exchange (edges to groups, label proposals to node
ranges) is one file per sender sorted by receiver with an offsets array, which each receiver slices.

WORK is a local folder every worker sees (on several machines: a shared file system mounted at the same path),
or a URL of any fsspec filesystem (s3://bucket/prefix, ...): then each machine keeps a local mirror of the files
its steps read and write, uploading what it writes before the step's marker (storage/dedup_mirror.py). Either
way the arrays are memory-mapped local .npy files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from evolforge.storage import dedup_mirror as mirror
from evolforge.storage.fs import is_url


class DedupWork:
    """Paths and markers of one work folder (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.location = str(root).rstrip("/") if is_url(root) else str(root)   # what the steps are given
        self.root = mirror.mirror_root(self.location) if is_url(root) else Path(root)

    @staticmethod
    def for_input(base: str | Path, input_path: str | Path, settings_fingerprint: str, shards: int) -> "DedupWork":
        """The work folder of this input (path, size, mtime), these settings and this shard count under `base`."""
        key = json.dumps([*_identity(input_path), settings_fingerprint, shards])
        name = hashlib.sha1(key.encode()).hexdigest()[:16]
        return DedupWork(f"{str(base).rstrip('/')}/{name}" if is_url(base) else Path(base) / name)

    def step(self, name: str) -> Path:
        return self.root / name

    def marker(self, name: str) -> Path:
        return self.step(name) / "done.json"

    def done(self, name: str) -> dict | None:
        """The marker of a finished step, None when it did not finish."""
        try:
            raw = mirror.read_fresh(self.marker(name))
            return None if raw is None else json.loads(raw)
        except (OSError, ValueError):
            return None

    def mark_started(self, name: str) -> None:
        """WORK/<step>/started-<pid>.json: which worker process took the step, and when (one per attempt)."""
        write_json(self.step(name) / f"started-{os.getpid()}.json", {"pid": os.getpid(), "time": time.time()})

    def attempts(self, name: str) -> list[int]:
        """The worker processes that started the step, oldest first."""
        found = [json.loads(mirror.read_fresh(self.step(name) / n) or b"null")
                 for n in mirror.names(self.step(name), "started-")]
        return [r["pid"] for r in sorted((r for r in found if r), key=lambda r: r["time"])]

    def files(self) -> list[tuple[str, int]]:
        """(path in the folder, bytes) of every file the folder holds (on the store when it is a URL)."""
        return mirror.files(self.root)

    def remove(self) -> None:
        """The whole folder (and this machine's mirror of it)."""
        mirror.remove(self.root)

    def mark_done(self, name: str, record: dict) -> dict:
        write_json(self.marker(name), record)
        return record

    def records(self, shard: int) -> Path:
        return self.step("records") / f"shard-{shard:05d}.parquet"

    def record_arrays(self, shard: int) -> Path:
        return self.step("records") / f"shard-{shard:05d}"

    def alive(self, phase: str, shard: int) -> Path:
        return self.step(phase) / f"alive-{shard:05d}.npy"

    def drops(self, phase: str, shard: int) -> Path:
        return self.step(phase) / f"drops-{shard:05d}.parquet"

    def labels(self, phase: str, round_: int, node_range: int) -> Path:
        return self.step(f"{phase}-cc") / f"r{round_:03d}" / f"labels-{node_range:05d}.npy"

    def proposals(self, phase: str, round_: int, part: int) -> Path:
        return self.step(f"{phase}-cc") / f"r{round_:03d}" / f"proposals-{part:05d}"

    def routed(self, phase: str, part: int) -> Path:
        return self.step(f"{phase}-route") / f"part-{part:05d}"

    def group(self, phase: str, group: int) -> Path:
        return self.step(f"{phase}-group") / f"shard-{group:05d}"


def _identity(input_path: str | Path) -> list:
    """What names an input file's version: its absolute path or URL, size and modification time (or ETag)."""
    if is_url(input_path):
        import fsspec

        fs, path = fsspec.core.url_to_fs(str(input_path))
        info = fs.info(path)
        return [str(input_path), info.get("size"), str(info.get("ETag") or info.get("LastModified")
                                                       or info.get("mtime") or info.get("updated") or "")]
    st = os.stat(input_path)
    return [str(Path(input_path).resolve()), st.st_size, st.st_mtime_ns]


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def write_json(path: str | Path, obj) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    tmp.write_text(json.dumps(obj, default=float))
    tmp.replace(path)
    mirror.publish(path)


def read_json(path: str | Path):
    return json.loads(Path(mirror.local(path)).read_text())


def save_array(path: str | Path, a: np.ndarray) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path).with_suffix(".npy")
    np.save(tmp, np.ascontiguousarray(a), allow_pickle=False)
    tmp.replace(path)
    mirror.publish(path)
    return str(path)


def load_array(path: str | Path, mmap: bool = True) -> np.ndarray:
    return np.load(mirror.local(path), mmap_mode="r" if mmap else None, allow_pickle=False)


_MAPPED: dict[tuple, np.ndarray] = {}


def mapped(path: str | Path) -> np.ndarray:
    """load_array, memory-mapped once per process and file version (path, inode, mtime): a worker that reads
    the same label files in every step of a round sets up each map once. Files here are written once (renamed
    into place), so a new version is a new inode."""
    path = mirror.local(path)
    st = os.stat(path)
    key = (path, st.st_ino, st.st_mtime_ns)
    a = _MAPPED.get(key)
    if a is None:
        if len(_MAPPED) > 4096:
            _MAPPED.clear()
        a = _MAPPED[key] = load_array(path)
    return a


class ArrayWriter:
    """A .npy file written in row blocks (np.lib.format.open_memmap under a temporary name, renamed on close): an
    array concatenated from many shards' files without holding it."""

    def __init__(self, path: str | Path, shape: tuple, dtype):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = _tmp(self.path).with_suffix(".npy")
        self.a = np.lib.format.open_memmap(self.tmp, mode="w+", dtype=dtype, shape=shape)
        self.pos = 0

    def append(self, block: np.ndarray) -> None:
        self.a[self.pos: self.pos + len(block)] = block
        self.pos += len(block)

    def close(self) -> str:
        assert self.pos == len(self.a), (self.path, self.pos, len(self.a))
        self.a.flush()
        del self.a
        self.tmp.replace(self.path)
        mirror.publish(self.path)
        return str(self.path)


def save_strings(folder: str | Path, name: str, strings: list[str]) -> None:
    """Strings packed as UTF-8 bytes (<name>.npy) and offsets (<name>_offsets.npy): any one of them can be read
    from the memory-mapped files without reading the rest."""
    enc = [x.encode("utf-8", "surrogatepass") for x in strings]
    off = np.zeros(len(enc) + 1, np.int64)
    np.cumsum([len(b) for b in enc], out=off[1:])
    save_array(Path(folder) / f"{name}.npy", np.frombuffer(b"".join(enc), np.uint8))
    save_array(Path(folder) / f"{name}_offsets.npy", off)


def read_strings(folder: str | Path, name: str, a: int, b: int) -> list[str]:
    """Strings a:b of a save_strings pair, read without a memory map."""
    off = read_rows(Path(folder) / f"{name}_offsets.npy", a, b + 1)
    if b <= a:
        return []
    data = read_rows(Path(folder) / f"{name}.npy", int(off[0]), int(off[-1])).tobytes()
    rel = (off - off[0]).tolist()
    return [data[rel[i]: rel[i + 1]].decode("utf-8", "surrogatepass") for i in range(b - a)]


class PackedStrings:
    """The strings save_strings wrote, memory-mapped: `take(rows)` decodes only those."""

    def __init__(self, folder: str | Path, name: str):
        self.data = load_array(Path(folder) / f"{name}.npy")
        self.off = load_array(Path(folder) / f"{name}_offsets.npy")

    def __len__(self) -> int:
        return len(self.off) - 1

    def take(self, rows) -> list[str]:
        d, o = self.data, self.off
        return [bytes(d[o[i]: o[i + 1]]).decode("utf-8", "surrogatepass") for i in np.asarray(rows).tolist()]


def save_grouped(folder: str | Path, arrays: dict[str, np.ndarray], dest: np.ndarray, receivers: int) -> None:
    """One sender's rows for many receivers in one folder: `arrays` (same length) sorted by `dest` (stable: a
    receiver gets its rows in the sender's order) and start.npy, receiver r's rows being start[r]:start[r + 1]."""
    order = np.argsort(dest, kind="stable")
    for k, a in arrays.items():
        save_array(Path(folder) / f"{k}.npy", np.asarray(a)[order])
    save_array(Path(folder) / "start.npy", np.searchsorted(dest[order], np.arange(receivers + 1)).astype(np.int64))


_HEADER = re.compile(r"'descr':\s*'([^']+)',\s*'fortran_order':\s*(True|False),\s*'shape':\s*\(([^)]*)\)")


def read_rows(path: str | Path, a: int = 0, b: int | None = None) -> np.ndarray:
    """Rows a:b (b None: to the end) of a .npy file this module wrote, read with one seek: a memory map or
    np.load costs ~0.25 ms of set-up and header parsing, which a receiver slicing hundreds of senders' files
    pays hundreds of times; this parses the header with one regular expression."""
    with open(mirror.local(path), "rb") as fh:
        head = fh.read(12)
        if head[:6] != b"\x93NUMPY":
            raise ValueError(f"{path}: not a .npy file")
        if head[6] == 1:
            size, start = int.from_bytes(head[8:10], "little"), 10
        else:
            size, start = int.from_bytes(head[8:12], "little"), 12
        fh.seek(start)
        m = _HEADER.search(fh.read(size).decode("latin1"))
        if m is None or m.group(2) == "True":
            raise ValueError(f"{path}: unsupported .npy header")
        dtype = np.dtype(m.group(1))
        shape = tuple(int(x) for x in m.group(3).split(",") if x.strip())
        n = shape[0] if shape else 1
        b = n if b is None else min(b, n)
        row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        fh.seek(start + size + a * row * dtype.itemsize)
        out = np.fromfile(fh, dtype=dtype, count=max(b - a, 0) * row)
    return out.reshape((max(b - a, 0),) + tuple(shape[1:]))


def load_grouped(folder: str | Path, receiver: int, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Receiver `receiver`'s rows of a save_grouped folder (only those bytes are read)."""
    start = read_rows(Path(folder) / "start.npy", receiver, receiver + 2)
    a, b = int(start[0]), int(start[1])
    return {k: read_rows(Path(folder) / f"{k}.npy", a, b) for k in names}


def write_table(path: str | Path, table: pa.Table) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    pq.write_table(table, tmp)
    tmp.replace(path)
    mirror.publish(path)
    return str(path)


def read_table(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    return pq.read_table(mirror.local(path), columns=columns)
