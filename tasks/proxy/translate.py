"""Translation for chat-only upstreams (`proxy.translate`): Messages API and Responses API calls made as chat
completions, and the chat reply (or stream) turned back into the client's API.

Pure functions and stream state over parsed bodies and raw SSE bytes; the app (tasks/proxy/app.py) sends the chat
request, relays, and records both sides: the record's `request` / `response` are the client's view (what the
agent sent and received), its `translation` the chat call made upstream.

Requests (`messages_request`, `responses_request` -> `Translated`):
- Messages: `system` (a string or text blocks) is the system message, as are messages of role system (Claude Code
  sends them mid-conversation); user text and image blocks (base64 or url
  sources, as data: / http URLs) are the user's content; `tool_result` blocks become `tool` messages (before the
  user's other content in that turn; images in a tool result go to the user's content after them);
  assistant text and `tool_use` blocks become the assistant's content and `tool_calls` (input as a JSON string).
  Tools (`input_schema`) become function tools; `tool_choice` auto / any / tool / none becomes auto / required /
  the function / none; `disable_parallel_tool_use` becomes `parallel_tool_calls: false`; max_tokens,
  temperature, top_p, top_k, stop_sequences (`stop`), stream (with `stream_options.include_usage`).
- Responses: `instructions` is the system message, `developer` messages are system messages; message items
  (input_text, output_text, input_image parts), `function_call` / `custom_tool_call` / `local_shell_call` items
  the assistant's tool calls, their `*_output` items `tool` messages. A custom (freeform) tool becomes a function
  taking {"input": string}, Codex's `local_shell` a function of its action; `previous_response_id` is expanded
  from the responses this proxy translated before (`History`, `proxy.translate_history`). max_output_tokens,
  temperature, top_p, parallel_tool_calls, `text.format` (response_format), logprobs, stream.
- What chat completions cannot carry is dropped and named in `Translated.dropped` (thinking blocks and reasoning
  items of earlier turns, hosted tools such as web_search, files): the record says what the upstream did not see.
  A request that is not of its API's form is refused (`Untranslatable`, a 400).

Replies (`chat_to_messages`, `chat_to_responses`) are built from the chat reply's recorded part
(recording.response_part or StreamAssembler.response_part): reasoning_content becomes a thinking block /
reasoning item, content a text block / message item, tool calls tool_use blocks (arguments that are not a JSON
object become {}: `Translated.notes` says so) / function_call items (custom_tool_call with the freeform input,
local_shell_call with its action, for tools the request declared so); finish_reason stop / length / tool_calls /
content_filter becomes end_turn / max_tokens / tool_use / refusal, or status completed / incomplete; usage is the
API's own (Messages: input_tokens without the cached prompt tokens, cache_read_input_tokens those).

Streams (`ChatStream`): the chat chunks are parsed as they come (recording.StreamAssembler: the same form checks
as a chat stream passed through) and re-emitted as the client API's event stream: text and reasoning deltas at
once, in order; tool calls when the chat stream ends (their arguments whole: the anthropic SDK parses partial
tool JSON as it streams and cannot take a small model's broken JSON), then the end events with usage
(Messages: message_delta, message_stop; Responses: response.completed or response.incomplete). A chat stream
that breaks, ends without `[DONE]`, sends an `error` object or an event not of the chunk form ends the client's
stream with the API's error event instead.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from evolforge.tasks.proxy.recording import StreamAssembler, dumps, loads, model_name, usage_of

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
        """The record's `translation`: the chat request sent; the app adds the upstream's status, the chat reply's
        recorded part (recording.response_part, or StreamAssembler's for a stream) and the error, if any."""
        return {"route": "chat.completions", "path": CHAT_PATH, "request": self.body, "status": None,
                "response": None, "error": None, "dropped": self.dropped, "notes": self.notes}


def to_json(obj: Any) -> bytes:
    """JSON bytes of what the proxy sends (orjson); text orjson refuses (a lone surrogate a client or upstream sent
    as an escape) goes as its \\u escape, as JSON allows."""
    try:
        return dumps(obj)
    except UnicodeEncodeError:
        return json.dumps(obj, default=str).encode()


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else to_json(value if value is not None else {}).decode()


def _merge_system(messages: list[dict]) -> list[dict]:
    """Leading system messages joined into one (many chat templates take a single system message, first)."""
    head = 0
    while head < len(messages) and messages[head]["role"] == "system" and isinstance(messages[head]["content"], str):
        head += 1
    if head <= 1:
        return messages
    return [{"role": "system", "content": "\n\n".join(m["content"] for m in messages[:head])}, *messages[head:]]


def _content(parts: list[dict]) -> str | list[dict]:
    """Chat content: a string when all parts are text (what every chat server takes), else the parts."""
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _common(tr: Translated, body: dict, max_key: str) -> None:
    out = tr.body
    for key in ("temperature", "top_p"):
        if isinstance(body.get(key), (int, float)) and not isinstance(body.get(key), bool):
            out[key] = body[key]
    if type(body.get(max_key)) is int:
        out["max_tokens"] = body[max_key]
    if tr.stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}


