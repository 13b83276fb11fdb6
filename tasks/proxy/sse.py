"""The proxy's event streams (SSE), read and written in one place for the three wire APIs (chat completions,
Responses, Messages), and the JSON every body and event is read and written with.

- `EventParser`: the one event-stream parser. Fed a stream's raw bytes chunk by chunk as they pass through, it
  cuts them into events (an event ends with a blank line: \\n\\n, \\r\\n\\r\\n or \\r\\r), joins each event's `data:`
  lines, and hands each data on: the chat API's `[DONE]` to `_done_marker`, a JSON object to `_object`; data that
  is not JSON, or JSON that is not an object, is counted malformed (`malformed`, `problem`: the first), as is an
  event that passes MAX_EVENT_BYTES without ending (dropped). It notes when the first bytes came (`ttft_s`) and
  whether an event is left unended (`pending`: a cut stream ends in the middle of one). The chat assembler
  (recording.py), the Responses and Messages assemblers (wires.py) and the translated chat stream (translate.py)
  are its subclasses.
- `frame(data, kind)`: one event's bytes (`event: KIND` when named, then `data: ...` and the blank line).
- `SSE_HEADERS`: the head of an event stream the proxy writes itself (translated streams).
- `loads`, `dumps`: JSON as the logs read and write it; `loads` raises ValueError for anything that is not JSON,
  nesting past the parser's depth too.
"""

from __future__ import annotations

import time
from typing import Any

from evolforge.storage.logs import json_bytes as dumps  # noqa: F401  (the proxy's JSON, as the logs write it)
from evolforge.storage.logs import json_loads as _json_loads

MAX_EVENT_BYTES = 8_000_000  # an SSE event that never ends is dropped once it passes this
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


def loads(raw: bytes | str) -> Any:
    """JSON as the logs read it; ValueError for anything that is not JSON, nesting past the parser's depth too."""
    try:
        return _json_loads(raw)
    except RecursionError as e:
        raise ValueError("JSON nested too deep") from e


def frame(data: bytes, kind: str | None = None) -> bytes:
    """One event: its name when it has one, its data, the blank line that ends it."""
    return (b"event: " + kind.encode() + b"\n" if kind else b"") + b"data: " + data + b"\n\n"


def event_end(buf: bytes) -> tuple[int, int] | None:
    """(end of the first complete SSE event, start of the next) or None: events end with a blank line."""
    best = None
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buf.find(sep)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, i + len(sep))
    return best


def event_data(raw: bytes) -> bytes:
    """An event's data: its `data:` lines joined (b"" when it has none)."""
    return b"\n".join(line[5:].lstrip() for line in raw.splitlines() if line.startswith(b"data:"))


class EventParser:
    """One event stream parsed as its bytes pass through: `feed(chunk)`; a subclass takes the events' JSON objects
    (`_object`) and the chat API's end marker (`_done_marker`)."""

    def __init__(self, started: float):
        self.started = started
        self.first_chunk_at: float | None = None
        self._buf = b""
        self.malformed = 0  # events that are not JSON, or not of the API's form
        self.problem: str | None = None  # the first of them

    @property
    def pending(self) -> bool:
        """Bytes of an event not ended yet (a cut stream ends in the middle of one)."""
        return bool(self._buf.strip())

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_chunk_at is None else round(self.first_chunk_at - self.started, 6)

    def feed(self, chunk: bytes) -> None:
        if self.first_chunk_at is None and chunk:
            self.first_chunk_at = time.perf_counter()
        self._buf += chunk
        while True:
            cut = event_end(self._buf)
            if cut is None:
                break
            event, self._buf = self._buf[:cut[0]], self._buf[cut[1]:]
            self._event(event)
        if len(self._buf) > MAX_EVENT_BYTES:
            self._buf = b""
            self._bad(f"an event of over {MAX_EVENT_BYTES} bytes")

    def _bad(self, why: str) -> None:
        self.malformed += 1
        self.problem = self.problem or why

    def _event(self, raw: bytes) -> None:
        data = event_data(raw)
        if not data:
            return
        if data.strip() == b"[DONE]":
            return self._done_marker()
        try:
            obj = loads(data)
        except ValueError:
            return self._bad("an event is not JSON")
        if not isinstance(obj, dict):
            return self._bad(f"an event is a JSON {type(obj).__name__}, not an object")
        self._object(obj, data)

    def _done_marker(self) -> None:
        """`data: [DONE]`: the end of a chat stream; the typed-event APIs end with an event of their own."""

    def _object(self, obj: dict, data: bytes) -> None:
        raise NotImplementedError
