"""Where checkpoints and outputs live: a local folder (default) or any fsspec URL.

Every output folder, dedup index, dataset folder and seed file may be a local
path or a URL that fsspec understands: `s3://bucket/prefix`, `gs://...`,
`az://...`, `memory://...` (tests), `file:///abs/path`. The protocol's package
must be installed (`pip install 'evolforge[s3]'` brings s3fs).

Credentials and connection options never go into evolforge's config (they
would end up in run.json and in Prefect parameters); they come from the
environment the way each filesystem reads them, e.g. for S3 or MinIO:

    AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_REGION=eu-west-1
    FSSPEC_S3='{"endpoint_url": "http://minio:9000"}'   # any s3fs option, as JSON
    FSSPEC_S3_ENDPOINT_URL=http://minio:9000            # or one option per variable

How the guarantees of a local folder carry over:
- atomic files: a local file is written to a temporary file in the same folder,
  fsynced and renamed into place; on a remote filesystem it is written to a
  temporary key and moved into place (an object store publishes an object only
  when its upload completes), so a reader never sees half a checkpoint;
- append-only logs (call journal, cost ledger): a local log is one O_APPEND
  file, durable line by line; object stores cannot append, so a remote log is
  a prefix `NAME.d/` of small objects, each holding the entries of one flush.
  Entries are flushed at most `flush_seconds` after they are written (a timer)
  and always on close (a batch that ends or fails); `flush_seconds=0` writes one
  object per entry. A hard kill of a remote run loses at most that window of
  journal entries, whose calls are sent again on resume
  (`storage.remote_log_flush_seconds`, 1 s by default).

Nothing outside `storage/` calls this module's helpers on output paths except
through the storage modules.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
import threading
import uuid
from pathlib import Path, PurePosixPath
from typing import IO, Iterable, Iterator, Union

import pyarrow as pa
import pyarrow.parquet as pq

try:  # universal-pathlib: pathlib's API over fsspec
    from upath import UPath
except ImportError:  # pragma: no cover - a dependency of evolforge
    UPath = None  # type: ignore[assignment,misc]

AnyPath = Union[Path, "UPath"]
LOCAL_PROTOCOLS = ("", "file", "local")


class StorageURLError(ValueError):
    """A location URL that cannot be opened (unknown protocol, missing package)."""


def is_url(location: str | os.PathLike) -> bool:
    s = str(location)
    return "://" in s and not s.startswith("file://")


def location(loc: str | os.PathLike) -> AnyPath:
    """A local `Path` (absolute) for a path or file:// URL, else a `UPath` for the URL."""
    if isinstance(loc, Path) and not is_remote(loc):
        return Path(loc).expanduser().resolve()
    if UPath is not None and isinstance(loc, UPath):
        return loc
    s = os.fspath(loc)
    if s.startswith("file://"):
        s = s[len("file://"):]
    if not is_url(s):
        return Path(s).expanduser().resolve()
    if UPath is None:
        raise StorageURLError(f"{s}: URLs need the package universal-pathlib (pip install universal-pathlib)")
    try:
        p = UPath(s)
        p.fs  # noqa: B018 - instantiate now: a missing package or bad option fails here, clearly
    except (ImportError, ValueError) as e:
        proto = s.split("://", 1)[0]
        raise StorageURLError(f"cannot open {s}: {e} (the {proto}:// filesystem needs its fsspec package, "
                              f"e.g. s3fs for s3://, gcsfs for gs://, adlfs for az://)") from e
    return p


def is_remote(p: AnyPath) -> bool:
    return UPath is not None and isinstance(p, UPath) and getattr(p, "protocol", "") not in LOCAL_PROTOCOLS


def _fs_path(p: AnyPath) -> tuple:
    return p.fs, p.path


def ensure_dir(p: AnyPath) -> AnyPath:
    """mkdir -p for local folders; object stores have no folders (a no-op beyond the bucket)."""
    if is_remote(p):
        fs, path = _fs_path(p)
        with contextlib.suppress(FileExistsError):
            fs.makedirs(path, exist_ok=True)
    else:
        p.mkdir(parents=True, exist_ok=True)
    return p


