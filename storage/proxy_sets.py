"""Files of a recording-proxy folder (PROXY_OUT) and their readers.

    PROXY_OUT/
      records/*.jsonl          one line per proxied call (one file per proxy process; append-only, like the ledger)
      events/*.jsonl           session events: finish markers and rewards POSTed by agents or graders
      ledger/*.jsonl           cost ledger: one row per proxied call (stage `proxy`, task_id = session)
      proxy.json               what the proxy serves: upstream, bind address, start time (never a key)

A record (see tasks/proxy/recording.py for how it is built):
    {"record_id", "session", "parent_session", "role", "route", "method", "path", "stream", "status",
     "error", "model", "ts", "latency_s", "ttft_s", "request": {messages | prompt, tools, parameters},
     "response": {"content", "tool_calls", "finish_reason", "usage", "logprobs", "token_ids",
                  "prompt_token_ids", "raw"}}
Request headers are never recorded; keys never reach these files.
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


def _writer_name() -> str:
    return f"{os.getpid()}.{uuid.uuid4().hex[:8]}.jsonl"


class RecordLog:
    """This process's records and session events: two append logs (thread-safe writes, one line each)."""

    def __init__(self, layout: ProxyLayout, flush_seconds: float = 1.0):
        name = _writer_name()
        self.records = AppendLog(layout.records_dir / name, flush_seconds)
        self.events = AppendLog(layout.events_dir / name, flush_seconds)

    def record(self, rec: dict) -> None:
        self.records.write(json_line(rec))

    def event(self, ev: dict) -> None:
        self.events.write(json_line(ev))

    def flush(self) -> None:
        self.records.flush()
        self.events.flush()

    def close(self) -> None:
        self.records.close()
        self.events.close()


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
