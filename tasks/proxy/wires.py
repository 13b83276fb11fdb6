"""The three wire APIs the proxy records, each as one `Wire`: how its request and response are kept, what breaks
its form, how its usage reaches the ledger, how its stream is reassembled and ended.

- CHAT (`chat/completions`, `completions`): tasks/proxy/recording.py.
- RESPONSES (`POST /v1/responses`, OpenAI's Responses API: Codex, the Agents SDK by default). Request: `input`
  (a string or a list of items: messages, `function_call`, `function_call_output`, `reasoning`, ...),
  `instructions`, `tools`, `tool_choice`, `previous_response_id`; the rest under `parameters`. Response: the
  `output` items as sent, plus `content` (the output_text parts joined), `reasoning_content` (reasoning items'
  summary and text), `tool_calls` (function_call items in the chat form: id = call_id, JSON-string arguments),
  `finish_reason` (the response's `status`), `usage` (the API's own: input_tokens, output_tokens, ...), `logprobs`
  (chat's {"content": [...]} form, when output_text parts or text deltas carry them). A stream
  (`response.created`, `response.output_item.added`, `response.output_text.delta`,
  `response.function_call_arguments.delta`, `response.reasoning_*.delta`, `response.output_item.done`,
  `response.completed` / `response.incomplete` / `response.failed`, `error`) is rebuilt into the same part;
  it ends with `response.completed` (or `.incomplete`); `response.failed` or `error` marks the record failed.
- MESSAGES (`POST /v1/messages`, Anthropic's Messages API: Claude Code, the anthropic SDK). Request: `system`,
  `messages` (content blocks text, image, tool_use, tool_result, thinking), `tools`, `tool_choice`; the rest
  under `parameters`. Response: `content_blocks` as sent, `content` (text blocks joined), `reasoning_content`
  (thinking blocks), `tool_calls` (tool_use blocks in the chat form, `input` as a JSON string), `finish_reason`
  (`stop_reason`), `usage` (input_tokens, output_tokens, cache_*). A stream (`message_start`,
  `content_block_start`, `content_block_delta` with text_delta / input_json_delta / thinking_delta /
  signature_delta, `content_block_stop`, `message_delta` with stop_reason and usage, `message_stop`, `ping`,
  `error`) ends with `message_stop`.

The ledger's prompt / completion tokens come from each API's own usage fields (Messages: input_tokens plus the
cache reads and writes); the ledger usage also names the cache reads and writes among the prompt tokens
(`cache_read_tokens`, `cache_write_tokens`: Messages' cache_read_input_tokens / cache_creation_input_tokens, the
Responses API's input_tokens_details.cached_tokens), which tasks/core/pricing.py prices at their own rates. A
Messages stream cut before its message_delta (which carries the output count) is charged the completion tokens
that arrived: at least one per content delta and one per four characters streamed, never fewer than
message_start said; the record names the estimate (`stream_estimated_output_tokens`). Nothing trusts a shape: what breaks an API's core form is a failed call (a 502 to the
client when not streamed), an odd optional field is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from evolforge.tasks.proxy.recording import (
    MAX_TOOL_INDEX,
    StreamAssembler,
    dumps,
    loads,
    model_name,
    request_part,
    response_part,
    response_problem,
    usage_of,
)
from evolforge.tasks.proxy.sse import EventParser, frame

_NOTHING = object()


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: Any) -> bool:
    return value is None or (type(value) is int and 0 <= value < 2 ** 53)


def _usage(value: Any, keys: tuple[str, ...]) -> tuple[dict | None, str | None]:
    """(usage, problem): an object whose named counts are non-negative integers (others kept if ints), or None."""
    if value is None:
        return None, None
    if not isinstance(value, dict):
        return None, f"usage is a {type(value).__name__}, not an object"
    bad = [k for k in keys if not _count(value.get(k))]
    if bad:
        return None, f"usage.{bad[0]} is not a non-negative integer"
    return value, None


def _sum(*values) -> int | None:
    got = [v for v in values if type(v) is int]
    return sum(got) if got else None


# ------------------------------------------------------------------ Responses API
RESPONSES_REQUEST_KEYS = ("input", "instructions", "tools", "tool_choice", "previous_response_id")
RESPONSES_USAGE_KEYS = ("input_tokens", "output_tokens", "total_tokens")


def responses_request(body: dict) -> dict:
    out: dict[str, Any] = {k: body[k] for k in RESPONSES_REQUEST_KEYS if k in body}
    out["parameters"] = {k: v for k, v in body.items() if k not in RESPONSES_REQUEST_KEYS}
    return out


def responses_ledger_usage(usage: Any) -> dict | None:
    usage, _ = _usage(usage, RESPONSES_USAGE_KEYS)
    if usage is None:
        return None
    pt, ct = usage.get("input_tokens"), usage.get("output_tokens")
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": _sum(pt, ct),
            "cache_read_tokens": cached if type(cached) is int and cached >= 0 else 0, "cache_write_tokens": 0}


def _item_problem(item: Any) -> str | None:
    if not isinstance(item, dict):
        return "an output item is not an object"
    content = item.get("content")
    if content is not None and not (isinstance(content, list) and all(isinstance(p, dict) for p in content)):
        return "an output item's content is not a list of objects"
    for part in content or ():
        if part.get("text") is not None and not isinstance(part.get("text"), str):
            return "an output text part's text is not a string"
    if item.get("type") in TOOL_CALL_ITEMS:
        if any(item.get(k) is not None and not isinstance(item.get(k), str)
               for k in ("name", "arguments", "call_id", "input")):
            return f"a {item['type']} item's name, arguments, input or call_id is not a string"
    return None


def responses_problem(body: Any) -> str | None:
    """The first way a non-streamed Responses API response breaks the form, or None."""
    if not isinstance(body, dict):
        return f"the body is a JSON {type(body).__name__}, not an object"
    output = body.get("output", _NOTHING)
    if not isinstance(output, list):
        return "no output list" if output is _NOTHING else f"output is a {type(output).__name__}, not a list"
    for item in output:
        problem = _item_problem(item)
        if problem:
            return problem
    return _usage(body.get("usage"), RESPONSES_USAGE_KEYS)[1]


def _texts(parts: Any, kinds: tuple[str, ...]) -> list[str]:
    if not isinstance(parts, list):
        return []
    return [p["text"] for p in parts if isinstance(p, dict) and p.get("type") in kinds and isinstance(p.get("text"), str)]


# items that call a tool: function tools, Codex's freeform (custom) tools such as apply_patch, its local shell
TOOL_CALL_ITEMS = ("function_call", "custom_tool_call", "local_shell_call")
TOOL_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def tool_call_name(item: dict) -> str:
    return _str(item.get("name")) or ("local_shell" if item.get("type") == "local_shell_call" else "")


def tool_call_arguments(item: dict) -> str:
    """The call's arguments as one string: a function's JSON, a custom tool's raw input, a shell call's action."""
    kind = item.get("type")
    if kind == "custom_tool_call":
        return _str(item.get("input")) or ""
    if kind == "local_shell_call":
        return dumps(item.get("action")).decode() if item.get("action") is not None else "{}"
    return _str(item.get("arguments")) or ""


def _logprobs(parts: Any) -> list[dict]:
    """The per-token logprobs of output_text parts (`include: ["message.output_text.logprobs"]`), chat's form."""
    out: list[dict] = []
    for p in parts if isinstance(parts, list) else ():
        if isinstance(p, dict) and isinstance(p.get("logprobs"), list):
            out.extend(x for x in p["logprobs"] if isinstance(x, dict) and isinstance(x.get("logprob"), (int, float)))
    return out