# ------------------------------------------------------------------ Messages API -> chat
def _image_part(block: dict) -> dict:
    src = block.get("source")
    if not isinstance(src, dict):
        raise Untranslatable("an image block has no source object")
    if src.get("type") == "base64" and isinstance(src.get("data"), str) and isinstance(src.get("media_type"), str):
        return {"type": "image_url", "image_url": {"url": f"data:{src['media_type']};base64,{src['data']}"}}
    if src.get("type") == "url" and isinstance(src.get("url"), str):
        return {"type": "image_url", "image_url": {"url": src["url"]}}
    raise Untranslatable(f"an image source of type {str(src.get('type'))[:40]!r} (base64 and url translate)")


def _block_parts(blocks: Any, tr: Translated, where: str) -> list[dict]:
    """Text and image blocks as chat content parts (other kinds dropped, named)."""
    if isinstance(blocks, str):
        return [{"type": "text", "text": blocks}]
    if blocks is None:
        return []
    if not isinstance(blocks, list):
        raise Untranslatable(f"{where} is neither a string nor a list of blocks")
    parts = []
    for b in blocks:
        if not isinstance(b, dict):
            raise Untranslatable(f"a block of {where} is not an object")
        kind = b.get("type")
        if kind == "text":
            if not isinstance(b.get("text"), str):
                raise Untranslatable("a text block's text is not a string")
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image":
            parts.append(_image_part(b))
        elif kind == "document" and isinstance(b.get("source"), dict) and b["source"].get("type") == "text" \
                and isinstance(b["source"].get("data"), str):
            parts.append({"type": "text", "text": b["source"]["data"]})
        else:
            tr.drop(f"{str(kind)[:40]} blocks")
    return parts


def _user_turn(blocks: list, tr: Translated) -> list[dict]:
    """A user turn: its tool results as tool messages first (they answer the assistant's calls), then the rest."""
    tools, parts = [], []
    for b in blocks:
        if isinstance(b, dict) and b.get("type") == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise Untranslatable("a tool_result block's tool_use_id is not a string")
            if b.get("is_error") is True:
                tr.drop("tool_result is_error flags")  # a chat tool message has none: the text alone goes
            inner = _block_parts(b.get("content"), tr, "a tool_result's content")
            text = "\n".join(p["text"] for p in inner if p["type"] == "text")
            tools.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
            parts.extend(p for p in inner if p["type"] != "text")  # images of a tool result: the user's content
        else:
            parts.extend(_block_parts([b], tr, "a user message"))
    return tools + ([{"role": "user", "content": _content(parts)}] if parts else [])


