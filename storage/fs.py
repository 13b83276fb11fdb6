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
- append-only logs (call journal, cost ledger, proxy records): storage/logs.py
  (one O_APPEND file locally, one object per flush on object stores; a hard
  kill of a remote run loses at most `storage.remote_log_flush_seconds` of
  journal entries, whose calls are sent again on resume);
- locks on shared state (the dedup index): storage/locks.py.

Nothing outside `storage/` calls this module's helpers on output paths except
through the storage modules.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
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
# Local output files and folders are created with these modes less the process's umask (as `open` and `mkdir`
# do): datasets, plots and cards are as readable as the operator's umask makes them. None of them holds a
# secret; a writer that needs a stricter mode passes `permissions`.
OUTPUT_FILE_MODE = 0o666
OUTPUT_DIR_MODE = 0o777


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


def fs_path(p: AnyPath) -> tuple:
    return p.fs, p.path


def ensure_dir(p: AnyPath) -> AnyPath:
    """mkdir -p for local folders; object stores have no folders (a no-op beyond the bucket)."""
    if is_remote(p):
        fs, path = fs_path(p)
        with contextlib.suppress(FileExistsError):
            fs.makedirs(path, exist_ok=True)
    else:
        p.mkdir(parents=True, exist_ok=True)
    return p


def replace(src: AnyPath, dst: AnyPath) -> None:
    """Rename `src` to `dst` (a file or a folder), replacing a file at `dst`."""
    if is_remote(src):
        fs, s = fs_path(src)
        fs.mv(s, dst.path, recursive=fs.isdir(s))
        fs.invalidate_cache()
    else:
        os.replace(src, dst)


def unlink(p: AnyPath) -> None:
    if is_remote(p):
        fs, path = fs_path(p)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(path)
        fs.invalidate_cache()
    else:
        Path(p).unlink(missing_ok=True)


def exists(p: AnyPath) -> bool:
    if is_remote(p):
        fs, path = fs_path(p)
        fs.invalidate_cache(path)
        return fs.exists(path)
    return p.exists()


def list_files(folder: AnyPath, pattern: str) -> list[AnyPath]:
    """Files in `folder` matching the glob `pattern` (one level), sorted by name."""
    if is_remote(folder):
        fs, path = fs_path(folder)
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
    `.NAME.*.tmp`, which is never read). A local file gets OUTPUT_FILE_MODE less the umask, or exactly
    `permissions` (e.g. 0o755) when given.
    """
    text = "b" not in mode
    if is_remote(path):
        fs, dest = fs_path(path)
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
    tmp = str(path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    # created 0666 less the umask (mkstemp would make every output private to its writer: 0600)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, OUTPUT_FILE_MODE)
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
        fs, p = fs_path(path)
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
    tmp = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:12]}"
    os.mkdir(tmp, OUTPUT_DIR_MODE)  # 0777 less the umask (mkdtemp would make it private: 0700)
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
    fs, path = fs_path(src)
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
