"""Append-only jsonl journal of completed model calls inside a running batch.

Every finished call is appended as one line (one `write` on an O_APPEND file,
so a SIGKILL leaves at most a torn last line, which is ignored on load). When a
killed batch runs again, calls whose key is in the journal are replayed from it
instead of being sent again: a resumed run repeats at most the calls that were
in flight when it died. The journal holds responses only, never request
headers or keys.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path


class CallJournal:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._entries: dict[str, dict] = {}
        self.torn_lines = 0
        if self.path.exists():
            with open(self.path, "rb") as fh:
                for raw in fh:
                    try:
                        entry = json.loads(raw)
                        self._entries[entry["key"]] = entry["value"]
                    except (ValueError, KeyError, TypeError):
                        self.torn_lines += 1
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if self.torn_lines:
            # make sure the next entry starts on its own line after a torn tail
            os.write(self._fd, b"\n")

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> dict | None:
        return self._entries.get(key)

    def put(self, key: str, value: dict) -> None:
        line = (json.dumps({"key": key, "value": value}, ensure_ascii=False) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            self._entries[key] = value

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> "CallJournal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