def replace(src: AnyPath, dst: AnyPath) -> None:
    """Rename `src` to `dst` (a file or a folder), replacing a file at `dst`."""
    if is_remote(src):
        fs, s = _fs_path(src)
        fs.mv(s, dst.path, recursive=fs.isdir(s))
        fs.invalidate_cache()
    else:
        os.replace(src, dst)


def unlink(p: AnyPath) -> None:
    if is_remote(p):
        fs, path = _fs_path(p)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(path)
        fs.invalidate_cache()
    else:
        Path(p).unlink(missing_ok=True)


def exists(p: AnyPath) -> bool:
    if is_remote(p):
        fs, path = _fs_path(p)
        fs.invalidate_cache(path)
        return fs.exists(path)
    return p.exists()


def list_files(folder: AnyPath, pattern: str) -> list[AnyPath]:
    """Files in `folder` matching the glob `pattern` (one level), sorted by name."""
    if is_remote(folder):
        fs, path = _fs_path(folder)
        fs.invalidate_cache()
        found = fs.glob(f"{path.rstrip('/')}/{pattern}")
        return sorted((folder / PurePosixPath(f).name for f in found), key=lambda x: x.name)
    return sorted(folder.glob(pattern)) if folder.exists() else []


@contextlib.contextmanager
def atomic_output(path: AnyPath, mode: str = "wb", encoding: str | None = "utf-8",
                  permissions: int | None = None) -> Iterator[IO]:
    """Write `path` all-or-nothing: the file appears complete or not at all. The project's one atomic writer.

    An exception inside the block (disk full, read-only folder, a kill) leaves
    no file at `path` and no temporary file behind (a SIGKILL may leave a
    `.NAME.*.tmp`, which is never read). `permissions` (e.g. 0o755) applies to local files.
    """
    text = "b" not in mode
    if is_remote(path):
        fs, dest = _fs_path(path)
        tmp = f"{dest.rsplit('/', 1)[0]}/.{path.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with fs.open(tmp, "wb") as raw:
                if text:
                    import io

                    fh = io.TextIOWrapper(raw, encoding=encoding or "utf-8", newline="")
                    yield fh
                    fh.flush()
                    fh.detach()
                else:
                    yield raw
            fs.mv(tmp, dest)
            fs.invalidate_cache()
        except BaseException:
            with contextlib.suppress(Exception):
                fs.rm(tmp)
            raise
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({"encoding": encoding, "newline": ""} if text else {})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if permissions is not None:
            os.chmod(tmp, permissions)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(path: AnyPath, data: bytes) -> None:
    with atomic_output(path, "wb") as fh:
        fh.write(data)


def write_text_atomic(path: AnyPath, text: str, permissions: int | None = None) -> AnyPath:
    with atomic_output(path, "wb", permissions=permissions) as fh:
        fh.write(text.encode("utf-8"))
    return path


def write_json_atomic(path: AnyPath, data) -> AnyPath:
    """JSON (indented, anything else as str) written atomically; returns the path."""
    import json

    write_text_atomic(path, json.dumps(data, indent=2, default=str))
    return path


def read_bytes(path: AnyPath) -> bytes:
    if is_remote(path):
        fs, p = _fs_path(path)
        return fs.cat_file(p)
    return Path(path).read_bytes()


