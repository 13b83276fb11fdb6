"""Inter-process locks for shared state on local folders and fsspec stores: the dedup index (`lock_file`) and
the one writer of an output folder (`run_lock`, OUT/.evolforge.lock: see its docstring).

Local: `fcntl.flock` on a lock file (released by the OS when the holder dies). fsspec URL: an object created
exclusively (`open(path, "xb")`, a conditional PUT on S3) holding host, pid and time; a lock older than
`stale_seconds` is broken by the next waiter (there is no heartbeat). A waiter gives up after `timeout` with
an error naming the holder.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from pathlib import Path
from typing import Iterator

from evolforge.storage.fs import AnyPath, ensure_dir, fs_path, is_remote, location, open_output, read_bytes


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

    fd = open_output(path, os.O_RDWR | os.O_CREAT)  # never through a link; missing folders created
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
    fs, p = fs_path(path)
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


# ----------------------------------------------------------------- one writer per output folder

RUN_LOCK = ".evolforge.lock"  # in the output folder: who runs over it now (empty when nobody does)
HEARTBEAT_SECONDS = 10.0  # a remote run lock's holder rewrites its record this often
STALE_SECONDS = 60.0  # a remote run lock whose heartbeat is older than this is stale (its holder died)


class FolderLocked(RuntimeError):
    """Another run writes to the output folder now (a user error: one line naming the holder, exit status 2)."""


_HELD: dict[str, list] = {}  # folder -> [depth, record, created]: run locks this process holds (re-entrant)
_HELD_LOCK = threading.Lock()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def holder_is_dead(holder: dict | None, stale_seconds: float = STALE_SECONDS, now: float | None = None) -> bool:
    """A run lock's holder is gone: a process of this host that no longer exists, or (any host) a heartbeat
    older than `stale_seconds`."""
    import socket
    import time

    if not holder:
        return False
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        if not pid_alive(holder["pid"]):
            return True
    beat = holder.get("beat", holder.get("time"))
    try:
        return ((now or time.time()) - float(beat)) > stale_seconds
    except (TypeError, ValueError):
        return False


def describe_run_holder(holder: dict | None) -> str:
    if not holder:
        return "another run (its lock record is unreadable)"
    cmd = f": {holder['cmd']}" if holder.get("cmd") else ""
    return f"host {holder.get('host', '?')} pid {holder.get('pid', '?')}, started {holder.get('since', '?')}{cmd}"


def held_run_lock(root: AnyPath) -> dict | None:
    """The record of the run lock this process holds on `root`, else None."""
    with _HELD_LOCK:
        entry = _HELD.get(str(root))
    return entry[1] if entry else None


def run_lock_created_folder(root: AnyPath) -> bool:
    """This process's run lock on `root` created the folder (nothing else was there before it)."""
    with _HELD_LOCK:
        entry = _HELD.get(str(root))
    return bool(entry and entry[2])


@contextlib.contextmanager
def run_lock(root: AnyPath, wait: float = 0.0, flag: str = "--out", poll_seconds: float = 0.2,
             heartbeat_seconds: float = HEARTBEAT_SECONDS, stale_seconds: float = STALE_SECONDS) -> Iterator[dict]:
    """One writer per output folder: hold OUT/.evolforge.lock while the block runs; yields the holder record.

    Another run holding it: `FolderLocked` at once (one line naming the holder: host, pid, since when, its command),
    or after waiting `wait` seconds for it (float("inf"): as long as it takes). Re-entrant in a process: the CLI
    takes it before Prefect starts and the stage's flow takes it again (a no-op), so a flow started any other way
    (a deployment, the nightly chain, a retry) is covered too.

    - Local folder: `fcntl.flock` on the lock file; the OS releases it when the holder dies (never stale). The
      file holds the holder's record while held, nothing after.
    - fsspec URL: the lock is an object created exclusively (a conditional PUT on S3) holding the record, and a
      heartbeat rewrites its `beat` every `heartbeat_seconds`; it is stale when its holder is a process of this
      host that no longer exists, or its heartbeat is older than `stale_seconds`, and the next run breaks it.

    A lock that created the folder removes it again on release when nothing else was written into it (a run
    refused before any work leaves no folder)."""
    root = location(root)
    key = str(root)
    with _HELD_LOCK:
        entry = _HELD.get(key)
        if entry is not None:
            entry[0] += 1
    if entry is not None:
        try:
            yield entry[1]
        finally:
            with _HELD_LOCK:
                entry[0] -= 1
        return
    from evolforge.storage.fs import exists

    created = not exists(root)
    path = root / RUN_LOCK
    if is_remote(root):
        release, record = _run_lock_remote(path, wait, flag, poll_seconds, heartbeat_seconds, stale_seconds)
    else:
        release, record = _run_lock_local(Path(path), wait, flag, poll_seconds)
    with _HELD_LOCK:
        _HELD[key] = [1, record, created]
    try:
        yield record
    finally:
        with _HELD_LOCK:
            _HELD.pop(key, None)
        release()
        if created:
            _remove_if_only_lock(root)