def responses_output(output: list, status: Any, usage: Any, model: Any, rid: Any) -> dict:
    """The recorded part of a Responses API answer from its output items (the non-streamed body's or those a
    stream rebuilt)."""
    content, reasoning, calls, logprobs = [], [], [], []
    items = [i for i in output if isinstance(i, dict)]
    for item in items:
        kind = item.get("type")
        if kind == "message":
            content.extend(_texts(item.get("content"), ("output_text", "text")))
            logprobs.extend(_logprobs(item.get("content")))
        elif kind == "reasoning":
            reasoning.extend(_texts(item.get("content"), ("reasoning_text",)) or
                             _texts(item.get("summary"), ("summary_text",)))
        elif kind in TOOL_CALL_ITEMS:
            calls.append({"id": _str(item.get("call_id")) or _str(item.get("id")), "type": "function",
                          "function": {"name": tool_call_name(item), "arguments": tool_call_arguments(item)}})
    return {
        "content": "".join(content) if content or not calls else None,
        "reasoning_content": "".join(reasoning) or None,
        "tool_calls": calls or None,
        "finish_reason": _str(status),
        "usage": _usage(usage, RESPONSES_USAGE_KEYS)[0],
        "logprobs": {"content": logprobs} if logprobs else None,
        "output": items,
        "model": model_name(model),
        "id": _str(rid),
    }


