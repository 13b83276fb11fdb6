"""Files of a recording-proxy folder (PROXY_OUT) and their readers.

    PROXY_OUT/
      records/*.jsonl          one line per proxied call (one file per proxy process; append-only, like the ledger)
      events/*.jsonl           session events: finish markers and rewards POSTed by agents or graders
      ledger/*.jsonl           cost ledger: one row per proxied call (stage `proxy`, task_id = session)
      proxy.json               what the proxy serves: upstream, bind address, start time (never a key)
      sessions.sqlite          with proxy.workers > 1 only: each session's parent, shared by the worker processes

A record (see tasks/proxy/recording.py for how it is built):
    {"record_id", "session", "parent_session", "role", "route", "method", "path", "stream", "status",
     "error", "model", "ts", "latency_s", "ttft_s", "request": {messages | prompt, tools, parameters},
     "response": {"content", "reasoning_content", "tool_calls", "finish_reason", "usage", "logprobs",
                  "token_ids", "prompt_token_ids", "model", "id"}}
`route` says which API: "chat.completions", "completions", "responses" (request: input, instructions, tools,
tool_choice, previous_response_id, parameters; response also `output`, the items as sent, and `usage` of
input_tokens / output_tokens) or "messages" (request: system, messages, tools, tool_choice, parameters; response
also `content_blocks` as sent, `usage` of input_tokens / output_tokens / cache_*); `tool_calls` is in the chat
form for all three (tasks/proxy/wires.py). Any other route is passed through with `request` and `response` null.
Every call under /v1 has one record and one ledger row, refused ones too: `status` is what the client got, `error`
says why it failed (null for a success); calls refused at the door (foreign Host, a browser's Origin, no token) are
under the session "(refused)", bad session names under "invalid". Request headers are never recorded; keys never
reach these files, nor credentials of the upstream URL (proxy.json holds it with its userinfo masked). Every line is
JSON whatever a call carried: text the UTF-8 writer refuses (a lone surrogate) is written as an ASCII escape, as
JSON allows, and reads back as it came.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import Iterator

from evolforge.storage.fs import AnyPath
from evolforge.storage.layout import OutputFolder
from evolforge.storage.logs import AppendLog, json_line, list_logs, read_log_lines


@dataclass(frozen=True, init=False)
class ProxyLayout(OutputFolder):
    records_dir = property(lambda self: self.root / "records")
    events_dir = property(lambda self: self.root / "events")
    ledger_dir = property(lambda self: self.root / "ledger")
    info = property(lambda self: self.root / "proxy.json")
    sessions_db = property(lambda self: self.root / "sessions.sqlite")


class SessionParents:
    """Each session's parent, shared by the proxy's worker processes (SQLite, one short transaction the first
    time a worker sees a session; workers keep what they learnt: a session never changes parent).

    `claim(session, parent)` -> ("known", its parent) when some worker registered the session first,
    ("new", parent) when this call registers it, ("cycle", None) when the parent descends from the session."""

    def __init__(self, path: AnyPath):
        import sqlite3

        self.path = str(path)
        self._db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS parents (session TEXT PRIMARY KEY, parent TEXT)")

    def claim(self, session: str, parent: str | None) -> tuple[str, str | None]:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT parent FROM parents WHERE session = ?", (session,)).fetchone()
            if row is not None:
                return "known", row[0]
            p, steps = parent, 0
            while p is not None and steps < 100_000:  # a cycle would make the tree a loop
                if p == session:
                    return "cycle", None
                steps += 1
                row = db.execute("SELECT parent FROM parents WHERE session = ?", (p,)).fetchone()
                p = row[0] if row else None
            db.execute("INSERT INTO parents (session, parent) VALUES (?, ?)", (session, parent))
            return "new", parent
        finally:
            db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()


def _writer_name() -> str:
    return f"{os.getpid()}.{uuid.uuid4().hex[:8]}.jsonl"


class RecordLog:
    """This process's records and session events: two append logs (thread-safe writes, one line each)."""

    def __init__(self, layout: ProxyLayout, flush_seconds: float = 1.0):
        name = _writer_name()
        self.records = AppendLog(layout.records_dir / name, flush_seconds)
        self.events = AppendLog(layout.events_dir / name, flush_seconds)

    def record(self, rec: dict) -> None:
        self.records.write(_line(rec))

    def event(self, ev: dict) -> None:
        self.events.write(_line(ev))

    def flush(self) -> None:
        self.records.flush()
        self.events.flush()

    def close(self) -> None:
        self.records.close()
        self.events.close()


def _line(obj: dict) -> bytes:
    try:
        return json_line(obj)
    except UnicodeEncodeError:  # a lone surrogate: ASCII JSON escapes it
        return json.dumps(obj, ensure_ascii=True, default=str).encode() + b"\n"


def _read(folder: AnyPath) -> Iterator[dict]:
    for raw in read_log_lines(list_logs(folder)):
        try:
            yield json.loads(raw)
        except ValueError:  # a torn last line of a killed proxy
            continue


def iter_records(layout: ProxyLayout) -> Iterator[dict]:
    """Every recorded call, file by file (streamed: memory does not grow with the folder)."""
    yield from _read(layout.records_dir)


def iter_events(layout: ProxyLayout) -> Iterator[dict]:
    yield from _read(layout.events_dir)
