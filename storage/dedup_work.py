"""The work folder of a dedup: the one format in which the dedup's steps exchange files (tasks/dedup/plan.py), in
one process or on the workers.

    WORK/<step>/done.json                the step's completion marker: its counts and the files it wrote (steps
                                         run by the flow; a dedup in one process keeps none)
    WORK/<step>/started-<pid>.json       one per attempt: the worker process that took the step
    WORK/records.shard-<s>.*             shard s's records: ids and texts (packed: .<name>.npy + .<name>_offsets.npy,
                                         any single one read from the memory-mapped files), scores (keep="best")
    WORK/history.index.*                 the persistent index's records, when the dedup runs against one: ids,
                                         texts, exact keys sorted by exact bucket (.bucketed.*), MinHash sketches,
                                         static vectors, full-model vectors (rows, vectors)
    WORK/prep.shard-<s>.*                shard s's exact keys and MinHash sketches (every record of the shard);
                                         .bucketed.*: its exact keys, rows and packed texts sorted by exact bucket
    WORK/exact.bucket-<b>.*              exact bucket b's drops, sorted by record shard
    WORK/<phase>.alive-<s>.npy           per record of shard s: alive after the phase; <phase>.drops-<s>.npy its
                                         records dropped by the phase (rows, reasons), in record order
    WORK/minhash.shared.*, WORK/embedding.shared.*   the shared arrays of a search (sketches; vectors, ANN plan)
    WORK/bands.out-<i>.*, WORK/ann.out-<i>.*         search part i's pairs (or neighbours)
    WORK/<phase>-cc.r<r>.*               the connected-components rounds: labels per node range, proposals per
                                         edge part (sorted by node range, with offsets)
    WORK/<phase>-route.part-<e>.*        edge part e's edges sorted by group (with offsets)
    WORK/<phase>-group.shard-<g>.*       group g's drops, sorted by record shard
    WORK/embed.shard-<s>.vectors.npy     static vectors of shard s's records alive before the embedding phase
    WORK/embedding-uncertain.shard-<g>.* group g's pairs the static model is unsure of
    WORK/confirm.confirmed.*             the full model's cosines (by pair code) and the vectors it computed

The data files are all in WORK itself, named <kind>.<name> (`data`; a group of arrays is a name prefix,
<group>.<name>.npy: `member`): folders cost far more than files to make and to remove (a removal is a discard on
a disk that trims), and only the flow's markers need one per step.

Record numbers: a new record is its row in the input (0..n-1); an indexed record h is -(h + 1).

Every file is written under a temporary name and renamed; a step's marker is written last, so a step with a
marker is whole and a re-run (same input, same settings: the same WORK) takes it as done, and a step without
one (its worker was killed) is redone from its inputs. No file count grows with the records: a step writes a
fixed number of files per shard, and every many-to-many exchange (edges to groups, label proposals to node
ranges, drops to record shards) is one file per sender sorted by receiver with an offsets array, which each
receiver slices.

WORK is a local folder every worker sees (on several machines: a shared file system mounted at the same path),
or a URL of any fsspec filesystem (s3://bucket/prefix, ...): then each machine keeps a local mirror of the files
its steps read and write, uploading what it writes before the step's marker (storage/dedup_mirror.py). Either
way the arrays are memory-mapped local .npy files. A dedup in one process uses a fresh folder of its own
(`DedupWork.fresh`), removed when it returns, whose small arrays are kept in memory (storage/dedup_memory.py:
its steps all run in this process, so they exchange those as arrays, not files; its large ones are files as
above), and without an index its transient arrays too, whatever their size (a shard's sketches and vectors, read
by one step, which releases them; with one shard the sketches become the Minhash step's shared arrays in place).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from evolforge.storage import dedup_memory as memory
from evolforge.storage import dedup_mirror as mirror
from evolforge.storage.fs import is_url

_BASE = "evolforge-dedup-work"


def _remove_orphans(base: Path) -> None:
    """The run-<pid>-* folders under `base` whose process is gone (killed before it removed its own)."""
    for d in base.glob("run-*-*"):
        try:
            os.kill(int(d.name.split("-")[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError, OSError):
            pass


SKETCH_ARRAYS = ("offsets", "values", "signatures", "band_keys")   # a MinHash sketch set, one .npy file each


class DedupWork:
    """Paths and markers of one work folder (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.location = str(root).rstrip("/") if is_url(root) else str(root)   # what the steps are given
        self.root = mirror.mirror_root(self.location) if is_url(root) else Path(root)

    @staticmethod
    def base(shard_dir: str) -> str:
        """Where work folders go: `dedup.shard_dir`, else the system temporary folder."""
        return shard_dir or str(Path(tempfile.gettempdir()) / _BASE)

    @staticmethod
    def for_input(base: str | Path, input_path: str | Path, settings_fingerprint: str, shards: int) -> "DedupWork":
        """The work folder of this input (path, size, mtime), these settings and this shard count under `base`."""
        key = json.dumps([*_identity(input_path), settings_fingerprint, shards])
        name = hashlib.sha1(key.encode()).hexdigest()[:16]
        return DedupWork(f"{str(base).rstrip('/')}/{name}" if is_url(base) else Path(base) / name)

    @staticmethod
    def fresh(shard_dir: str, budget: int | None = None, transient: bool = False) -> "DedupWork":
        """A new, empty folder for one dedup in one process, its small arrays kept in memory up to `budget` bytes
        (default storage/dedup_memory.py `BUDGET`; 0: files only), and with `transient` (no Index step will read
        the records' sketches or vectors again) its transient arrays of any size (released by their one reader).
        Its files (the large arrays, and any beyond the budget) go under `dedup.shard_dir` when that is a local
        folder, else the system temporary folder; the folder is made on disk only for them. Folders that a killed
        process left there are removed first."""
        base = Path(shard_dir) if shard_dir and not is_url(shard_dir) else Path(tempfile.gettempdir()) / _BASE
        base.mkdir(parents=True, exist_ok=True)
        _remove_orphans(base)
        work = DedupWork(base / f"run-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        memory.open_store(str(work.root), budget, transient)
        return work

    def step(self, name: str) -> Path:
        """A step's marker folder (kind[-phase][/rNNN][/shard-NNNNN])."""
        return self.root / name

    def data(self, kind: str, name: str) -> Path:
        """A file (or a group of arrays' prefix) of a step kind: WORK/<kind>.<name>, all in WORK itself."""
        return self.root / f"{kind}.{name}"

    @staticmethod
    def kind_of(rel: str) -> str:
        """The step kind a path in the folder belongs to (a data file's or a marker's)."""
        return rel.split("/", 1)[0].split(".", 1)[0]

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
        """(path in the folder, bytes) of every file the folder holds (on the store when it is a URL; and the
        entries it keeps in memory)."""
        store = memory.store_at(self.root)
        return mirror.files(self.root) + (store.files() if store is not None else [])

    def remove(self) -> None:
        """The whole folder (and this machine's mirror of it, or its entries in memory)."""
        memory.close_store(str(self.root))
        mirror.remove(self.root)

    def mark_done(self, name: str, record: dict) -> dict:
        write_json(self.marker(name), record)
        return record

    # --- the records ---------------------------------------------------------------------------------------------

    def records(self, shard: int) -> Path:
        return self.data("records", f"shard-{shard:05d}")

    def save_records(self, shard: int, ids: list[str], texts: list[str], scores: np.ndarray | None) -> None:
        save_strings(self.records(shard), "ids", ids)
        save_strings(self.records(shard), "texts", texts)
        if scores is not None:
            save_array(member(self.records(shard), "scores"), scores)

    def record_texts(self, shard: int) -> list[str]:
        """Every text of shard `shard`, in record order."""
        return read_strings(self.records(shard), "texts", 0, strings_count(self.records(shard), "texts"))

    def record_strings(self, shard: int, name: str) -> "PackedStrings":
        """Shard `shard`'s "ids" or "texts", memory-mapped."""
        return PackedStrings(self.records(shard), name)

    def record_scores(self, shard: int) -> np.ndarray:
        return load_array(member(self.records(shard), "scores"))

    @property
    def history(self) -> Path:
        return self.data("history", "index")

    # --- per step -------------------------------------------------------------------------------------------------

    def prep(self, shard: int) -> Path:
        return self.data("prep", f"shard-{shard:05d}")

    def bucketed(self, shard: int | None) -> Path:
        """A record shard's exact keys, rows and texts sorted by exact bucket (None: the history's)."""
        base = self.history if shard is None else self.prep(shard)
        return base.with_name(f"{base.name}.bucketed")

    def bucket(self, bucket: int) -> Path:
        return self.data("exact", f"bucket-{bucket:05d}")

    def drop_sender(self, phase: str, sender: int) -> Path:
        """Where sender `sender` of a phase's drops wrote them: an exact bucket or a group shard."""
        return self.bucket(sender) if phase == "exact" else self.group(phase, sender)

    def shared(self, search: str) -> Path:
        """The shared arrays of a search ("minhash" or "embedding")."""
        return self.data(search, "shared")

    def part(self, step: str, part: int) -> Path:
        """Search part `part`'s result folder (step "bands" or "ann")."""
        return self.data(step, f"out-{part:05d}")

    def vectors(self, shard: int) -> Path:
        return self.data("embed", f"shard-{shard:05d}.vectors.npy")

    def uncertain(self, group: int) -> Path:
        return self.data("embedding-uncertain", f"shard-{group:05d}")

    @property
    def confirmed(self) -> Path:
        return self.data("confirm", "confirmed")

    def alive(self, phase: str, shard: int) -> Path:
        return self.data(phase, f"alive-{shard:05d}.npy")

    def drops(self, phase: str, shard: int) -> Path:
        return self.data(phase, f"drops-{shard:05d}.npy")

    def labels(self, phase: str, round_: int, node_range: int) -> Path:
        return self.data(f"{phase}-cc", f"r{round_:03d}.labels-{node_range:05d}.npy")

    def proposals(self, phase: str, round_: int, part: int) -> Path:
        return self.data(f"{phase}-cc", f"r{round_:03d}.proposals-{part:05d}")

    def routed(self, phase: str, part: int) -> Path:
        return self.data(f"{phase}-route", f"part-{part:05d}")

    def group(self, phase: str, group: int) -> Path:
        return self.data(f"{phase}-group", f"shard-{group:05d}")


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


def member(group: str | Path, name: str) -> Path:
    """The file of array `name` in a group of arrays: <group>.<name>.npy beside the group's name (a group is a
    name prefix, not a folder: a work folder keeps one folder per step kind, as folders cost far more than files
    to make and remove)."""
    group = Path(group)
    return group.with_name(f"{group.name}.{name}.npy")


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


_MADE: set[str] = set()   # folders this process made (a step writes many files into few folders)


def _parent_made(path: Path) -> None:
    if str(path.parent) not in _MADE:
        path.parent.mkdir(parents=True, exist_ok=True)
        if len(_MADE) > 10000:
            _MADE.clear()
        _MADE.add(str(path.parent))


def _written(path: Path, write, suffix: str = ".tmp") -> Path:
    """`write(tmp)` into a temporary file beside `path` (its folder made first), then renamed to `path`."""
    tmp = _tmp(path).with_suffix(suffix)
    _parent_made(path)
    try:
        write(tmp)
    except FileNotFoundError:   # the folder was removed since: a work folder of the same name, made again
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
    tmp.replace(path)
    mirror.publish(path)
    return path


def write_json(path: str | Path, obj) -> None:
    _written(Path(path), lambda tmp: tmp.write_text(json.dumps(obj, default=float)))


def read_json(path: str | Path):
    return json.loads(Path(mirror.local(path)).read_text())


def save_array(path: str | Path, a: np.ndarray, transient: bool = False) -> str:
    """`a` to the .npy file `path` (an in-memory folder may keep it instead; `transient`: only the next step reads
    it, and releases it: storage/dedup_memory.py)."""
    store = memory.store_of(path)
    if store is not None and store.put_array(str(path), a, transient):
        return str(path)
    return str(_written(Path(path), lambda tmp: np.save(tmp, np.ascontiguousarray(a), allow_pickle=False), ".npy"))


def load_array(path: str | Path, mmap: bool = True) -> np.ndarray:
    """A .npy file, memory-mapped read-only (or read whole); an in-memory folder's array (read-only, or a copy)."""
    kept = memory.entry(path)
    if kept is not None:
        return kept if mmap else kept.copy()
    local = mirror.local(path)
    with open(local, "rb") as fh:
        header = _npy_header(fh, path)
        if header is None:   # not written here: numpy reads it
            return np.load(local, mmap_mode="r" if mmap else None, allow_pickle=False)
        dtype, shape, offset = header
        size = int(np.prod(shape, dtype=np.int64))
        if not mmap or size == 0 or not shape:   # nothing to map (np.memmap maps at least one byte)
            fh.seek(offset)
            return np.fromfile(fh, dtype=dtype, count=size).reshape(shape)
    # a plain ndarray view of the map: slicing a np.memmap makes a memmap object per slice (~30 us each)
    return np.memmap(local, dtype=dtype, mode="r", offset=offset, shape=shape).view(np.ndarray)


_MAPPED: dict[tuple, np.ndarray] = {}


def mapped(path: str | Path) -> np.ndarray:
    """load_array, memory-mapped once per process and file version (path, inode, mtime): a worker that reads
    the same label files in every step of a round sets up each map once. Files here are written once (renamed
    into place), so a new version is a new inode."""
    kept = memory.entry(path)
    if kept is not None:
        return kept
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
    """folder/<name>.npy written in row blocks (a .npy header, then the blocks appended to a temporary file, renamed
    on close): an array concatenated from many shards' files without holding it."""

    def __init__(self, folder: str | Path, name: str, shape: tuple, dtype):
        self.path, self.shape, self.dtype = member(folder, name), tuple(shape), np.dtype(dtype)
        self.pos, self.kept = 0, None
        store = memory.store_of(self.path)
        size = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        if store is not None and store.reserve(size):   # an in-memory folder: the blocks copied into one array
            self.store, self.kept = store, np.empty(self.shape, self.dtype)
            return
        self.tmp = _tmp(self.path).with_suffix(".npy")
        _parent_made(self.path)
        try:
            self.fh = open(self.tmp, "wb")
        except FileNotFoundError:   # the folder was removed since (see _written)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.fh = open(self.tmp, "wb")
        np.lib.format.write_array_header_1_0(self.fh, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                       "fortran_order": False, "shape": self.shape})

    def append(self, block: np.ndarray) -> None:
        if self.kept is not None:
            self.kept[self.pos: self.pos + len(block)] = block
        else:
            np.ascontiguousarray(block, dtype=self.dtype).tofile(self.fh)
        self.pos += len(block)

    def close(self) -> str:
        assert self.pos == (self.shape[0] if self.shape else 1), (self.path, self.pos, self.shape)
        if self.kept is not None:
            self.kept.flags.writeable = False
            self.store.entries[str(self.path)] = self.kept
            return str(self.path)
        self.fh.close()
        self.tmp.replace(self.path)
        mirror.publish(self.path)
        return str(self.path)


def save_strings(folder: str | Path, name: str, strings: list[str]) -> None:
    """Strings packed as UTF-8 bytes (<name>.npy) and offsets (<name>_offsets.npy): any one of them can be read
    from the memory-mapped files without reading the rest. An in-memory folder keeps the strings themselves."""
    store = memory.store_of(member(folder, name))
    if store is not None and store.put_strings(str(member(folder, name)), strings):
        return
    enc = [x.encode("utf-8", "surrogatepass") for x in strings]
    off = np.zeros(len(enc) + 1, np.int64)
    np.cumsum([len(b) for b in enc], out=off[1:])
    save_array(member(folder, name), np.frombuffer(b"".join(enc), np.uint8))
    save_array(member(folder, f"{name}_offsets"), off)


def read_strings(folder: str | Path, name: str, a: int, b: int) -> list[str]:
    """Strings a:b of a save_strings pair, read without a memory map."""
    kept = memory.entry(member(folder, name))
    if kept is not None:
        return kept[a:b]
    off = read_rows(member(folder, f"{name}_offsets"), a, b + 1)
    if b <= a:
        return []
    data = read_rows(member(folder, name), int(off[0]), int(off[-1])).tobytes()
    rel = (off - off[0]).tolist()
    return [data[rel[i]: rel[i + 1]].decode("utf-8", "surrogatepass") for i in range(b - a)]


class PackedStrings:
    """The strings save_strings wrote, memory-mapped: `take(rows)` decodes only those."""

    def __init__(self, folder: str | Path, name: str):
        self.kept = memory.entry(member(folder, name))
        if self.kept is None:
            self.data = load_array(member(folder, name))
            self.off = load_array(member(folder, f"{name}_offsets"))

    def __len__(self) -> int:
        return len(self.kept) if self.kept is not None else len(self.off) - 1

    def take(self, rows) -> list[str]:
        rows = np.asarray(rows, np.int64)
        if not len(rows):
            return []
        if self.kept is not None:
            return [self.kept[i] for i in rows.tolist()]
        d, o = self.data, self.off
        starts, ends = np.asarray(o[rows]), np.asarray(o[rows + 1])
        lo, hi = int(starts.min()), int(ends.max())
        if hi - lo > 4 * int((ends - starts).sum()) + (1 << 20):   # a few rows far apart: each on its own
            return [bytes(d[a:b]).decode("utf-8", "surrogatepass") for a, b in zip(starts.tolist(), ends.tolist())]
        raw = bytes(d[lo:hi])   # one read of the span: no memory-map slice per row
        return [raw[a - lo: b - lo].decode("utf-8", "surrogatepass") for a, b in zip(starts.tolist(), ends.tolist())]


def save_grouped(folder: str | Path, arrays: dict[str, np.ndarray], dest: np.ndarray, receivers: int,
                 strings: dict[str, list[str]] | None = None) -> None:
    """One sender's rows for many receivers in one folder: `arrays` (same length; and `strings`, packed) sorted by
    `dest` (stable: a receiver gets its rows in the sender's order) and start.npy, receiver r's rows being
    start[r]:start[r + 1]."""
    order = np.argsort(dest, kind="stable")
    for k, a in arrays.items():
        save_array(member(folder, k), np.asarray(a)[order])
    for k, values in (strings or {}).items():
        save_strings(folder, k, [values[i] for i in order.tolist()])
    save_array(member(folder, "start"), np.searchsorted(dest[order], np.arange(receivers + 1)).astype(np.int64))


_HEADER = re.compile(r"'descr':\s*'([^']+)',\s*'fortran_order':\s*(True|False),\s*'shape':\s*\(([^)]*)\)")


def _npy_header(fh, path) -> tuple[np.dtype, tuple, int] | None:
    """(dtype, shape, where the data starts) of an open .npy file this module wrote, parsed with one regular
    expression (np.load parses it with ast.literal_eval: ~2 ms a file on a busy machine); None when it is not such
    a file (Fortran order)."""
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
        return None
    return np.dtype(m.group(1)), tuple(int(x) for x in m.group(3).split(",") if x.strip()), start + size


def strings_count(folder: str | Path, name: str) -> int:
    """How many strings a save_strings pair holds."""
    kept = memory.entry(member(folder, name))
    return len(kept) if kept is not None else len(read_rows(member(folder, f"{name}_offsets"))) - 1


def read_rows(path: str | Path, a: int = 0, b: int | None = None) -> np.ndarray:
    """Rows a:b (b None: to the end) of a .npy file this module wrote, read with one seek: a memory map costs
    ~0.25 ms of set-up, which a receiver slicing hundreds of senders' files pays hundreds of times. (An in-memory
    folder's array: a read-only slice.)"""
    kept = memory.entry(path)
    if kept is not None:
        return kept[a:b]
    with open(mirror.local(path), "rb") as fh:
        header = _npy_header(fh, path)
        if header is None:
            raise ValueError(f"{path}: unsupported .npy header")
        dtype, shape, offset = header
        n = shape[0] if shape else 1
        b = n if b is None else min(b, n)
        row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        fh.seek(offset + a * row * dtype.itemsize)
        out = np.fromfile(fh, dtype=dtype, count=max(b - a, 0) * row)
    return out.reshape((max(b - a, 0),) + tuple(shape[1:]))


def load_grouped(folder: str | Path, receiver: int, names: tuple[str, ...],
                 strings: tuple[str, ...] = ()) -> dict[str, np.ndarray | list[str]]:
    """Receiver `receiver`'s rows of a save_grouped folder (only those bytes are read)."""
    start = read_rows(member(folder, "start"), receiver, receiver + 2)
    a, b = int(start[0]), int(start[1])
    out: dict = {k: read_rows(member(folder, k), a, b) for k in names}
    out.update({k: read_strings(folder, k, a, b) for k in strings})
    return out


def save_arrays(folder: str | Path, arrays: dict[str, np.ndarray], transient: bool = False) -> dict[str, str]:
    """Each array to folder/<name>.npy; their paths by name."""
    return {name: save_array(member(folder, name), a, transient) for name, a in arrays.items()}


def release(*paths: str | Path) -> None:
    """The one reader of these transient arrays is done with them: an in-memory folder drops them (files stay: a
    resumed flow may run that reader again)."""
    for p in paths:
        memory.release(p)


def load_arrays(paths: dict[str, str]) -> dict[str, np.ndarray]:
    """The arrays at `paths`, memory-mapped read-only."""
    return {name: load_array(p) for name, p in paths.items()}


def load_named(folder: str | Path, *names: str) -> dict[str, np.ndarray]:
    """The arrays save_arrays wrote to `folder` under these names, memory-mapped read-only."""
    return {name: load_array(member(folder, name)) for name in names}