def responses_part(body: dict) -> dict:
    return responses_output(body.get("output") or [], body.get("status"), body.get("usage"), body.get("model"),
                            body.get("id"))


# ------------------------------------------------------------------ Messages API
MESSAGES_REQUEST_KEYS = ("system", "messages", "tools", "tool_choice")
MESSAGES_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def messages_request(body: dict) -> dict:
    out: dict[str, Any] = {k: body[k] for k in MESSAGES_REQUEST_KEYS if k in body}
    out["parameters"] = {k: v for k, v in body.items() if k not in MESSAGES_REQUEST_KEYS}
    return out


def messages_ledger_usage(usage: Any) -> dict | None:
    usage, _ = _usage(usage, MESSAGES_USAGE_KEYS)
    if usage is None:
        return None
    pt = _sum(usage.get("input_tokens"), usage.get("cache_creation_input_tokens"), usage.get("cache_read_input_tokens"))
    ct = usage.get("output_tokens")
    return {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": _sum(pt, ct),
            "cache_read_tokens": _sum(usage.get("cache_read_input_tokens")) or 0,
            "cache_write_tokens": _sum(usage.get("cache_creation_input_tokens")) or 0}


def _block_problem(block: Any) -> str | None:
    if not isinstance(block, dict):
        return "a content block is not an object"
    kind = block.get("type")
    if kind == "text" and not isinstance(block.get("text"), str):
        return "a text block's text is not a string"
    if kind == "thinking" and not isinstance(block.get("thinking"), (str, type(None))):
        return "a thinking block's thinking is not a string"
    if kind == "tool_use" and (not isinstance(block.get("input", {}), dict)
                               or any(not isinstance(block.get(k), (str, type(None))) for k in ("id", "name"))):
        return "a tool_use block's input is not an object or its id / name not a string"
    return None


def messages_problem(body: Any) -> str | None:
    """The first way a non-streamed Messages API response breaks the form, or None."""
    if not isinstance(body, dict):
        return f"the body is a JSON {type(body).__name__}, not an object"
    content = body.get("content", _NOTHING)
    if not isinstance(content, list):
        return "no content list" if content is _NOTHING else f"content is a {type(content).__name__}, not a list"
    for block in content:
        problem = _block_problem(block)
        if problem:
            return problem
    return _usage(body.get("usage"), MESSAGES_USAGE_KEYS)[1]


def messages_output(blocks: list, stop_reason: Any, usage: Any, model: Any, mid: Any) -> dict:
    content, reasoning, calls = [], [], []
    blocks = [b for b in blocks if isinstance(b, dict)]
    for b in blocks:
        kind = b.get("type")
        if kind == "text" and isinstance(b.get("text"), str):
            content.append(b["text"])
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            reasoning.append(b["thinking"])
        elif kind == "tool_use":
            raw = b.get("input")
            args = raw if isinstance(raw, str) else dumps(raw if raw is not None else {}).decode()
            calls.append({"id": _str(b.get("id")), "type": "function",
                          "function": {"name": _str(b.get("name")) or "", "arguments": args}})
    return {
        "content": "".join(content) if content or not calls else None,
        "reasoning_content": "".join(reasoning) or None,
        "tool_calls": calls or None,
        "finish_reason": _str(stop_reason),
        "usage": _usage(usage, MESSAGES_USAGE_KEYS)[0],
        "content_blocks": blocks,
        "model": model_name(model),
        "id": _str(mid),
    }


def messages_part(body: dict) -> dict:
    return messages_output(body.get("content") or [], body.get("stop_reason"), body.get("usage"), body.get("model"),
                           body.get("id"))