def _assistant_turn(blocks: list, tr: Translated) -> dict:
    texts, calls = [], []
    for b in blocks:
        if not isinstance(b, dict):
            raise Untranslatable("a block of an assistant message is not an object")
        kind = b.get("type")
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise Untranslatable("a tool_use block's id or name is not a string")
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": _json_text(b.get("input"))}})
        else:
            tr.drop(f"{str(kind)[:40]} blocks")
    msg: dict = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _system_text(system: Any, tr: Translated) -> str:
    parts = _block_parts(system, tr, "system")
    if any(p["type"] != "text" for p in parts):
        raise Untranslatable("system holds something other than text")
    return "\n\n".join(p["text"] for p in parts)


MESSAGES_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}


def messages_request(body: dict, model: str = "") -> Translated:
    """A Messages API request as a chat completion request."""
    tr = Translated("messages", {}, model_name(body.get("model")), body.get("stream") is True, request=body)
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        raise Untranslatable("messages is not a list")
    out: list[dict] = []
    if body.get("system") is not None:
        text = _system_text(body["system"], tr)
        if text:
            out.append({"role": "system", "content": text})
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise Untranslatable("a message is not an object of role user, assistant or system")
        content = m.get("content")
        if m["role"] == "system":  # a system turn mid-conversation (Claude Code sends them)
            out.append({"role": "system", "content": _system_text(content, tr)})
        elif isinstance(content, str):
            out.append({"role": m["role"], "content": content})
        elif not isinstance(content, list):
            raise Untranslatable("a message's content is neither a string nor a list of blocks")
        elif m["role"] == "assistant":
            out.append(_assistant_turn(content, tr))
        else:
            out.extend(_user_turn(content, tr))
    tr.body = {"model": model or body.get("model"), "messages": out}
    _common(tr, body, "max_tokens")
    if type(body.get("top_k")) is int:
        tr.body["top_k"] = body["top_k"]
    stops = body.get("stop_sequences")
    if isinstance(stops, list) and stops and all(isinstance(s, str) for s in stops):
        tr.body["stop"] = stops
    tools = []
    for t in body.get("tools") or []:
        if isinstance(t, dict) and t.get("type") in (None, "custom") and isinstance(t.get("name"), str):
            fn = {"name": t["name"], "parameters": t.get("input_schema") if isinstance(t.get("input_schema"), dict)
                  else {"type": "object", "properties": {}}}
            if isinstance(t.get("description"), str):
                fn["description"] = t["description"]
            tools.append({"type": "function", "function": fn})
        else:
            tr.drop(f"tool {str(t.get('type') if isinstance(t, dict) else t)[:60]}")
    if tools:
        tr.body["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and tools:
        kind = choice.get("type")
        if kind == "tool" and isinstance(choice.get("name"), str):
            tr.body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif kind in MESSAGES_TOOL_CHOICE:
            tr.body["tool_choice"] = MESSAGES_TOOL_CHOICE[kind]
        if choice.get("disable_parallel_tool_use") is True:
            tr.body["parallel_tool_calls"] = False
    return tr


# ------------------------------------------------------------------ Responses API -> chat
SHELL_PARAMETERS = {"type": "object", "properties": {
    "command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"},
    "timeout_ms": {"type": "integer"}, "env": {"type": "object"}}, "required": ["command"]}
CUSTOM_PARAMETERS = {"type": "object", "properties": {"input": {"type": "string", "description":
                     "the tool's input, free text in the format its description gives"}}, "required": ["input"]}


