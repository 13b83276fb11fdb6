"""Translation for chat-only upstreams (`proxy.translate`): Messages API and Responses API calls made as chat
completions, and the chat reply (or stream) turned back into the client's API. What both APIs share is here; each
API's own translation is in translate_messages.py and translate_responses.py.

Pure functions and stream state over parsed bodies and raw SSE bytes; the proxy (tasks/proxy/translating.py) sends
the chat request, relays, and records both sides: the record's `request` / `response` are the client's view (what
the agent sent and received), its `translation` the chat call made upstream.

Requests (`messages_request`, `responses_request` -> `Translated`): the client's request as a chat completion
request (max tokens, temperature, top_p, stream with `stream_options.include_usage`: `common_parameters`). What
chat completions cannot carry is dropped and named in `Translated.dropped` (thinking blocks and reasoning items of
earlier turns, hosted tools such as web_search, files): the record says what the upstream did not see. A request
that is not of its API's form is refused (`Untranslatable`, a 400).

Replies (`chat_to_messages`, `chat_to_responses`) are built from the chat reply's recorded part
(recording.response_part or StreamAssembler.response_part): its tool calls (`calls_of`; arguments that are not a
JSON object become {}: `tool_input`, `Translated.notes` says so) and its usage (`usage_counts`).

Streams (`ChatStream`): the chat chunks are parsed as they come (recording.StreamAssembler: the same form checks
as a chat stream passed through) and re-emitted as the client API's event stream: text and reasoning deltas at
once, in order; tool calls when the chat stream ends (their arguments whole: the anthropic SDK parses partial
tool JSON as it streams and cannot take a small model's broken JSON), then the end events with usage. A chat
stream that breaks, ends without `[DONE]`, sends an `error` object or an event not of the chunk form ends the
client's stream with the API's error event instead.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from evolforge.tasks.proxy.recording import StreamAssembler, dumps, loads, usage_of
from evolforge.tasks.proxy.sse import frame

TRANSLATABLE = {"messages": ("messages", "both"), "responses": ("responses", "both")}  # path -> proxy.translate
CHAT_PATH = "chat/completions"


class Untranslatable(ValueError):
    """The client's request is not of its API's form, or names something the proxy cannot supply (a 400)."""

    def __init__(self, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.kind = kind


@dataclass
class Translated:
    """One client request as a chat completion request, and what the reply's translation needs to know."""

    api: str                                     # "messages" or "responses"
    body: dict                                   # the chat request sent upstream
    client_model: str | None
    stream: bool
    dropped: list[str] = field(default_factory=list)  # what the upstream did not see (no chat form)
    notes: list[str] = field(default_factory=list)    # what the reply's translation changed (bad tool JSON)
    custom_tools: set[str] = field(default_factory=set)  # Responses: freeform tools, called with {"input": ...}
    shell_tools: set[str] = field(default_factory=set)   # Responses: Codex's local_shell
    conversation: list[dict] = field(default_factory=list)  # Responses: chat messages after the instructions
    request: dict = field(default_factory=dict)       # the client's body

    def drop(self, what: str) -> None:
        if what not in self.dropped:
            self.dropped.append(what)

    def record(self) -> dict:
        """The record's `translation`: the chat request sent; translating.py adds the upstream's status, the chat
        reply's recorded part (recording.response_part, or StreamAssembler's for a stream) and the error, if any."""
        return {"route": "chat.completions", "path": CHAT_PATH, "request": self.body, "status": None,
                "response": None, "error": None, "dropped": self.dropped, "notes": self.notes}


def to_json(obj: Any) -> bytes:
    """JSON bytes of what the proxy sends (orjson); text orjson refuses (a lone surrogate a client or upstream sent
    as an escape) goes as its \\u escape, as JSON allows."""
    try:
        return dumps(obj)
    except UnicodeEncodeError:
        return json.dumps(obj, default=str).encode()


def str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def json_text(value: Any) -> str:
    return value if isinstance(value, str) else to_json(value if value is not None else {}).decode()


