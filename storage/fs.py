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

Two rules for every local write (files, logs, locks, folders, renames, deletions):
- it never follows a symbolic link below the output root (`folder_fd`, `open_output`): a link planted in an
  output folder cannot make a run write, append, create, move or delete outside it (`UnsafeOutputPath` names
  the path and the link). The root itself is resolved once, when the folder is opened (`location` resolves
  local paths), so OUT may be a link or lie under one; third-party writers (trainers) get an emptied folder
  reached the same way (`fresh_dir`, `atomic_dir`);
- files are created 0666 and folders 0777 less the process's umask, as `open` and `mkdir` do: outputs are
  as readable as the operator's umask makes them (no output holds a secret; `permissions` sets a mode
  explicitly).

Nothing outside `storage/` calls this module's helpers on output paths except
through the storage modules.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
import uuid
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Iterable, Iterator, Union

if TYPE_CHECKING:  # pyarrow and universal-pathlib load where used: the CLI's --help path loads neither
    import pyarrow as pa
    import pyarrow.parquet as pq
    from upath import UPath

AnyPath = Union[Path, "UPath"]


def _upath_class(load: bool = False):
    """universal-pathlib's UPath, or None when it is not installed. Without `load`, None while upath is not
    imported yet: no UPath object can exist then, so an isinstance check needs no import."""
    if not load and "upath" not in sys.modules:
        return None
    try:
        from upath import UPath
    except ImportError:  # pragma: no cover - a dependency of evolforge
        return None
    return UPath
LOCAL_PROTOCOLS = ("", "file", "local")
# Local output files and folders are created with these modes less the process's umask (as `open` and `mkdir`
# do): datasets, plots and cards are as readable as the operator's umask makes them. None of them holds a
# secret; a writer that needs a stricter mode passes `permissions`.
OUTPUT_FILE_MODE = 0o666
OUTPUT_DIR_MODE = 0o777


class UnsafeOutputPath(ValueError):
    """A write inside an output folder would follow a symbolic link, so it could land outside the folder."""


class StorageURLError(ValueError):
    """A location URL that cannot be opened (unknown protocol, missing package)."""


def is_url(location: str | os.PathLike) -> bool:
    s = str(location)
    return "://" in s and not s.startswith("file://")


def location(loc: str | os.PathLike) -> AnyPath:
    """A local `Path` (absolute) for a path or file:// URL, else a `UPath` for the URL."""
    if isinstance(loc, Path) and not is_remote(loc):
        return Path(loc).expanduser().resolve()
    UPath = _upath_class()
    if UPath is not None and isinstance(loc, UPath):
        return loc
    s = os.fspath(loc)
    if s.startswith("file://"):
        s = s[len("file://"):]
    if not is_url(s):
        return Path(s).expanduser().resolve()
    UPath = _upath_class(load=True)
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
    UPath = _upath_class()
    return UPath is not None and isinstance(p, UPath) and getattr(p, "protocol", "") not in LOCAL_PROTOCOLS


def fs_path(p: AnyPath) -> tuple:
    return p.fs, p.path


# ---------------------------------------------------------------- local writes never follow a symbolic link
#
# Every local write (a file, an append-only log, a lock, a folder, a rename, a deletion) reaches its folder from
# `/` one component at a time with O_NOFOLLOW (`folder_fd`), and opens or creates its last component relative to
# that descriptor with O_NOFOLLOW too: a symbolic link anywhere on the way is refused with `UnsafeOutputPath`
# naming the path and the link, never followed. So a link planted inside an output folder (a journal file, the
# `dataset` folder) cannot make a run write outside it, and a link swapped in during the walk is no better.
# Output roots are resolved once, when the folder is opened (`location` resolves a local path, so OUT may itself
# be a link, or lie under one); everything beneath the resolved root must be real folders and files. An atomic
# write replaces a link planted at its own name (rename does not follow it); an append or a lock refuses it.