def read_json(path: AnyPath):
    """A JSON file's content, or None when the file does not exist."""
    import json

    return json.loads(read_text(path)) if exists(path) else None


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Fill a local folder all-or-nothing: yields an empty sibling scratch folder, which replaces `dest`
    when the block succeeds and is removed when it fails (remote folders: see `publish_dir`)."""
    import shutil

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_text(path: AnyPath) -> str:
    return read_bytes(path).decode("utf-8")


# ---------------------------------------------------------------- parquet
def arrow_location(path: AnyPath) -> tuple[str, "pa.fs.FileSystem | None"]:
    """(path, filesystem) for pyarrow: the local path and None, or the fsspec fs wrapped for arrow."""
    if is_remote(path):
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        return path.path, PyFileSystem(FSSpecHandler(path.fs))
    return str(path), None


def read_parquet(path: AnyPath, columns: list[str] | None = None) -> pa.Table:
    p, fs = arrow_location(path)
    return pq.read_table(p, columns=columns, filesystem=fs)


def parquet_file(path: AnyPath) -> pq.ParquetFile:
    p, fs = arrow_location(path)
    return pq.ParquetFile(p, filesystem=fs) if fs is not None else pq.ParquetFile(p)


def scan_parquet(paths: Iterable[AnyPath]):
    """A polars LazyFrame over parquet files (local or remote), read lazily and in batches."""
    import polars as pl

    paths = list(paths)
    if not paths:
        raise FileNotFoundError("no parquet files to scan")
    if not is_remote(paths[0]):
        return pl.scan_parquet([str(p) for p in paths])
    import pyarrow.dataset as ds

    _, fs = arrow_location(paths[0])
    return pl.scan_pyarrow_dataset(ds.dataset([p.path for p in paths], filesystem=fs, format="parquet"))


@contextlib.contextmanager
def parquet_writer(path: AnyPath, schema: pa.Schema, **kw) -> Iterator[pq.ParquetWriter]:
    """A streaming ParquetWriter whose file appears at `path` only once it is closed whole."""
    with atomic_output(path, "wb") as fh:
        with pq.ParquetWriter(fh, schema, **kw) as writer:
            yield writer


# ---------------------------------------------------------------- append-only logs
class LogFlushError(RuntimeError):
    """Entries of a remote log could not be written to the object store (after bounded retries).

    The entries are kept (and sent again, under the same object names, on the next flush), so nothing is
    lost; the error fails the batch that writes the log, which the orchestrator retries. Not an OSError
    and not fatal: a refused or failed PUT is transient as far as the run is concerned.
    """


class AppendLog:
    """An append-only log of lines (jsonl).

    Local: one file opened O_APPEND; each entry is one `write`, durable at once,
    and a kill leaves at most a torn last line. Remote: `PATH.d/` holds objects
    of one or more entries each (object stores cannot append), each published
    whole; entries are flushed within `flush_seconds` and on close.

    A remote flush whose PUT fails is retried (`put_attempts` attempts, backoff from
    `put_backoff_seconds`); when every attempt fails its entries are kept, in order and
    under the same object name (a PUT that landed although it reported a failure is then
    overwritten, never duplicated), and sent again by the next flush. The failure is never
    silent: `flush`/`close` raise `LogFlushError` while entries stay undelivered, and a
    failure of the background flush timer is raised by the next `write` (a later
    `flush`/`close` that delivers everything has lost nothing and does not raise).
    """

    put_attempts = 3
    put_backoff_seconds = 0.2
    # Entries of remote logs closed while the store refused them, by log URL: a log opened again on the same
    # URL in this process (its batch retried) adopts them, so they still arrive, under their own object names.
    _UNSENT: dict[str, list[tuple[str, list[bytes]]]] = {}
    _UNSENT_LOCK = threading.Lock()

    def __init__(self, path: AnyPath, flush_seconds: float = 1.0):
        self.path = path
        self.remote = is_remote(path)
        self._fd = -1
        if self.remote:
            self._dir = f"{path.path}.d"
            self._fs = path.fs
            self._prefix = f"{int.from_bytes(os.urandom(4), 'big'):08x}"
            self._seq = itertools.count(1)
            self.flush_seconds = flush_seconds
            self._buffer: list[bytes] = []
            self._lock = threading.Lock()         # the buffer, the timer and the pending error
            self._flush_lock = threading.Lock()   # one flush at a time (the timer, close, an explicit flush)
            self._timer: threading.Timer | None = None
            self._error: LogFlushError | None = None  # a background flush failure not yet raised to a caller
            with self._UNSENT_LOCK:  # entries an earlier writer of this log could not deliver (closed failing)
                self._unsent: list[tuple[str, list[bytes]]] = self._UNSENT.pop(str(path), [])
            self.objects_written = 0
            self.failed_puts = 0
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, line: bytes) -> None:
        """Append one entry (thread-safe). Raises `LogFlushError` when a background flush failed since the
        last call (the entry itself is kept)."""
        if not self.remote:
            os.write(self._fd, line)
            return
        if self.flush_seconds <= 0:
            with self._lock:
                self._buffer.append(line)
            self.flush()
            return
        with self._lock:
            self._buffer.append(line)
            if self._timer is None:
                self._timer = threading.Timer(self.flush_seconds, self._flush_in_background)
                self._timer.daemon = True
                self._timer.start()
            error, self._error = self._error, None
        if error is not None:
            raise error

    def pending_lines(self) -> list[bytes]:
        """Entries written but not (known to be) in the store yet, oldest first."""
        if not self.remote:
            return []
        with self._lock:
            return [e for _, entries in self._unsent for e in entries] + list(self._buffer)

    def flush(self) -> None:
        """Send every buffered or undelivered entry now; raises `LogFlushError` if some stay undelivered."""
        if not self.remote:
            return
        self._flush()

    def _flush_in_background(self) -> None:
        try:
            self._flush()
        except LogFlushError as e:  # kept for the next write (never lost with the timer thread)
            import logging

            logging.getLogger("evolforge.storage").warning("%s (raised by the next write)", e)
            with self._lock:
                self._error = e
        except Exception as e:  # noqa: BLE001 - anything else: the same, wrapped
            with self._lock:
                self._error = LogFlushError(f"log {self.path}: background flush failed ({type(e).__name__}: {e})")

    def _flush(self) -> None:
        with self._flush_lock:
            with self._lock:
                timer, self._timer = self._timer, None
                if self._buffer:  # the entries get their object name now, and keep it through every retry
                    self._unsent.append((self._object_name(), self._buffer))
                    self._buffer = []
                unsent = list(self._unsent)
            if timer is not None:
                timer.cancel()
            for name, entries in unsent:
                self._put_retrying(name, entries)  # stops at the first object that cannot be delivered
                with self._lock:
                    self._unsent.pop(0)
            with self._lock:  # everything delivered: an earlier background failure lost nothing
                self._error = None

    def _object_name(self) -> str:
        return f"{self._dir}/{self._prefix}-{next(self._seq):09d}.jsonl"

    def _put_retrying(self, name: str, entries: list[bytes]) -> None:
        import random
        import time

        data = b"".join(e if e.endswith(b"\n") else e + b"\n" for e in entries)
        for attempt in range(1, self.put_attempts + 1):
            try:
                self._fs.pipe_file(name, data)
                self.objects_written += 1
                return
            except Exception as e:  # noqa: BLE001 - retried, then raised as LogFlushError
                self.failed_puts += 1
                if attempt == self.put_attempts:
                    raise LogFlushError(
                        f"log {self.path}: {len(entries)} entries could not be written to the object store "
                        f"({self.put_attempts} attempts; last: {type(e).__name__}: {e}). They are kept and sent "
                        "again by the next flush; the batch fails so that it is retried."
                    ) from e
                delay = self.put_backoff_seconds * 2 ** (attempt - 1)
                time.sleep(random.uniform(delay / 2, delay))

    def close(self) -> None:
        if self.remote:
            try:
                self.flush()
            except LogFlushError:
                with self._flush_lock, self._lock, self._UNSENT_LOCK:  # adopted by this log's next writer here
                    if self._buffer:
                        self._unsent.append((self._object_name(), self._buffer))
                        self._buffer = []
                    self._UNSENT.setdefault(str(self.path), []).extend(self._unsent)
                    self._unsent = []
                raise
        elif self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_log_lines(paths: Iterable[AnyPath]) -> Iterator[bytes]:
    """Every line of the given logs (as written by AppendLog), log by log.

    An object that cannot be read is an error (never silently skipped); one deleted
    between listing and reading is skipped.
    """
    for path in paths:
        if is_remote(path):
            fs, p = _fs_path(path)
            fs.invalidate_cache()
            entries = sorted(fs.glob(f"{p}.d/*.jsonl"))
            if not entries:
                continue
            for name, data in sorted(fs.cat(entries, on_error="return").items()):
                if isinstance(data, FileNotFoundError):
                    continue
                if isinstance(data, BaseException):
                    raise OSError(f"cannot read log object {name} of {path}: {type(data).__name__}: {data}") from data
                yield from data.splitlines(keepends=True)
        elif Path(path).exists():
            with open(path, "rb") as fh:
                yield from fh


def list_logs(folder: AnyPath, pattern: str = "*.jsonl") -> list[AnyPath]:
    """The logs in `folder` (local files, or remote `NAME.d/` prefixes) matching `pattern`."""
    if is_remote(folder):
        fs, path = _fs_path(folder)
        fs.invalidate_cache()
        names = {PurePosixPath(f).parent.name[:-2] for f in fs.glob(f"{path.rstrip('/')}/{pattern}.d/*.jsonl")}
        return [folder / n for n in sorted(names)]
    return list_files(folder, pattern)


# ---------------------------------------------------------------- whole folders (trained models)
def scratch_dir(kind: str, remote: AnyPath) -> Path:
    """A local folder standing in for a remote one (same remote URL: same folder)."""
    import hashlib

    key = hashlib.sha1(str(remote).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "evolforge-cache" / kind / key


def publish_dir(local: Path, dest: AnyPath, last: str | None = None) -> AnyPath:
    """Copy a local folder to `dest` (local or remote); the file named `last` is copied after all others,
    so its presence means the folder is complete (a model's meta file)."""
    files = sorted(p for p in Path(local).rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == last)  # stable: `last` moves to the end
    for f in files:
        write_bytes_atomic(dest / f.relative_to(local).as_posix(), f.read_bytes())
    return dest


def local_copy(src: AnyPath, marker: str | None = None) -> Path:
    """A local folder with `src`'s files: `src` itself when local, else a cached download.

    The cache is reused while `marker` (e.g. a model's meta file) has the same bytes remotely.
    """
    if not is_remote(src):
        return Path(src)
    dest = scratch_dir("download", src)
    if marker and (dest / marker).exists() and exists(src / marker) and (dest / marker).read_bytes() == read_bytes(src / marker):
        return dest
    fs, path = _fs_path(src)
    fs.invalidate_cache()
    if not fs.exists(path):
        raise FileNotFoundError(f"{src} not found")
    root = path.rstrip("/")
    with atomic_dir(dest) as tmp:  # a download cut short never passes for a complete cache
        for f in fs.find(root):
            target = tmp / f[len(root):].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(fs.cat_file(f))
    return dest


# ---------------------------------------------------------------- inter-process locks
def lock_holder(path: AnyPath) -> dict | None:
    """Who holds the lock at `path` ({"host", "pid", "time", "since", "token"}), {} if unreadable, None if free."""
    import json

    try:
        raw = read_bytes(path)
    except (FileNotFoundError, IsADirectoryError):
        return None
    try:
        holder = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except ValueError:
        holder = {}
    return holder if isinstance(holder, dict) else {}


def describe_lock_holder(holder: dict | None) -> str:
    import time

    if not holder:
        return "an unknown holder" if holder is not None else "nobody (just released)"
    age = time.time() - float(holder.get("time", time.time()))
    return f"host {holder.get('host', '?')} pid {holder.get('pid', '?')} since {holder.get('since', '?')} ({age:.0f} s ago)"


@contextlib.contextmanager
def lock_file(path: AnyPath, timeout: float, stale_seconds: float = 3600.0, what: str | None = None,
              poll_seconds: float = 0.1) -> Iterator[dict]:
    """Hold an exclusive lock shared by every process and machine that reaches `path`; yields the holder record.

    Waits up to `timeout` seconds for another holder, then raises TimeoutError naming `what` and the
    holder (host, pid, since when). Not reentrant: a second `lock_file` on the same path in the same
    process waits like any other holder.

    - Local path: `fcntl.flock` on the file (created if missing, never deleted). The OS releases the lock
      when the holder dies, so a local lock is never stale. Works on a shared NFS folder (Linux emulates
      flock with NFS byte-range locks).
    - fsspec URL: the lock is an object created exclusively (`open(path, "xb")`: on S3 a conditional PUT
      with If-None-Match: *, on GCS a generation-match precondition, on memory:// an existence check),
      holding the holder record, and deleted on release. A holder that died leaves its object: a lock
      older than `stale_seconds` (measured from its creation, with the holder's clock) is taken to be
      stale and broken by the next process that waits for it, so `stale_seconds` must be longer than
      any holder keeps the lock. Exclusive creation is only as atomic as the filesystem makes it.
    """
    what = what or str(path)
    if is_remote(path):
        release, holder = _lock_remote(path, timeout, stale_seconds, what, poll_seconds)
    else:
        release, holder = _lock_local(Path(path), timeout, what, poll_seconds)
    try:
        yield holder
    finally:
        release()


def _lock_record() -> dict:
    import datetime as dt
    import socket
    import threading
    import time

    now = time.time()
    return {"host": socket.gethostname(), "pid": os.getpid(), "thread": threading.get_ident(), "time": now,
            "since": dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="seconds"),
            "token": uuid.uuid4().hex}