class History:
    """Translated Responses API responses, by id: the chat messages each continues with (bounded, in memory)."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[str, list[dict]] = OrderedDict()

    def get(self, rid: str) -> list[dict] | None:
        return self._items.get(rid)

    def put(self, rid: str, conversation: list[dict]) -> None:
        if self.size <= 0:
            return
        self._items[rid] = conversation
        while len(self._items) > self.size:
            self._items.popitem(last=False)


def _item_parts(content: Any, tr: Translated) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise Untranslatable("a message item's content is neither a string nor a list of parts")
    parts = []
    for p in content:
        if not isinstance(p, dict):
            raise Untranslatable("a content part is not an object")
        kind = p.get("type")
        if kind in ("input_text", "output_text", "text"):
            if not isinstance(p.get("text"), str):
                raise Untranslatable("a text part's text is not a string")
            parts.append({"type": "text", "text": p["text"]})
        elif kind == "refusal" and isinstance(p.get("refusal"), str):
            parts.append({"type": "text", "text": p["refusal"]})
        elif kind == "input_image" and isinstance(p.get("image_url"), str):
            image = {"url": p["image_url"]}
            if isinstance(p.get("detail"), str) and p["detail"] != "auto":
                image["detail"] = p["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            tr.drop(f"{str(kind)[:40]} parts")
    return parts


def _output_text(output: Any, tr: Translated) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        if any(not (isinstance(p, dict) and isinstance(p.get("text"), str)) for p in output):
            tr.drop("non-text parts of tool outputs")  # a chat tool message carries text only
        return "\n".join(p["text"] for p in output if isinstance(p, dict) and isinstance(p.get("text"), str))
    return to_json(output).decode() if output is not None else ""


def _call_of(item: dict) -> dict:
    kind = item.get("type")
    call_id = _str(item.get("call_id")) or _str(item.get("id"))
    if call_id is None:
        raise Untranslatable(f"a {kind} item has no call_id")
    if kind == "custom_tool_call":
        name, args = _str(item.get("name")), to_json({"input": _str(item.get("input")) or ""}).decode()
    elif kind == "local_shell_call":
        action = item.get("action") if isinstance(item.get("action"), dict) else {}
        name, args = "local_shell", to_json({k: v for k, v in action.items() if k != "type"}).decode()
    else:
        name, args = _str(item.get("name")), _str(item.get("arguments")) or "{}"
    if name is None:
        raise Untranslatable(f"a {kind} item's name is not a string")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _items(items: list, tr: Translated) -> list[dict]:
    out: list[dict] = []
    for item in items:
        if not isinstance(item, dict):
            raise Untranslatable("an input item is not an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise Untranslatable(f"a message item of role {str(role)[:40]!r}")
            parts = _item_parts(item.get("content"), tr)
            role = "system" if role == "developer" else role
            if role != "user" and any(p["type"] != "text" for p in parts):
                raise Untranslatable(f"an image in a {role} message")
            out.append({"role": role, "content": _content(parts) if parts else ""})
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            call = _call_of(item)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if not last["content"]:
                    last["content"] = None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
            if not isinstance(item.get("call_id"), str):
                raise Untranslatable(f"a {kind} item's call_id is not a string")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": _output_text(item.get("output"), tr)})
        else:
            tr.drop(f"{str(kind)[:40]} items")
    return out


def _responses_tools(body: dict, tr: Translated) -> list[dict]:
    tools = []
    for t in body.get("tools") or []:
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "function" and isinstance(t.get("name"), str):
            fn = {"name": t["name"], "parameters": t.get("parameters") if isinstance(t.get("parameters"), dict)
                  else {"type": "object", "properties": {}}}
        elif kind == "custom" and isinstance(t.get("name"), str):
            tr.custom_tools.add(t["name"])
            fn = {"name": t["name"], "parameters": CUSTOM_PARAMETERS}
            fmt = t.get("format")
            if isinstance(fmt, dict) and isinstance(fmt.get("definition"), str):
                t = {**t, "description": f"{t.get('description') or ''}\nInput format "
                     f"({fmt.get('syntax') or 'grammar'}):\n{fmt['definition']}".strip()}
        elif kind == "local_shell":
            tr.shell_tools.add("local_shell")
            fn = {"name": "local_shell", "description": "Run a command in the local shell.",
                  "parameters": SHELL_PARAMETERS}
        else:
            tr.drop(f"tool {str(kind)[:60]}")
            continue
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        tools.append({"type": "function", "function": fn})
    return tools


def responses_request(body: dict, history: History | None = None, model: str = "") -> Translated:
    """A Responses API request as a chat completion request (previous_response_id expanded from `history`)."""
    tr = Translated("responses", {}, model_name(body.get("model")), body.get("stream") is True, request=body)
    head: list[dict] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        head.append({"role": "system", "content": instructions})
    elif isinstance(instructions, list):
        head.extend(_items(instructions, tr))
    elif instructions is not None and not isinstance(instructions, str):
        raise Untranslatable("instructions is neither a string nor a list of items")
    conversation: list[dict] = []
    prev = body.get("previous_response_id")
    if prev is not None:
        earlier = history.get(prev) if isinstance(prev, str) and history is not None else None
        if earlier is None:
            raise Untranslatable(f"previous response {str(prev)[:80]!r} is not one this proxy translated and still "
                                 "keeps (proxy.translate_history): send the whole conversation as input",
                                 "previous_response_not_found")
        conversation.extend(earlier)
    inp = body.get("input")
    if isinstance(inp, str):
        conversation.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        conversation.extend(_items(inp, tr))
    elif inp is not None:
        raise Untranslatable("input is neither a string nor a list of items")
    tr.conversation = conversation
    tr.body = {"model": model or body.get("model"), "messages": _merge_system(head + conversation)}
    _common(tr, body, "max_output_tokens")
    tools = _responses_tools(body, tr)
    if tools:
        tr.body["tools"] = tools
        choice = body.get("tool_choice")
        if choice in ("auto", "none", "required"):
            tr.body["tool_choice"] = choice
        elif isinstance(choice, dict) and isinstance(choice.get("name"), str) and choice.get("type") in (
                "function", "custom"):
            tr.body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        if isinstance(body.get("parallel_tool_calls"), bool):
            tr.body["parallel_tool_calls"] = body["parallel_tool_calls"]
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        tr.body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": _str(fmt.get("name")) or "response", "schema": fmt["schema"],
            **({"strict": fmt["strict"]} if isinstance(fmt.get("strict"), bool) else {})}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        tr.body["response_format"] = {"type": "json_object"}
    if "message.output_text.logprobs" in (body.get("include") or []):
        tr.body["logprobs"] = True
        if type(body.get("top_logprobs")) is int:
            tr.body["top_logprobs"] = body["top_logprobs"]
    if isinstance(body.get("user"), str):
        tr.body["user"] = body["user"]
    return tr


# ------------------------------------------------------------------ chat reply -> client's API
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}


def _tool_input(call: dict, tr: Translated) -> dict:
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


def _calls(part: dict) -> list[dict]:
    """The chat reply's tool calls, each with a string id, name and arguments."""
    out = []
    for i, c in enumerate(part.get("tool_calls") or []):
        fn = c.get("function") if isinstance(c, dict) and isinstance(c.get("function"), dict) else {}
        out.append({"id": _str(c.get("id")) if isinstance(c, dict) and c.get("id") else f"call_{i}",
                    "function": {"name": _str(fn.get("name")) or "", "arguments": _str(fn.get("arguments")) or ""}})
    return out