_DIR_OPEN = os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW | getattr(os, "O_PATH", os.O_RDONLY)


def _refuse(path: str | os.PathLike, link: str | os.PathLike) -> UnsafeOutputPath:
    return UnsafeOutputPath(f"refusing to write {path}: {link} is a symbolic link (evolforge never follows a link "
                            "inside an output folder; make the output folder itself the link, or replace the link "
                            "with a real folder)")


def folder_fd(folder: str | os.PathLike, create: bool = True, writing: str | os.PathLike | None = None) -> int:
    """A descriptor of the local `folder`, reached from `/` (or the working directory, for a relative path)
    without following a symbolic link; missing folders are created (OUTPUT_DIR_MODE less the umask) when
    `create`, else FileNotFoundError. `UnsafeOutputPath` (naming `writing`, default `folder`) when a component
    is a link. The caller closes the descriptor."""
    folder = os.path.normpath(os.fspath(folder))
    absolute = folder.startswith("/")
    parts = [p for p in folder.split("/") if p and p != "."]
    fd = os.open("/" if absolute else ".", _DIR_OPEN)
    walked = "/" if absolute else ""
    try:
        for part in parts:
            walked = os.path.join(walked, part)
            try:
                nxt = os.open(part, _DIR_OPEN, dir_fd=fd)
            except FileNotFoundError:
                if not create or part == "..":
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, OUTPUT_DIR_MODE, dir_fd=fd)
                nxt = _open_component(part, fd, walked, writing or folder)
            except OSError:
                nxt = _open_component(part, fd, walked, writing or folder)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_component(part: str, fd: int, walked: str, writing: str | os.PathLike) -> int:
    """Open one folder component again after a failure, telling a link (refused) from other errors."""
    try:
        return os.open(part, _DIR_OPEN, dir_fd=fd)
    except OSError:
        try:
            is_link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            is_link = False
        if is_link:
            raise _refuse(writing, walked) from None
        raise


def open_output(path: str | os.PathLike, flags: int, mode: int = OUTPUT_FILE_MODE) -> int:
    """os.open of a local output file without following a link, neither on the way nor at its name (`flags`
    gets O_NOFOLLOW and O_CLOEXEC; O_CREAT creates missing folders). The file descriptor; the caller closes it."""
    path = os.fspath(path)
    parent, name = os.path.split(os.path.normpath(path))
    dfd = folder_fd(parent or ".", create=bool(flags & os.O_CREAT), writing=path)
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    except OSError as e:
        if os.path.islink(path):
            raise _refuse(path, path) from None
        raise e
    finally:
        os.close(dfd)


def open_append(path: str | os.PathLike, mode: str = "ab") -> IO:
    """A local log file opened for appending (created 0666 less the umask, folders too), never through a link."""
    return os.fdopen(open_output(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), mode)


def fresh_dir(path: str | os.PathLike) -> Path:
    """An empty local folder at `path` for a writer that is not evolforge's own (a trainer saving a model): what
    was there (an earlier attempt's files, a planted link) is removed without following any link, and the folder
    is created anew, reached without following a link, so nothing inside it leads outside."""
    import shutil

    path = Path(path)
    dfd = folder_fd(path.parent, writing=path)
    try:
        try:
            st = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path.name, dir_fd=dfd)
        elif st is not None:
            os.unlink(path.name, dir_fd=dfd)
        os.mkdir(path.name, OUTPUT_DIR_MODE, dir_fd=dfd)
    finally:
        os.close(dfd)
    return path


def ensure_dir(p: AnyPath) -> AnyPath:
    """mkdir -p for local folders (never through a link: `folder_fd`); object stores have no folders (a no-op
    beyond the bucket)."""
    if is_remote(p):
        fs, path = fs_path(p)
        with contextlib.suppress(FileExistsError):
            fs.makedirs(path, exist_ok=True)
    else:
        os.close(folder_fd(p))
    return p


