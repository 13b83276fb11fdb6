"""Inter-process locks for shared state on local folders and fsspec stores (the dedup index).

Local: `fcntl.flock` on a lock file (released by the OS when the holder dies). fsspec URL: an object created
exclusively (`open(path, "xb")`, a conditional PUT on S3) holding host, pid and time; a lock older than
`stale_seconds` is broken by the next waiter (there is no heartbeat). A waiter gives up after `timeout` with
an error naming the holder.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Iterator

from evolforge.storage.fs import AnyPath, ensure_dir, fs_path, is_remote, open_output, read_bytes


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
