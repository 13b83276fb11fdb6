"""Responses API (OpenAI's) calls made as chat completions for a chat-only upstream (`proxy.translate`), and the
chat reply or stream turned back into a Responses answer (the shared part: translate.py).

- Request (`responses_request`): `instructions` is the system message, `developer` messages are system messages;
  message items (input_text, output_text, input_image parts), `function_call` / `custom_tool_call` /
  `local_shell_call` items the assistant's tool calls, their `*_output` items `tool` messages. A custom (freeform)
  tool becomes a function taking {"input": string}, Codex's `local_shell` a function of its action;
  `previous_response_id` is expanded from the responses this proxy translated before (`History`,
  `proxy.translate_history`). max_output_tokens, temperature, top_p, parallel_tool_calls, `text.format`
  (response_format), logprobs, stream.
- Reply (`chat_to_responses`): reasoning_content becomes a reasoning item, content a message item, tool calls
  function_call items (custom_tool_call with the freeform input, local_shell_call with its action, for tools the
  request declared so); finish_reason length / content_filter makes the status incomplete, else completed; usage
  is the API's own. `assistant_message`: the reply as the chat message a later call's conversation continues with.
- Stream (`ResponsesStream`): response.created and .in_progress, output items as the chat deltas come, the tool
  call items at the end, then response.completed (or response.incomplete).
"""

from __future__ import annotations

import time
from collections import OrderedDict
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
    new_id,
    to_json,
    tool_input,
    usage_counts,
)
from evolforge.tasks.proxy.translate import str_or_none as _str

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


def _merge_system(messages: list[dict]) -> list[dict]:
    """Leading system messages joined into one (many chat templates take a single system message, first)."""
    head = 0
    while head < len(messages) and messages[head]["role"] == "system" and isinstance(messages[head]["content"], str):
        head += 1
    if head <= 1:
        return messages
    return [{"role": "system", "content": "\n\n".join(m["content"] for m in messages[:head])}, *messages[head:]]


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
            out.append({"role": role, "content": chat_content(parts) if parts else ""})
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
    common_parameters(tr, body, "max_output_tokens")
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


def responses_usage(usage: Any, reasoning_tokens: int = 0) -> dict:
    pt, ct, cached = usage_counts(usage)
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
                "input": _str(tool_input(call, tr).get("input")) or "", "status": "completed"}
    if name in tr.shell_tools:
        return {"type": "local_shell_call", "id": new_id("lsh_"), "call_id": call["id"], "status": "completed",
                "action": {"type": "exec", **tool_input(call, tr)}}
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
    calls = calls_of(part)
    text = part.get("content") if isinstance(part.get("content"), str) else ""
    if text or not calls:
        output.append(_message_item(text, logprobs=part.get("logprobs") if "logprobs" in tr.body else None))
    output.extend(_call_item(c, tr) for c in calls)
    return responses_body(tr, rid, output, part.get("finish_reason"), part.get("usage"), part.get("model"))


def assistant_message(part: dict) -> dict:
    """The chat reply as the assistant message a later call's conversation continues with (previous_response_id)."""
    calls = calls_of(part)
    msg: dict = {"role": "assistant", "content": part.get("content") if isinstance(part.get("content"), str) else None}
    if calls:
        msg["tool_calls"] = [{"id": c["id"], "type": "function", "function": c["function"]} for c in calls]
    elif msg["content"] is None:
        msg["content"] = ""
    return msg


class ResponsesStream(ChatStream):
    def __init__(self, started: float, tr: Translated, error_event, rid: str):
        super().__init__(started, tr, error_event, rid)
        self.seq = 0
        self.items: list[dict] = []  # the output items sent, complete
        self.open: dict | None = None  # the item being streamed: {"kind", "id", "text"}

    def _ev(self, kind: str, **data) -> None:
        self.out.append(event(kind, {**data, "sequence_number": self.seq}))
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
        calls = calls_of(part)
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