def chat_content(parts: list[dict]) -> str | list[dict]:
    """Chat content: a string when all parts are text (what every chat server takes), else the parts."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def common_parameters(tr: Translated, body: dict, max_key: str) -> None:
    out = tr.body
    for key in ("temperature", "top_p"):
        if isinstance(body.get(key), (int, float)) and not isinstance(body.get(key), bool):
            out[key] = body[key]
    if type(body.get(max_key)) is int:
        out["max_tokens"] = body[max_key]
    if tr.stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}


def tool_input(call: dict, tr: Translated) -> dict:
    raw = call["function"]["arguments"] or ""
    try:
        value = loads(raw) if raw.strip() else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    tr.notes.append(f"tool call {str(call.get('id'))[:60]}: arguments are not a JSON object ({raw[:80]!r}); "
                    "the client got {}")
    return {}


def calls_of(part: dict) -> list[dict]:
    """The chat reply's tool calls, each with a string id, name and arguments."""
    out = []
    for i, c in enumerate(part.get("tool_calls") or []):
        fn = c.get("function") if isinstance(c, dict) and isinstance(c.get("function"), dict) else {}
        out.append({"id": str_or_none(c.get("id")) if isinstance(c, dict) and c.get("id") else f"call_{i}",
                    "function": {"name": str_or_none(fn.get("name")) or "",
                                 "arguments": str_or_none(fn.get("arguments")) or ""}})
    return out


def usage_counts(usage: Any) -> tuple[int, int, int]:
    """(prompt, completion, cached prompt) tokens of a chat usage (0 where it says nothing)."""
    usage = usage_of(usage)[0] or {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    pt, ct = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    cached = cached if type(cached) is int and 0 <= cached <= pt else 0
    return pt, ct, cached


def event(kind: str, data: dict) -> bytes:
    """One event of the client's typed-event stream: its `type` is its name."""
    return frame(to_json({"type": kind, **data}), kind)


class ChatStream(StreamAssembler):
    """A chat SSE stream parsed as it comes (StreamAssembler: the record of the upstream's reply) and re-emitted in
    the client's API: `feed(chunk)`, then `take()` the bytes to send; `finish()` once the upstream has ended;
    `fail(message)` to end the client's stream with an error. `failed` says why the chat stream cannot go on."""

    def __init__(self, started: float, tr: Translated, error_event, rid: str):
        super().__init__(started)
        self.tr = tr
        self.rid = rid  # the id of the client's message / response
        self.out: list[bytes] = []
        self.started_out = False
        self.closed = False
        self.upstream_error: str | None = None
        self._error_event = error_event

    # the chat side
    def _event(self, raw: bytes) -> None:
        super()._event(raw)
        if self.events and not self.failed and not self.closed:
            self._begin()  # the client's stream starts with the upstream's first chunk (its model is known)

    def _object(self, obj: dict, data: bytes) -> None:
        if not self.upstream_error and b'"error"' in data and obj.get("error") is not None \
                and obj.get("choices") is None:
            err = obj["error"]
            self.upstream_error = str(err.get("message") if isinstance(err, dict) else err)[:300]
            return
        super()._object(obj, data)

    def _choice(self, ch: dict) -> None:
        n_text, n_reason, bad = len(self.content), len(self.reasoning), self.malformed
        super()._choice(ch)
        if self.malformed != bad or self.closed:
            return
        if len(self.reasoning) > n_reason or len(self.content) > n_text:
            self._begin()
        for piece in self.reasoning[n_reason:]:
            self.on_reasoning(piece)
        for piece in self.content[n_text:]:
            self.on_text(piece)

    @property
    def failed(self) -> str | None:
        if self.problem:
            return f"upstream chat stream: an event not of the chunk form ({self.problem})"
        if self.upstream_error:
            return f"upstream chat stream error: {self.upstream_error}"
        return None

    # the client side
    def take(self) -> bytes:
        data, self.out = b"".join(self.out), []
        return data

    def _begin(self) -> None:
        if not self.started_out:
            self.started_out = True
            self.on_start()

    def finish(self) -> None:
        """The chat stream ended with [DONE]: the tool calls, then the end events."""
        if self.closed:
            return
        self._begin()
        self.on_finish(self.response_part())
        self.closed = True

    def fail(self, message: str) -> None:
        if self.closed:
            return
        self.out.append(self._error_event(message))
        self.closed = True

    def on_start(self) -> None:
        raise NotImplementedError

    def on_text(self, piece: str) -> None:
        raise NotImplementedError

    def on_reasoning(self, piece: str) -> None:
        raise NotImplementedError

    def on_finish(self, part: dict) -> None:
        raise NotImplementedError

    @classmethod
    def replay(cls, part: dict, started: float, tr: Translated, error_event, rid: str) -> "ChatStream":
        """The client's event stream of a whole chat reply (an upstream that answered a stream request in JSON)."""
        s = cls(started, tr, error_event, rid)
        s._begin()
        if part.get("reasoning_content"):
            s.on_reasoning(part["reasoning_content"])
        if isinstance(part.get("content"), str) and part["content"]:
            s.on_text(part["content"])
        s.on_finish(part)
        s.closed = True
        return s
