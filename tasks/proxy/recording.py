"""What the proxy keeps of a call: the request's content and the response reassembled, never a header.

Pure functions over parsed bodies and raw SSE bytes; the proxy (forward.py, translating.py) calls them after
the response has gone to the client. Bodies come from the agent and the upstream, so nothing here trusts a shape:

- `request_part(body)`: messages (chat) or prompt (completions), tools, and every other parameter.
- `response_part(body)`: content, tool calls, finish reason, usage, logprobs and, when the upstream returns
  them (vLLM's `return_token_ids`, SGLang, llama.cpp's `tokens`), token ids of the completion and the prompt;
  with the first problem of shape found, or None. The core of the OpenAI form (an object with a `choices` list of
  objects, a `message` object or a `text` string, string content, a list of tool-call objects, `usage` an object
  of non-negative integer counts) must hold: a reply that breaks it is a failed call. An odd optional field
  (model, id, finish reason, reasoning, logprobs, token ids) is dropped from the record, not fatal.
- `StreamAssembler`: fed the raw bytes of a streamed (SSE) response chunk by chunk (sse.EventParser cuts and
  decodes the events), it rebuilds the same response part: content and tool-call deltas concatenated per index,
  the finish reason, the final usage chunk, logprobs and token ids; it notes when the first chunk came (time to
  first token), and counts the events that are not JSON or not of the chunk form (`problem`: the first of them).
- `model_name(value)`: a model name as the record and the ledger keep it (a string of at most 256 characters).
"""

from __future__ import annotations

from typing import Any

from evolforge.tasks.proxy.sse import EventParser, dumps, loads  # noqa: F401  (dumps, loads: the proxy's JSON)

CONTENT_KEYS = ("messages", "prompt", "tools", "tool_choice", "functions")
MAX_MODEL_CHARS = 256
MAX_TOOL_INDEX = 1024  # a tool-call index past this is not a real one (and would key an unbounded dict)
_NOTHING = object()


def model_name(value: Any) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_MODEL_CHARS else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: Any) -> bool:
    return value is None or (type(value) is int and 0 <= value < 2 ** 53)


def usage_of(value: Any) -> tuple[dict | None, str | None]:
    """(usage, problem): an object whose token counts are non-negative integers, or None."""
    if value is None:
        return None, None
    if not isinstance(value, dict):
        return None, f"usage is a {type(value).__name__}, not an object"
    bad = [k for k in ("prompt_tokens", "completion_tokens", "total_tokens") if not _count(value.get(k))]
    if bad:
        return None, f"usage.{bad[0]} is not a non-negative integer"
    return value, None


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(type(i) is int for i in value):
        return value
    return None


def _token_ids(choice: dict) -> list[int] | None:
    for key in ("token_ids", "tokens"):
        ids = _ids(choice.get(key))
        if ids is not None:
            return ids
    return None


def _content_ok(value: Any) -> bool:
    return value is None or isinstance(value, str) or (isinstance(value, list) and all(isinstance(p, dict) for p in value))