def _remove_if_only_lock(root: AnyPath) -> None:
    from evolforge.storage.fs import fs_path as _fs_path

    with contextlib.suppress(Exception):
        if is_remote(root):
            fs, p = _fs_path(root)
            names = [str(n).rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(p, detail=False)]
            if set(names) <= {RUN_LOCK}:
                fs.rm(p, recursive=True)
            return
        local = Path(root)
        if local.is_dir() and {c.name for c in local.iterdir()} <= {RUN_LOCK}:
            with contextlib.suppress(FileNotFoundError):
                (local / RUN_LOCK).unlink()
            local.rmdir()


def _run_record() -> dict:
    import sys

    record = _lock_record()
    record["beat"] = record["time"]
    record["cmd"] = " ".join(["evolforge" if i == 0 else a for i, a in enumerate(sys.argv)])[:300]
    return record


def _refused(path: AnyPath, flag: str, holder: dict | None, waited: float) -> FolderLocked:
    how = f"waited {waited:g} s; " if waited else ""
    return FolderLocked(f"{path.parent} is in use by another run ({describe_run_holder(holder)}); {how}wait for "
                        f"it to finish (--wait waits for it) or choose another {flag} (lock: {path})")


def _run_lock_local(path: Path, wait: float, flag: str, poll: float):
    import fcntl
    import json
    import time

    fd = open_output(path, os.O_RDWR | os.O_CREAT)  # never through a link; missing folders created
    deadline = time.monotonic() + max(0.0, wait)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise _refused(path, flag, lock_holder(path), wait) from None
                time.sleep(poll)
        record = _run_record()
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
    except BaseException:
        os.close(fd)
        raise

    def release() -> None:
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    return release, record


def _run_lock_remote(path: AnyPath, wait: float, flag: str, poll: float, heartbeat: float, stale: float):
    import json
    import logging
    import threading
    import time

    log = logging.getLogger("evolforge.storage")
    fs, p = fs_path(path)
    ensure_dir(path.parent)
    deadline = time.monotonic() + max(0.0, wait)
    record = _run_record()
    while True:
        record["beat"] = time.time()
        try:
            with fs.open(p, "xb") as fh:
                fh.write(json.dumps(record).encode())
            fs.invalidate_cache()
            if (lock_holder(path) or {}).get("token") == record["token"]:
                break
            continue
        except FileExistsError:
            pass
        except (NotImplementedError, ValueError, TypeError) as e:
            raise OSError(f"cannot lock {path}: the {path.protocol}:// filesystem cannot create a file "
                          f"exclusively ({e})") from e
        holder = lock_holder(path)
        if holder is None:
            continue  # released between the two looks
        if holder_is_dead(holder, stale):
            if (lock_holder(path) or {}).get("token") == holder.get("token"):
                log.warning("breaking the stale run lock %s of %s", path, describe_run_holder(holder))
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(p)
                fs.invalidate_cache()
            continue
        if time.monotonic() >= deadline:
            raise _refused(path, flag, holder, wait)
        time.sleep(poll)

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat):
            with contextlib.suppress(Exception):
                current = lock_holder(path)
                if (current or {}).get("token") != record["token"]:
                    log.warning("the run lock %s was taken over by %s", path, describe_run_holder(current))
                    return
                record["beat"] = time.time()
                with fs.open(p, "wb") as fh:
                    fh.write(json.dumps(record).encode())
                fs.invalidate_cache()

    thread = threading.Thread(target=beat, name="evolforge-run-lock", daemon=True)
    thread.start()

    def release() -> None:
        stop.set()
        with contextlib.suppress(Exception):
            if (lock_holder(path) or {}).get("token") == record["token"]:
                fs.rm(p)
            fs.invalidate_cache()

    return release, record