# ------------------------------------------------------------------ streams of the typed-event APIs
class EventAssembler(EventParser):
    """Rebuilds one response from the SSE bytes of a Responses or Messages stream (typed events: the data's
    `type`), as they pass through (sse.EventParser cuts and decodes the events). Same interface as
    recording.StreamAssembler: feed, pending, ttft_s, response_part(), usage (for the ledger), events, malformed,
    problem, done, error."""

    end_marker = ""
    lenient_index = None  # what a missing index means (llama-server's Responses deltas carry item_id only)

    def __init__(self, started: float):
        super().__init__(started)
        self.events = 0
        self.done = False
        self.error: str | None = None  # the upstream's own error event (response.failed, error)
        self.model: str | None = None
        self.id: str | None = None

    def _object(self, obj: dict, data: bytes) -> None:
        kind = obj.get("type")
        if not isinstance(kind, str):
            return self._bad("an event has no type")
        self.events += 1
        try:
            problem = self._typed(kind, obj)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            problem = f"a {kind[:60]} event of unexpected shape ({type(e).__name__})"
        if problem:
            self._bad(problem)

    def _typed(self, kind: str, obj: dict) -> str | None:
        raise NotImplementedError

    def _index(self, obj: dict, key: str) -> int | str:
        i = obj.get(key)
        if i is None and key == "output_index" and self.lenient_index is not None:
            return self.lenient_index(obj)
        if type(i) is not int or not 0 <= i <= MAX_TOOL_INDEX:
            return f"an event's {key} is {i!r:.40}, not an integer in 0..{MAX_TOOL_INDEX}"
        return i

    def _stats(self) -> dict:
        return {"stream_events": self.events, "stream_done": self.done, "stream_malformed_events": self.malformed}