def _lock_timeout(what: str, path: AnyPath, timeout: float, holder: dict | None) -> TimeoutError:
    return TimeoutError(f"{what} is locked by {describe_lock_holder(holder)}; waited {timeout:g} s for it "
                        f"(lock: {path})")


def _lock_local(path: Path, timeout: float, what: str, poll: float):
    import fcntl
    import json
    import time

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + max(0.0, timeout)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise _lock_timeout(what, path, timeout, lock_holder(path)) from None
                time.sleep(poll)
        record = _lock_record()
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
    except BaseException:
        os.close(fd)
        raise

    def release() -> None:
        try:
            os.ftruncate(fd, 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    return release, record


def _lock_remote(path: AnyPath, timeout: float, stale_seconds: float, what: str, poll: float):
    import json
    import logging
    import time

    log = logging.getLogger("evolforge.storage")
    fs, p = _fs_path(path)
    ensure_dir(path.parent)
    deadline = time.monotonic() + max(0.0, timeout)
    record = _lock_record()
    data = json.dumps(record).encode()
    while True:
        try:
            with fs.open(p, "xb") as fh:
                fh.write(data)
            fs.invalidate_cache()
            if (lock_holder(path) or {}).get("token") == record["token"]:
                break  # ours (the read-back catches a store that let a concurrent create overwrite it)
            continue
        except FileExistsError:
            pass
        except (NotImplementedError, ValueError, TypeError) as e:
            raise OSError(f"{what}: cannot lock {path}: the {path.protocol}:// filesystem cannot create a file "
                          f"exclusively ({e})") from e
        holder = lock_holder(path)
        if holder and time.time() - float(holder.get("time", time.time())) > stale_seconds:
            if (lock_holder(path) or {}).get("token") == holder.get("token"):
                log.warning("%s: breaking a stale lock %s held by %s (older than %g s)", what, path,
                            describe_lock_holder(holder), stale_seconds)
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(p)
                fs.invalidate_cache()
            continue
        if time.monotonic() >= deadline:
            raise _lock_timeout(what, path, timeout, holder)
        time.sleep(poll)

    def release() -> None:
        current = lock_holder(path)
        if current is not None and current.get("token") == record["token"]:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(p)
            fs.invalidate_cache()
        else:
            log.warning("%s: the lock %s was taken over by %s while this process held it (stale timeout %g s "
                        "too short?)", what, path, describe_lock_holder(current), stale_seconds)

    return release, record