def _tool_calls_problem(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        return "tool_calls is not a list of objects"
    for c in value:
        fn = c.get("function")
        if fn is not None and (not isinstance(fn, dict) or not all(_str(fn.get(k)) is not None or fn.get(k) is None
                                                                   for k in ("name", "arguments"))):
            return "a tool call's function is not an object of strings"
    return None


def request_part(body: dict) -> dict:
    out: dict[str, Any] = {k: body[k] for k in CONTENT_KEYS if k in body}
    out["parameters"] = {k: v for k, v in body.items() if k not in CONTENT_KEYS}
    return out


def response_problem(body: Any) -> str | None:
    """The first way a non-streamed completion breaks the OpenAI form, or None."""
    if not isinstance(body, dict):
        return f"the body is a JSON {type(body).__name__}, not an object"
    choices = body.get("choices", _NOTHING)
    if not isinstance(choices, list):
        return "no choices list" if choices is _NOTHING else f"choices is a {type(choices).__name__}, not a list"
    for ch in choices:
        if not isinstance(ch, dict):
            return "a choice is not an object"
        if "message" in ch:
            msg = ch["message"]
            if not isinstance(msg, dict):
                return f"message is a {type(msg).__name__}, not an object"
            if not _content_ok(msg.get("content")):
                return "message.content is not a string"
            problem = _tool_calls_problem(msg.get("tool_calls"))
            if problem:
                return problem
        elif not (ch.get("text") is None or isinstance(ch.get("text"), str)):
            return "text is not a string"
    return usage_of(body.get("usage"))[1]


def response_part(body: dict) -> dict:
    """The recorded part of a non-streamed chat or text completion (first choice; `n` > 1 keeps all), every field
    of the type its name promises (call `response_problem` first: this assumes the core form holds)."""
    choices = body.get("choices") or [{}]
    ch = choices[0]
    msg = ch.get("message") or {}
    ptids = body.get("prompt_token_ids", ch.get("prompt_token_ids"))
    logprobs = ch.get("logprobs")
    out = {
        "content": msg.get("content") if "message" in ch else ch.get("text"),
        "reasoning_content": _str(msg.get("reasoning_content")),
        "tool_calls": msg.get("tool_calls"),
        "finish_reason": _str(ch.get("finish_reason")),
        "usage": usage_of(body.get("usage"))[0],
        "logprobs": logprobs if isinstance(logprobs, dict) else None,
        "token_ids": _token_ids(ch),
        "prompt_token_ids": _ids(ptids),
        "model": model_name(body.get("model")),
        "id": _str(body.get("id")),
    }
    if len(choices) > 1:
        out["choices"] = choices
    return out


def _tool_index(tc: dict, known: int) -> int | str:
    """The tool call's index, or a message saying why it is not one."""
    if "index" not in tc:
        return known
    i = tc["index"]
    if type(i) is not int or not 0 <= i <= MAX_TOOL_INDEX:
        return f"a tool-call index is {i!r:.40}, not an integer in 0..{MAX_TOOL_INDEX}"
    return i


class StreamAssembler(EventParser):
    """Rebuilds one response from the SSE bytes of a streamed completion, as they pass through (sse.EventParser
    cuts and decodes the events)."""

    def __init__(self, started: float):
        super().__init__(started)
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
        self.done = False

    def _done_marker(self) -> None:
        self.done = True

    def _object(self, obj: dict, data: bytes) -> None:
        self.events += 1
        self.model = self.model or model_name(obj.get("model"))
        self.id = self.id or _str(obj.get("id"))
        if obj.get("usage") is not None:
            usage, problem = usage_of(obj["usage"])
            if problem:
                return self._bad(problem)
            self.usage = usage
        self.prompt_token_ids = _ids(obj.get("prompt_token_ids")) or self.prompt_token_ids
        choices = obj.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list):
            return self._bad(f"choices is a {type(choices).__name__}, not a list")
        for ch in choices:
            if not isinstance(ch, dict):
                return self._bad("a choice is not an object")
            index = ch.get("index", 0)
            if type(index) is not int:
                return self._bad(f"a choice index is {index!r:.40}, not an integer")
            if index == 0:
                self._choice(ch)

    def _choice(self, ch: dict) -> None:
        delta = ch.get("delta") if "delta" in ch else {}
        if delta is None:
            delta = {}
        if not isinstance(delta, dict):
            return self._bad(f"a delta is a {type(delta).__name__}, not an object")
        text = delta.get("content") if "delta" in ch else ch.get("text")
        if text is not None and not isinstance(text, str):
            return self._bad("a delta's content is not a string")
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None and not (isinstance(tool_calls, list) and all(isinstance(t, dict) for t in tool_calls)):
            return self._bad("a delta's tool_calls is not a list of objects")
        for tc in tool_calls or ():
            problem = self._tool_delta(tc)
            if problem:
                return self._bad(problem)
        if text:
            self.content.append(text)
        reasoning = _str(delta.get("reasoning_content"))
        if reasoning:
            self.reasoning.append(reasoning)
        self.finish_reason = _str(ch.get("finish_reason")) or self.finish_reason
        lp = ch.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            self.logprobs.extend(lp["content"])
        ids = _token_ids(ch)
        if ids:
            self.token_ids.extend(ids)
        self.prompt_token_ids = _ids(ch.get("prompt_token_ids")) or self.prompt_token_ids

    def _tool_delta(self, tc: dict) -> str | None:
        index = _tool_index(tc, len(self.tool_calls))
        if isinstance(index, str):
            return index
        fn = tc.get("function") if tc.get("function") is not None else {}
        if not isinstance(fn, dict):
            return "a tool call's function is not an object"
        parts = {k: fn.get(k) for k in ("name", "arguments")}
        if any(v is not None and not isinstance(v, str) for v in parts.values()):
            return "a tool call's name or arguments is not a string"
        if any(tc.get(k) is not None and not isinstance(tc.get(k), str) for k in ("id", "type")):
            return "a tool call's id or type is not a string"
        slot = self.tool_calls.setdefault(index, {"id": None, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
        if tc.get("id"):
            slot["id"] = tc["id"]
        if tc.get("type"):
            slot["type"] = tc["type"]
        if parts["name"]:
            slot["function"]["name"] += parts["name"]
        if parts["arguments"]:
            slot["function"]["arguments"] += parts["arguments"]
        return None

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