def _counts(usage: Any) -> tuple[int, int, int]:
    """(prompt, completion, cached prompt) tokens of a chat usage (0 where it says nothing)."""
    usage = usage_of(usage)[0] or {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    pt, ct = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    cached = cached if type(cached) is int and 0 <= cached <= pt else 0
    return pt, ct, cached


def messages_usage(usage: Any) -> dict:
    pt, ct, cached = _counts(usage)
    return {"input_tokens": pt - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": ct}


def messages_stop_reason(finish: Any, calls: list) -> str:
    if calls and finish in (None, "stop", "tool_calls", "function_call"):
        return "tool_use"
    return STOP_REASONS.get(finish, "end_turn")


def _tool_use_block(call: dict, tr: Translated) -> dict:
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": _tool_input(call, tr)}


def chat_to_messages(part: dict, tr: Translated, mid: str) -> dict:
    """A chat reply (its recorded part) as a Messages API response."""
    blocks: list[dict] = []
    if part.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": part["reasoning_content"], "signature": ""})
    if isinstance(part.get("content"), str) and part["content"]:
        blocks.append({"type": "text", "text": part["content"]})
    calls = _calls(part)
    blocks.extend(_tool_use_block(c, tr) for c in calls)
    return {"id": mid, "type": "message", "role": "assistant", "model": part.get("model") or tr.client_model,
            "content": blocks, "stop_reason": messages_stop_reason(part.get("finish_reason"), calls),
            "stop_sequence": None, "usage": messages_usage(part.get("usage"))}


def responses_usage(usage: Any, reasoning_tokens: int = 0) -> dict:
    pt, ct, cached = _counts(usage)
    return {"input_tokens": pt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": ct,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens}, "total_tokens": pt + ct}


def _status(finish: Any) -> tuple[str, dict | None]:
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _call_item(call: dict, tr: Translated) -> dict:
    name = call["function"]["name"]
    if name in tr.custom_tools:
        return {"type": "custom_tool_call", "id": new_id("ctc_"), "call_id": call["id"], "name": name,
                "input": _str(_tool_input(call, tr).get("input")) or "", "status": "completed"}
    if name in tr.shell_tools:
        return {"type": "local_shell_call", "id": new_id("lsh_"), "call_id": call["id"], "status": "completed",
                "action": {"type": "exec", **_tool_input(call, tr)}}
    return {"type": "function_call", "id": new_id("fc_"), "call_id": call["id"], "name": name,
            "arguments": call["function"]["arguments"], "status": "completed"}


def _text_part(text: str, logprobs: Any = None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": []}
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        part["logprobs"] = [lp for lp in logprobs["content"] if isinstance(lp, dict)]
    return part


def _reasoning_item(text: str, rid: str | None = None) -> dict:
    return {"type": "reasoning", "id": rid or new_id("rs_"), "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def _message_item(text: str, mid: str | None = None, logprobs: Any = None) -> dict:
    return {"type": "message", "id": mid or new_id("msg_"), "status": "completed", "role": "assistant",
            "content": [_text_part(text, logprobs)]}


def responses_body(tr: Translated, rid: str, output: list[dict], finish: Any, usage: Any, model: Any) -> dict:
    status, incomplete = _status(finish)
    req = tr.request
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status,
            "model": model_name(model) or tr.client_model, "output": output, "error": None,
            "incomplete_details": incomplete, "instructions": req.get("instructions"),
            "parallel_tool_calls": req.get("parallel_tool_calls", True), "tool_choice": req.get("tool_choice", "auto"),
            "tools": req.get("tools") or [], "previous_response_id": req.get("previous_response_id"),
            "temperature": req.get("temperature"), "top_p": req.get("top_p"),
            "max_output_tokens": req.get("max_output_tokens"), "metadata": req.get("metadata") or {},
            "store": req.get("store", True), "text": req.get("text") or {"format": {"type": "text"}},
            "usage": responses_usage(usage)}


def chat_to_responses(part: dict, tr: Translated, rid: str) -> dict:
    """A chat reply (its recorded part) as a Responses API response."""
    output: list[dict] = []
    if part.get("reasoning_content"):
        output.append(_reasoning_item(part["reasoning_content"]))
    calls = _calls(part)
    text = part.get("content") if isinstance(part.get("content"), str) else ""
    if text or not calls:
        output.append(_message_item(text, logprobs=part.get("logprobs") if "logprobs" in tr.body else None))
    output.extend(_call_item(c, tr) for c in calls)
    return responses_body(tr, rid, output, part.get("finish_reason"), part.get("usage"), part.get("model"))


def assistant_message(part: dict) -> dict:
    """The chat reply as the assistant message a later call's conversation continues with (previous_response_id)."""
    calls = _calls(part)
    msg: dict = {"role": "assistant", "content": part.get("content") if isinstance(part.get("content"), str) else None}
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "type": "function", "function": c["function"]} for c in calls]
    elif msg["content"] is None:
        msg["content"] = ""
    return msg


def anthropic_error(status: int, message: str) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


# ------------------------------------------------------------------ chat stream -> client's event stream
def _sse(kind: str, data: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + to_json({"type": kind, **data}) + b"\n\n"


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
        if b'"error"' in raw and not self.upstream_error:
            data = b"\n".join(line[5:].lstrip() for line in raw.splitlines() if line.startswith(b"data:"))
            try:
                obj = loads(data)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and obj.get("error") is not None and obj.get("choices") is None:
                err = obj["error"]
                self.upstream_error = str(err.get("message") if isinstance(err, dict) else err)[:300]
                return
        super()._event(raw)
        if self.events and not self.failed and not self.closed:
            self._begin()  # the client's stream starts with the upstream's first chunk (its model is known)

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


class MessagesStream(ChatStream):
    def __init__(self, started: float, tr: Translated, error_event, rid: str):
        super().__init__(started, tr, error_event, rid)
        self.index = -1
        self.open: str | None = None  # the kind of the block being streamed

    def on_start(self) -> None:
        msg = {"id": self.rid, "type": "message", "role": "assistant", "model": self.model or self.tr.client_model,
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                         "output_tokens": 0}}
        self.out.append(_sse("message_start", {"message": msg}))

    def _block(self, kind: str, start: dict) -> None:
        if self.open == kind:
            return
        self._close()
        self.index += 1
        self.open = kind
        self.out.append(_sse("content_block_start", {"index": self.index, "content_block": start}))

    def _close(self) -> None:
        if self.open is not None:
            self.out.append(_sse("content_block_stop", {"index": self.index}))
            self.open = None

    def on_text(self, piece: str) -> None:
        self._block("text", {"type": "text", "text": ""})
        self.out.append(_sse("content_block_delta", {"index": self.index, "delta": {"type": "text_delta",
                                                                                   "text": piece}}))

    def on_reasoning(self, piece: str) -> None:
        self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        self.out.append(_sse("content_block_delta", {"index": self.index, "delta": {"type": "thinking_delta",
                                                                                   "thinking": piece}}))

    def on_finish(self, part: dict) -> None:
        self._close()
        calls = _calls(part)
        for c in calls:
            block = _tool_use_block(c, self.tr)
            self.index += 1
            self.out.append(_sse("content_block_start", {"index": self.index, "content_block": {**block, "input": {}}}))
            self.out.append(_sse("content_block_delta", {"index": self.index, "delta": {
                "type": "input_json_delta", "partial_json": to_json(block["input"]).decode()}}))
            self.out.append(_sse("content_block_stop", {"index": self.index}))
        self.out.append(_sse("message_delta", {"delta": {"stop_reason": messages_stop_reason(part.get("finish_reason"),
                                                                                             calls),
                                                         "stop_sequence": None},
                                               "usage": messages_usage(part.get("usage"))}))
        self.out.append(_sse("message_stop", {}))


class ResponsesStream(ChatStream):
    def __init__(self, started: float, tr: Translated, error_event, rid: str):
        super().__init__(started, tr, error_event, rid)
        self.seq = 0
        self.items: list[dict] = []  # the output items sent, complete
        self.open: dict | None = None  # the item being streamed: {"kind", "id", "text"}

    def _ev(self, kind: str, **data) -> None:
        self.out.append(_sse(kind, {**data, "sequence_number": self.seq}))
        self.seq += 1

    def _skeleton(self) -> dict:
        body = responses_body(self.tr, self.rid, [], None, None, self.model)
        return {**body, "status": "in_progress", "usage": None}

    def on_start(self) -> None:
        self._ev("response.created", response=self._skeleton())
        self._ev("response.in_progress", response=self._skeleton())

    def _item(self, kind: str) -> dict:
        if self.open is not None and self.open["kind"] == kind:
            return self.open
        self._close()
        i = len(self.items)
        if kind == "message":
            iid = new_id("msg_")
            self._ev("response.output_item.added", output_index=i, item={
                "type": "message", "id": iid, "status": "in_progress", "role": "assistant", "content": []})
            self._ev("response.content_part.added", item_id=iid, output_index=i, content_index=0,
                     part=_text_part(""))
        else:
            iid = new_id("rs_")
            self._ev("response.output_item.added", output_index=i, item={"type": "reasoning", "id": iid,
                                                                          "summary": [], "content": []})
        self.open = {"kind": kind, "id": iid, "text": [], "index": i}
        return self.open

    def _close(self) -> None:
        o = self.open
        if o is None:
            return
        self.open = None
        text, i, iid = "".join(o["text"]), o["index"], o["id"]
        if o["kind"] == "message":
            self._ev("response.output_text.done", item_id=iid, output_index=i, content_index=0, text=text,
                     logprobs=[])
            self._ev("response.content_part.done", item_id=iid, output_index=i, content_index=0,
                     part=_text_part(text))
            item = _message_item(text, iid)
        else:
            self._ev("response.reasoning_text.done", item_id=iid, output_index=i, content_index=0, text=text)
            item = _reasoning_item(text, iid)
        self._ev("response.output_item.done", output_index=i, item=item)
        self.items.append(item)

    def on_text(self, piece: str) -> None:
        o = self._item("message")
        o["text"].append(piece)
        self._ev("response.output_text.delta", item_id=o["id"], output_index=o["index"], content_index=0,
                 delta=piece, logprobs=[])

    def on_reasoning(self, piece: str) -> None:
        o = self._item("reasoning")
        o["text"].append(piece)
        self._ev("response.reasoning_text.delta", item_id=o["id"], output_index=o["index"], content_index=0,
                 delta=piece)

    def on_finish(self, part: dict) -> None:
        calls = _calls(part)
        if not calls and not any(i["type"] == "message" for i in self.items) and (
                self.open is None or self.open["kind"] != "message"):
            self._item("message")  # a reply with neither text nor tool calls is one empty message
        self._close()
        for c in calls:
            item = _call_item(c, self.tr)
            i = len(self.items)
            iid = item["id"]
            if item["type"] == "function_call":
                self._ev("response.output_item.added", output_index=i, item={**item, "arguments": "",
                                                                              "status": "in_progress"})
                self._ev("response.function_call_arguments.delta", item_id=iid, output_index=i,
                         delta=item["arguments"])
                self._ev("response.function_call_arguments.done", item_id=iid, output_index=i,
                         arguments=item["arguments"], name=item["name"])
            elif item["type"] == "custom_tool_call":
                self._ev("response.output_item.added", output_index=i, item={**item, "input": "",
                                                                              "status": "in_progress"})
                self._ev("response.custom_tool_call_input.delta", item_id=iid, output_index=i, delta=item["input"])
                self._ev("response.custom_tool_call_input.done", item_id=iid, output_index=i, input=item["input"])
            else:
                self._ev("response.output_item.added", output_index=i, item={**item, "status": "in_progress"})
            self._ev("response.output_item.done", output_index=i, item=item)
            self.items.append(item)
        body = responses_body(self.tr, self.rid, self.items, part.get("finish_reason"), part.get("usage"),
                              part.get("model"))
        self._ev("response.completed" if body["status"] == "completed" else "response.incomplete", response=body)