def replace(src: AnyPath, dst: AnyPath) -> None:
    """Rename `src` to `dst` (a file or a folder), replacing a file at `dst`; locally neither folder is reached
    through a link (the renamed entry itself may be one: the link moves, not its target)."""
    if is_remote(src):
        fs, s = fs_path(src)
        fs.mv(s, dst.path, recursive=fs.isdir(s))
        fs.invalidate_cache()
        return
    src_fd = folder_fd(Path(src).parent, create=False, writing=src)
    try:
        dst_fd = folder_fd(Path(dst).parent, create=False, writing=dst)
        try:
            os.replace(Path(src).name, Path(dst).name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def unlink(p: AnyPath) -> None:
    """Delete a file (nothing when it is missing); locally its folder is never reached through a link (a link at
    its name is deleted itself, not its target)."""
    if is_remote(p):
        fs, path = fs_path(p)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(path)
        fs.invalidate_cache()
        return
    try:
        dfd = folder_fd(Path(p).parent, create=False, writing=p)
    except FileNotFoundError:
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(Path(p).name, dir_fd=dfd)
    finally:
        os.close(dfd)


def remove_tree(p: AnyPath) -> None:
    """Delete a folder and everything in it (nothing when it is missing); a local link at its name is deleted
    itself, never followed."""
    if is_remote(p):
        fs, path = fs_path(p)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(path, recursive=True)
        fs.invalidate_cache()
        return
    path = Path(p)
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


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
    dfd = folder_fd(path.parent, writing=path)  # never through a link; missing folders created
    tmp = f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        # created 0666 less the umask (mkstemp would make every output private to its writer: 0600)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, OUTPUT_FILE_MODE,
                     dir_fd=dfd)
        try:
            with os.fdopen(fd, mode, **({"encoding": encoding, "newline": ""} if text else {})) as fh:
                if permissions is not None:
                    os.fchmod(fh.fileno(), permissions)
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)  # a link at `path` is replaced, not followed
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)


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
    dfd = folder_fd(dest.parent, writing=dest)  # never through a link; missing folders created
    name = f".{dest.name}.{uuid.uuid4().hex[:12]}"
    try:
        os.mkdir(name, OUTPUT_DIR_MODE, dir_fd=dfd)  # 0777 less the umask (mkdtemp would make it private: 0700)
        try:
            yield dest.parent / name
            try:
                st = os.stat(dest.name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode):
                shutil.rmtree(dest.name, dir_fd=dfd)
            elif st is not None:  # a file or a link in the folder's place: removed itself, never followed
                os.unlink(dest.name, dir_fd=dfd)
            os.replace(name, dest.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(name, dir_fd=dfd)
    finally:
        os.close(dfd)


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
    """The table of one parquet file (or of a folder of them). A local file is read through its ParquetFile, not
    pyarrow's dataset layer, whose import alone costs a command ~0.4 s of CPU."""
    import pyarrow.parquet as pq

    p, fs = arrow_location(path)
    if fs is not None or os.path.isdir(p):  # remote (a file or a folder): the dataset layer resolves it
        return pq.read_table(p, columns=columns, filesystem=fs)
    with pq.ParquetFile(p) as f:
        return f.read(columns=columns)


def parquet_file(path: AnyPath) -> pq.ParquetFile:
    import pyarrow.parquet as pq

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
    import pyarrow.parquet as pq

    with atomic_output(path, "wb") as fh:
        with pq.ParquetWriter(fh, schema, **kw) as writer:
            yield writer


# ---------------------------------------------------------------- whole folders (trained models)
def scratch_dir(kind: str, remote: AnyPath) -> Path:
    """A local folder standing in for a remote one (same remote URL: same folder)."""
    import hashlib

    key = hashlib.sha1(str(remote).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()).resolve() / "evolforge-cache" / kind / key  # resolved: written without links


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
