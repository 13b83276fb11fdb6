"""What the proxy keeps of a call: the request's content and the response reassembled, never a header.

Pure functions over parsed bodies and raw SSE bytes; the app (tasks/proxy/app.py) calls them after the
response has gone to the client.

- `request_part(body)`: messages (chat) or prompt (completions), tools, and every other parameter.
- `response_part(body)`: content, tool calls, finish reason, usage, logprobs and, when the upstream returns
  them (vLLM's `return_token_ids`, SGLang, llama.cpp's `tokens`), token ids of the completion and the prompt.
- `StreamAssembler`: fed the raw bytes of a streamed (SSE) response chunk by chunk, it rebuilds the same
  response part: content and tool-call deltas concatenated per index, the finish reason, the final usage
  chunk, logprobs and token ids; it also notes when the first chunk came (time to first token).
"""

from __future__ import annotations

import time
from typing import Any

from evolforge.storage.logs import json_bytes as dumps  # noqa: F401  (the proxy's JSON, as the logs write it)
from evolforge.storage.logs import json_loads as loads

CONTENT_KEYS = ("messages", "prompt", "tools", "tool_choice", "functions")


def request_part(body: dict) -> dict:
    out: dict[str, Any] = {k: body[k] for k in CONTENT_KEYS if k in body}
    out["parameters"] = {k: v for k, v in body.items() if k not in CONTENT_KEYS}
    return out


def _token_ids(choice: dict) -> list[int] | None:
    for key in ("token_ids", "tokens"):
        ids = choice.get(key)
        if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
            return ids
    return None


def response_part(body: dict) -> dict:
    """The recorded part of a non-streamed chat or text completion (first choice; `n` > 1 keeps all in raw)."""
    choices = body.get("choices") or [{}]
    ch = choices[0] if isinstance(choices[0], dict) else {}
    msg = ch.get("message") or {}
    out = {
        "content": msg.get("content") if "message" in ch else ch.get("text"),
        "reasoning_content": msg.get("reasoning_content"),
        "tool_calls": msg.get("tool_calls"),
        "finish_reason": ch.get("finish_reason"),
        "usage": body.get("usage"),
        "logprobs": ch.get("logprobs"),
        "token_ids": _token_ids(ch),
        "prompt_token_ids": body.get("prompt_token_ids") or ch.get("prompt_token_ids"),
        "model": body.get("model"),
        "id": body.get("id"),
    }
    if len(choices) > 1:
        out["choices"] = choices
    return out


class StreamAssembler:
    """Rebuilds one response from the SSE bytes of a streamed completion, as they pass through."""

    def __init__(self, started: float):
        self.started = started
        self.first_chunk_at: float | None = None
        self._buf = b""
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict] = {}
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self.logprobs: list = []
        self.token_ids: list[int] = []
        self.prompt_token_ids: list[int] | None = None
        self.model: str | None = None
        self.id: str | None = None
        self.events = 0
        self.malformed = 0
        self.done = False

    def feed(self, chunk: bytes) -> None:
        if self.first_chunk_at is None and chunk:
            self.first_chunk_at = time.perf_counter()
        self._buf += chunk
        while True:
            cut = _event_end(self._buf)
            if cut is None:
                break
            event, self._buf = self._buf[:cut[0]], self._buf[cut[1]:]
            self._event(event)

    def _event(self, raw: bytes) -> None:
        data = b"\n".join(line[5:].lstrip() for line in raw.splitlines() if line.startswith(b"data:"))
        if not data:
            return
        if data.strip() == b"[DONE]":
            self.done = True
            return
        try:
            obj = loads(data)
        except ValueError:
            self.malformed += 1
            return
        self.events += 1
        self.model = self.model or obj.get("model")
        self.id = self.id or obj.get("id")
        if obj.get("usage"):
            self.usage = obj["usage"]
        if obj.get("prompt_token_ids"):
            self.prompt_token_ids = obj["prompt_token_ids"]
        for ch in obj.get("choices") or []:
            if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                continue
            delta = ch.get("delta") or {}
            text = delta.get("content") if "delta" in ch else ch.get("text")
            if text:
                self.content.append(text)
            if delta.get("reasoning_content"):
                self.reasoning.append(delta["reasoning_content"])
            for tc in delta.get("tool_calls") or []:
                self._tool_delta(tc)
            if ch.get("finish_reason"):
                self.finish_reason = ch["finish_reason"]
            lp = ch.get("logprobs")
            if isinstance(lp, dict) and isinstance(lp.get("content"), list):
                self.logprobs.extend(lp["content"])
            ids = _token_ids(ch)
            if ids:
                self.token_ids.extend(ids)
            if ch.get("prompt_token_ids"):
                self.prompt_token_ids = ch["prompt_token_ids"]

    def _tool_delta(self, tc: dict) -> None:
        slot = self.tool_calls.setdefault(int(tc.get("index", len(self.tool_calls))),
                                          {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
        if tc.get("id"):
            slot["id"] = tc["id"]
        if tc.get("type"):
            slot["type"] = tc["type"]
        fn = tc.get("function") or {}
        if fn.get("name"):
            slot["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            slot["function"]["arguments"] += fn["arguments"]

    def response_part(self) -> dict:
        return {
            "content": "".join(self.content) if self.content or not self.tool_calls else None,
            "reasoning_content": "".join(self.reasoning) or None,
            "tool_calls": [self.tool_calls[i] for i in sorted(self.tool_calls)] or None,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "logprobs": {"content": self.logprobs} if self.logprobs else None,
            "token_ids": self.token_ids or None,
            "prompt_token_ids": self.prompt_token_ids,
            "model": self.model,
            "id": self.id,
            "stream_events": self.events,
            "stream_done": self.done,
            "stream_malformed_events": self.malformed,
        }

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_chunk_at is None else round(self.first_chunk_at - self.started, 6)


def _event_end(buf: bytes) -> tuple[int, int] | None:
    """(end of the first complete SSE event, start of the next) or None: events end with a blank line."""
    best = None
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buf.find(sep)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, i + len(sep))
    return best
