"""Messages API (Anthropic's) calls made as chat completions for a chat-only upstream (`proxy.translate`), and
the chat reply or stream turned back into a Messages answer (the shared part: translate.py).

- Request (`messages_request`): `system` (a string or text blocks) is the system message, as are messages of role
  system (Claude Code sends them mid-conversation); user text and image blocks (base64 or url sources, as data: /
  http URLs) are the user's content; `tool_result` blocks become `tool` messages (before the user's other content
  in that turn; images in a tool result go to the user's content after them); assistant text and `tool_use`
  blocks become the assistant's content and `tool_calls` (input as a JSON string). Tools (`input_schema`) become
  function tools; `tool_choice` auto / any / tool / none becomes auto / required / the function / none;
  `disable_parallel_tool_use` becomes `parallel_tool_calls: false`; max_tokens, temperature, top_p, top_k,
  stop_sequences (`stop`), stream.
- Reply (`chat_to_messages`): reasoning_content becomes a thinking block, content a text block, tool calls
  tool_use blocks; finish_reason stop / length / tool_calls / content_filter becomes end_turn / max_tokens /
  tool_use / refusal; usage is the API's own (input_tokens without the cached prompt tokens,
  cache_read_input_tokens those). `anthropic_error`: an error in the API's form.
- Stream (`MessagesStream`): message_start, content blocks as the chat deltas come, the tool_use blocks at the
  end, then message_delta (stop reason, usage) and message_stop.
"""

from __future__ import annotations

from typing import Any

from evolforge.tasks.proxy.recording import model_name
from evolforge.tasks.proxy.translate import (
    ChatStream,
    Translated,
    Untranslatable,
    calls_of,
    chat_content,
    common_parameters,
    event,
    json_text,
    to_json,
    tool_input,
    usage_counts,
)


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
    return tools + ([{"role": "user", "content": chat_content(parts)}] if parts else [])


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
                          "function": {"name": b["name"], "arguments": json_text(b.get("input"))}})
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
    common_parameters(tr, body, "max_tokens")
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


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}


def messages_usage(usage: Any) -> dict:
    pt, ct, cached = usage_counts(usage)
    return {"input_tokens": pt - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": ct}


def messages_stop_reason(finish: Any, calls: list) -> str:
    if calls and finish in (None, "stop", "tool_calls", "function_call"):
        return "tool_use"
    return STOP_REASONS.get(finish, "end_turn")


def _tool_use_block(call: dict, tr: Translated) -> dict:
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": tool_input(call, tr)}


def chat_to_messages(part: dict, tr: Translated, mid: str) -> dict:
    """A chat reply (its recorded part) as a Messages API response."""
    blocks: list[dict] = []
    if part.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": part["reasoning_content"], "signature": ""})
    if isinstance(part.get("content"), str) and part["content"]:
        blocks.append({"type": "text", "text": part["content"]})
    calls = calls_of(part)
    blocks.extend(_tool_use_block(c, tr) for c in calls)
    return {"id": mid, "type": "message", "role": "assistant", "model": part.get("model") or tr.client_model,
            "content": blocks, "stop_reason": messages_stop_reason(part.get("finish_reason"), calls),
            "stop_sequence": None, "usage": messages_usage(part.get("usage"))}


def anthropic_error(status: int, message: str) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


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
        self.out.append(event("message_start", {"message": msg}))

    def _block(self, kind: str, start: dict) -> None:
        if self.open == kind:
            return
        self._close()
        self.index += 1
        self.open = kind
        self.out.append(event("content_block_start", {"index": self.index, "content_block": start}))

    def _close(self) -> None:
        if self.open is not None:
            self.out.append(event("content_block_stop", {"index": self.index}))
            self.open = None

    def on_text(self, piece: str) -> None:
        self._block("text", {"type": "text", "text": ""})
        self.out.append(event("content_block_delta", {"index": self.index, "delta": {"type": "text_delta",
                                                                                   "text": piece}}))

    def on_reasoning(self, piece: str) -> None:
        self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        self.out.append(event("content_block_delta", {"index": self.index, "delta": {"type": "thinking_delta",
                                                                                   "thinking": piece}}))

    def on_finish(self, part: dict) -> None:
        self._close()
        calls = calls_of(part)
        for c in calls:
            block = _tool_use_block(c, self.tr)
            self.index += 1
            self.out.append(event("content_block_start", {"index": self.index, "content_block": {**block, "input": {}}}))
            self.out.append(event("content_block_delta", {"index": self.index, "delta": {
                "type": "input_json_delta", "partial_json": to_json(block["input"]).decode()}}))
            self.out.append(event("content_block_stop", {"index": self.index}))
        self.out.append(event("message_delta", {"delta": {"stop_reason": messages_stop_reason(part.get("finish_reason"),
                                                                                             calls),
                                                         "stop_sequence": None},
                                               "usage": messages_usage(part.get("usage"))}))
        self.out.append(event("message_stop", {}))
