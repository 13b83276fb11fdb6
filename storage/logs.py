"""Append-only logs (the call journal, the cost ledger, proxy records): one O_APPEND file locally, a prefix of
small objects on an object store (which cannot append).

- local: one file opened O_APPEND; each entry is one `write`, durable at once; a kill leaves at most a torn
  last line, which readers skip.
- remote: `NAME.d/` holds objects of one or more entries each, each published whole; entries are flushed
  within `flush_seconds` (a timer) and on close; `flush_seconds=0` writes one object per entry. A refused
  PUT keeps its entries under the same object name, is retried, and raises `LogFlushError` to the writer
  (from the next write, flush or close) until they are delivered: entries are never dropped.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Iterator

import orjson

from evolforge.storage.fs import AnyPath, fs_path, is_remote, list_files, open_output


def json_bytes(obj: Any) -> bytes:
    """UTF-8 JSON of one entry (orjson; what it refuses, an int over 64 bits or a NaN, goes through the
    standard library, non-JSON values as their str)."""
    try:
        return orjson.dumps(obj, default=str)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(obj, ensure_ascii=False, default=str).encode()


def json_loads(raw: bytes | str) -> Any:
    """JSON as the standard library reads it (NaN and Infinity included), at orjson's speed where it can;
    ValueError where the standard library raises it too (a torn line, junk)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def json_line(obj: Any) -> bytes:
    """One jsonl line (no newline inside: JSON escapes them)."""
    return json_bytes(obj) + b"\n"


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
            self._fd = open_output(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # never through a link

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
            fs, p = fs_path(path)
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
        fs, path = fs_path(folder)
        fs.invalidate_cache()
        names = {PurePosixPath(f).parent.name[:-2] for f in fs.glob(f"{path.rstrip('/')}/{pattern}.d/*.jsonl")}
        return [folder / n for n in sorted(names)]
    return list_files(folder, pattern)


