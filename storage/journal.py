"""Append-only jsonl journal of completed model calls inside a running batch.

Every finished call is appended as one line (one `write` on an O_APPEND file,
so a SIGKILL leaves at most a torn last line, which is ignored on load). When a
killed batch runs again, calls whose key is in the journal are replayed from it
instead of being sent again: a resumed run repeats at most the calls that were
in flight when it died. On a remote output folder the journal is a prefix with
one object per flush (see storage/logs.py, AppendLog). The journal holds responses only, never request
headers or keys.

A remote journal whose entries the store refuses keeps them and raises `LogFlushError` (from `put` after a
failed background flush, from `close` while entries stay undelivered), so the batch fails and is retried;
a journal opened again on the same path in the same process (the retried batch) adopts the entries its
predecessor could not deliver, so their calls are replayed, not sent again.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading

from evolforge.storage.fs import AnyPath
from evolforge.storage.logs import AppendLog, read_log_lines


class CallJournal:
    def __init__(self, path: AnyPath, flush_seconds: float = 1.0):
        """`flush_seconds`: how late entries may reach a remote store (see storage/logs.py AppendLog)."""
        self.path = path
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        self.torn_lines = 0
        self._log = AppendLog(path, flush_seconds)  # first: it adopts entries an earlier writer could not deliver
        try:
            for raw in itertools.chain(read_log_lines([path]), self._log.pending_lines()):
                try:
                    entry = json.loads(raw)
                    self._entries[entry["key"]] = entry["value"]
                except (ValueError, KeyError, TypeError):
                    self.torn_lines += 1
        except BaseException:
            with contextlib.suppress(Exception):  # adopted entries go back where the next writer finds them
                self._log.close()
            raise
        if self.torn_lines:
            # make sure the next entry starts on its own line after a torn tail
            self._log.write(b"\n")

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> dict | None:
        return self._entries.get(key)

    def put(self, key: str, value: dict) -> None:
        line = (json.dumps({"key": key, "value": value}, ensure_ascii=False) + "\n").encode()
        self._log.write(line)  # durable before the call counts as finished
        with self._lock:
            self._entries[key] = value

    def close(self) -> None:
        with self._lock:
            self._log.close()

    def __enter__(self) -> "CallJournal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