class ResponsesAssembler(EventAssembler):
    end_marker = "response.completed"

    def __init__(self, started: float):
        super().__init__(started)
        self.items: dict[int, dict] = {}
        self.texts: dict[int, list[str]] = {}
        self.args: dict[int, list[str]] = {}
        self.reasoning: dict[int, list[str]] = {}
        self.final: dict | None = None
        self.item_index: dict[str, int] = {}  # item id -> output index
        self.logprobs: list[dict] = []  # of the text deltas, when the upstream sends them
        self.status: str | None = None
        self.api_usage: dict | None = None
        self.usage: dict | None = None

    def lenient_index(self, obj: dict) -> int:
        """An event without output_index: the item its item_id names, else the last item added (else 0)."""
        known = self.item_index.get(obj.get("item_id")) if isinstance(obj.get("item_id"), str) else None
        return known if known is not None else max(self.items, default=0)

    def _response(self, resp: Any) -> str | None:
        if not isinstance(resp, dict):
            return "an event's response is not an object"
        self.model = self.model or model_name(resp.get("model"))
        self.id = self.id or _str(resp.get("id"))
        self.status = _str(resp.get("status")) or self.status
        if resp.get("usage") is not None:
            usage, problem = _usage(resp["usage"], RESPONSES_USAGE_KEYS)
            if problem:
                return problem
            self.api_usage, self.usage = usage, responses_ledger_usage(usage)
        return None

    def _typed(self, kind: str, obj: dict) -> str | None:
        if kind in ("response.created", "response.in_progress", "response.completed", "response.incomplete",
                    "response.failed"):
            problem = self._response(obj.get("response"))
            if problem:
                return problem
            if kind in ("response.completed", "response.incomplete"):
                self.done = True
                out = obj["response"].get("output")
                if isinstance(out, list) and out:
                    if any(_item_problem(i) for i in out):
                        return next(p for p in map(_item_problem, out) if p)
                    self.final = obj["response"]
            elif kind == "response.failed":
                err = obj["response"].get("error")
                msg = err.get("message") if isinstance(err, dict) else None
                self.error = f"upstream response.failed: {str(msg)[:300]}"
            return None
        if kind == "error":
            msg = obj.get("message") or (obj.get("error") or {}).get("message")
            self.error = f"upstream stream error: {str(msg)[:300]}"
            return None
        if kind in ("response.output_item.added", "response.output_item.done"):
            i = self._index(obj, "output_index")
            if isinstance(i, str):
                return i
            item = obj.get("item")
            problem = _item_problem(item)
            if problem:
                return problem
            if kind == "response.output_item.done" or i not in self.items:
                self.items[i] = item
            if isinstance(item.get("id"), str):
                self.item_index[item["id"]] = i
            return None
        if kind in ("response.output_text.delta", "response.function_call_arguments.delta",
                    "response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            i = self._index(obj, "output_index")
            if isinstance(i, str):
                return i
            delta = obj.get("delta")
            if not isinstance(delta, str):
                return f"a {kind} delta is not a string"
            slot = {"response.output_text.delta": self.texts,
                    "response.function_call_arguments.delta": self.args}.get(kind, self.reasoning)
            slot.setdefault(i, []).append(delta)
            if kind == "response.output_text.delta":
                self.logprobs.extend(_logprobs([obj]))
            return None
        return None  # other events (content_part.*, *.done, refusal, tool progress) add nothing the items lack

    def response_part(self) -> dict:
        if self.final is not None:
            f = self.final
            part = responses_output(f["output"], f.get("status"), f.get("usage"), f.get("model") or self.model,
                                    f.get("id") or self.id)
            if part["logprobs"] is None and self.logprobs:
                part["logprobs"] = {"content": self.logprobs}
            return {**part, **self._stats()}
        items = []
        for i in sorted(set(self.items) | set(self.texts) | set(self.args) | set(self.reasoning)):
            item = dict(self.items.get(i) or {})
            if i in self.texts and not _texts(item.get("content"), ("output_text",)):
                item.setdefault("type", "message")
                item["content"] = [{"type": "output_text", "text": "".join(self.texts[i])}]
            if i in self.args and not item.get("arguments"):
                item.setdefault("type", "function_call")
                item["arguments"] = "".join(self.args[i])
            if i in self.reasoning and not (item.get("summary") or item.get("content")):
                item.setdefault("type", "reasoning")
                item["content"] = [{"type": "reasoning_text", "text": "".join(self.reasoning[i])}]
            items.append(item)
        part = responses_output(items, self.status, self.api_usage, self.model, self.id)
        if part["logprobs"] is None and self.logprobs:
            part["logprobs"] = {"content": self.logprobs}
        return {**part, **self._stats()}


class MessagesAssembler(EventAssembler):
    end_marker = "message_stop"

    def __init__(self, started: float):
        super().__init__(started)
        self.blocks: dict[int, dict] = {}
        self.json_parts: dict[int, list[str]] = {}
        self.stop_reason: str | None = None
        self.api_usage: dict = {}
        self.output_counted = False  # a message_delta gave the output count (a cut stream never sends it)
        self.streamed_deltas = 0  # text, thinking and tool-input deltas that arrived, and their characters
        self.streamed_chars = 0

    @property
    def streamed_tokens(self) -> int:
        """The completion tokens a stream that arrived this far carries, at the least: one per delta, one per four
        characters."""
        return max(self.streamed_deltas, -(-self.streamed_chars // 4))

    @property
    def usage(self) -> dict | None:
        """The ledger usage: the API's own counts; a stream cut before its output count is charged what arrived."""
        if not self.api_usage:
            return None
        if self.output_counted:
            return messages_ledger_usage(self.api_usage)
        said = self.api_usage.get("output_tokens") if type(self.api_usage.get("output_tokens")) is int else 0
        return messages_ledger_usage({**self.api_usage, "output_tokens": max(said, self.streamed_tokens)})

    def _merge_usage(self, value: Any) -> str | None:
        usage, problem = _usage(value, MESSAGES_USAGE_KEYS)
        if problem:
            return problem
        if usage:
            self.api_usage.update({k: v for k, v in usage.items() if v is not None})
        return None

    def _typed(self, kind: str, obj: dict) -> str | None:
        if kind == "message_start":
            msg = obj.get("message")
            if not isinstance(msg, dict):
                return "message_start's message is not an object"
            self.model = self.model or model_name(msg.get("model"))
            self.id = self.id or _str(msg.get("id"))
            return self._merge_usage(msg.get("usage"))
        if kind == "content_block_start":
            i = self._index(obj, "index")
            if isinstance(i, str):
                return i
            block = obj.get("content_block")
            problem = _block_problem(block)
            if problem:
                return problem
            self.blocks[i] = dict(block)
            return None
        if kind == "content_block_delta":
            i = self._index(obj, "index")
            if isinstance(i, str):
                return i
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return "a content_block_delta's delta is not an object"
            dkind = delta.get("type")
            field_of = {"text_delta": ("text", "text"), "thinking_delta": ("thinking", "thinking"),
                        "signature_delta": ("signature", "signature"), "input_json_delta": ("partial_json", None),
                        "citations_delta": (None, None)}
            key, target = field_of.get(dkind, (None, None))
            if key is None:
                return None
            piece = delta.get(key)
            if not isinstance(piece, str):
                return f"a {dkind} is not a string"
            block = self.blocks.setdefault(i, {"type": {"text_delta": "text", "thinking_delta": "thinking",
                                                        "input_json_delta": "tool_use"}.get(dkind, "text")})
            if dkind != "signature_delta":  # a signature is no generated text
                self.streamed_deltas += 1
                self.streamed_chars += len(piece)
            if target is None:
                self.json_parts.setdefault(i, []).append(piece)
            else:
                block[target] = (_str(block.get(target)) or "") + piece
            return None
        if kind == "message_delta":
            delta = obj.get("delta")
            if delta is not None and not isinstance(delta, dict):
                return "message_delta's delta is not an object"
            self.stop_reason = _str((delta or {}).get("stop_reason")) or self.stop_reason
            usage = obj.get("usage")
            self.output_counted = self.output_counted or (isinstance(usage, dict)
                                                          and type(usage.get("output_tokens")) is int)
            return self._merge_usage(usage)
        if kind == "message_stop":
            self.done = True
            return None
        if kind == "error":
            err = obj.get("error")
            msg = err.get("message") if isinstance(err, dict) else err
            self.error = f"upstream stream error: {str(msg)[:300]}"
            return None
        return None  # ping, content_block_stop

    def response_part(self) -> dict:
        blocks = []
        for i in sorted(self.blocks):
            b = dict(self.blocks[i])
            if i in self.json_parts:
                raw = "".join(self.json_parts[i])
                try:
                    b["input"] = loads(raw) if raw.strip() else {}
                except ValueError:
                    b["input"] = raw  # kept as sent: the record's tool call carries it as its arguments string
            blocks.append(b)
        part = messages_output(blocks, self.stop_reason, self.api_usage or None, self.model, self.id)
        if self.api_usage and not self.output_counted:
            part["stream_estimated_output_tokens"] = self.usage["completion_tokens"]
        return {**part, **self._stats()}


# ------------------------------------------------------------------ the wires
def _openai_error_event(message: str) -> bytes:
    return frame(dumps({"error": {"message": message, "type": "upstream_error", "code": 502}}))


def _typed_error_event(message: str) -> bytes:
    """An SSE error event both SDKs raise: the anthropic SDK on `event: error`, the openai SDK on a data object
    with an `error` key."""
    return frame(dumps({"type": "error", "error": {"type": "upstream_error", "message": message, "code": 502}}),
                 "error")


@dataclass(frozen=True)
class Wire:
    name: str                                        # how a response of this API is named in messages
    request_part: Callable[[dict], dict]
    response_problem: Callable[[Any], str | None]
    response_part: Callable[[dict], dict]
    ledger_usage: Callable[[Any], dict | None]       # the API's usage -> prompt / completion tokens for the ledger
    assembler: Callable[[float], Any]
    end_marker: str                                  # what a whole stream ends with
    error_event: Callable[[str], bytes]              # the SSE event that tells the client the stream broke


CHAT = Wire("OpenAI completion", request_part, response_problem, response_part, lambda u: usage_of(u)[0],
            StreamAssembler, "[DONE]", _openai_error_event)
RESPONSES = Wire("Responses API response", responses_request, responses_problem, responses_part,
                 responses_ledger_usage, ResponsesAssembler, "response.completed", _typed_error_event)
MESSAGES = Wire("Messages API response", messages_request, messages_problem, messages_part, messages_ledger_usage,
                MessagesAssembler, "message_stop", _typed_error_event)
WIRES = {"chat/completions": CHAT, "completions": CHAT, "responses": RESPONSES, "messages": MESSAGES}
