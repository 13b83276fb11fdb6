"""Recorded requests of the three wire APIs as one message form: the OpenAI chat form that sft.jsonl and the
transitions use (TRL's conversational form), with images kept as TRL multimodal parts.

- `content_of(content)`: a message content as text, or, when it carries images, TRL's multimodal parts
  (`[{"type": "text", "text"}, {"type": "image", "image": URL or data URL}]`); other parts (audio, files) are
  left out and counted.
- `chat_prompt(request)`: a chat call's `messages`.
- `responses_prompt(request, history)`: a Responses API call's `instructions` (a system turn) and `input` items
  in order: messages (developer -> system), `reasoning` items (the next assistant turn's `reasoning_content`),
  `function_call` items (the assistant turn's `tool_calls`, id = call_id), `function_call_output` items (role
  `tool` turns; Codex's `custom_tool_call` / `local_shell_call` items and their outputs too, a custom tool's raw
  input or the shell action as the arguments string). With `previous_response_id`, `history` (the prompt and response of that earlier call of the
  session) comes first, as the API does.
- `messages_prompt(request)`: a Messages API call's `system` and `messages`: text, image, `thinking` (the
  assistant turn's `reasoning_content`), `tool_use` (`tool_calls`, input as a JSON string) and `tool_result`
  (role `tool` turns, before the rest of that user turn).
Each returns (messages, Parts counts) or raises ValueError when the request holds no usable turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from evolforge.tasks.proxy.wires import TOOL_CALL_ITEMS, TOOL_OUTPUT_ITEMS, tool_call_arguments, tool_call_name


@dataclass
class Parts:
    dropped: int = 0        # non-text parts left out (audio, files, unknown items)
    images: int = 0         # image parts kept


def _image_url(part: dict) -> str | None:
    """The URL (or data URL) of an image part of any of the three APIs, or None."""
    kind = part.get("type")
    if kind == "image_url":  # chat
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return url if isinstance(url, str) else None
    if kind == "input_image":  # Responses
        url = part.get("image_url") or (f"file_id:{part['file_id']}" if isinstance(part.get("file_id"), str) else None)
        return url if isinstance(url, str) else None
    if kind == "image":  # Messages (or TRL's own form)
        src = part.get("source")
        if isinstance(src, dict):
            if src.get("type") == "base64" and isinstance(src.get("data"), str):
                return f"data:{src.get('media_type') or 'image/png'};base64,{src['data']}"
            if isinstance(src.get("url"), str):
                return src["url"]
            if isinstance(src.get("file_id"), str):
                return f"file_id:{src['file_id']}"
        if isinstance(part.get("image"), str):
            return part["image"]
    return None


TEXT_PARTS = ("text", "input_text", "output_text")


def content_of(content, counts: Parts) -> str | list[dict]:
    """Text, or TRL multimodal parts when the content carries images (see the module doc)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return str(content)
    parts: list[dict] = []
    for part in content:
        if isinstance(part, str):
            parts.append({"type": "text", "text": part})
        elif isinstance(part, dict) and part.get("type") in TEXT_PARTS:
            text = part.get("text")
            parts.append({"type": "text", "text": text if isinstance(text, str) else "" if text is None
                          else json.dumps(text, ensure_ascii=False)})
        elif isinstance(part, dict) and _image_url(part) is not None:
            parts.append({"type": "image", "image": _image_url(part)})
            counts.images += 1
        else:
            counts.dropped += 1
    if not any(p["type"] == "image" for p in parts):
        return "".join(p["text"] for p in parts)
    merged: list[dict] = []
    for p in parts:  # neighbouring text parts become one
        if p["type"] == "text" and merged and merged[-1]["type"] == "text":
            merged[-1] = {"type": "text", "text": merged[-1]["text"] + p["text"]}
        else:
            merged.append(p)
    return merged


def _s(value) -> str:
    return value if isinstance(value, str) else ""


def _args(value) -> str:
    if value is None:
        return "{}"
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _call(call_id, name, arguments, i: int) -> dict:
    return {"id": call_id if isinstance(call_id, str) and call_id else f"call_{i}", "type": "function",
            "function": {"name": name if isinstance(name, str) else "", "arguments": _args(arguments)}}


class _Builder:
    """Appends turns; tool calls and reasoning join the assistant turn they belong to."""

    def __init__(self):
        self.messages: list[dict] = []
        self.counts = Parts()
        self.reasoning: list[str] = []
        self.calls = 0

    def turn(self, role: str, content) -> None:
        msg = {"role": role, "content": content_of(content, self.counts)}
        if role == "assistant" and self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
            self.reasoning = []
        self.messages.append(msg)

    def _assistant(self) -> dict:
        last = self.messages[-1] if self.messages else None
        if last is None or last["role"] != "assistant":
            self.turn("assistant", "")
        return self.messages[-1]

    def think(self, text) -> None:
        if isinstance(text, str) and text:
            last = self.messages[-1] if self.messages else None
            if last is not None and last["role"] == "assistant" and not last.get("tool_calls") and \
                    not last.get("content"):
                last["reasoning_content"] = (last.get("reasoning_content") or "") + text
            else:
                self.reasoning.append(text)

    def tool_call(self, call_id, name, arguments) -> None:
        msg = self._assistant()
        msg.setdefault("tool_calls", []).append(_call(call_id, name, arguments, self.calls))
        self.calls += 1

    def tool_result(self, call_id, content) -> None:
        self.messages.append({"role": "tool", "tool_call_id": str(call_id) if call_id is not None else None,
                              "content": content_of(content, self.counts)})

    def done(self) -> tuple[list[dict], Parts]:
        if not self.messages:
            raise ValueError("the request holds no turn")
        return self.messages, self.counts


def chat_prompt(request: dict) -> tuple[list[dict], Parts]:
    msgs = request.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise ValueError("a chat call whose request has no message list")
    counts = Parts()
    out = []
    for m in msgs:
        nm = {k: v for k, v in m.items() if k != "content"}
        nm["content"] = content_of(m.get("content"), counts)
        out.append(nm)
    return out, counts


def _reasoning_text(item: dict) -> str:
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "".join(_s(p.get("text")) for p in parts if isinstance(p, dict) and p.get("type") == kind)
            if text:
                return text
    return ""


def responses_prompt(request: dict, history: list[dict] | None = None) -> tuple[list[dict], Parts]:
    b = _Builder()
    instructions = request.get("instructions")
    if history:  # the earlier call's turns; this call's instructions replace that call's (as the API does)
        b.messages.extend(json.loads(json.dumps(history)))
        if isinstance(instructions, str) and instructions:
            if b.messages[0]["role"] == "system":
                b.messages[0]["content"] = instructions
            else:
                b.messages.insert(0, {"role": "system", "content": instructions})
    elif isinstance(instructions, str) and instructions:
        b.turn("system", instructions)
    inp = request.get("input")
    if isinstance(inp, str):
        b.turn("user", inp)
    elif isinstance(inp, list):
        for item in inp:
            if not isinstance(item, dict):
                b.counts.dropped += 1
                continue
            kind = item.get("type") or "message"
            if kind == "message":
                role = item.get("role")
                role = "system" if role == "developer" else role if role in ("system", "user", "assistant") else "user"
                b.turn(role, item.get("content"))
            elif kind == "reasoning":
                b.think(_reasoning_text(item))
            elif kind in TOOL_CALL_ITEMS:  # function tools, Codex's custom tools (apply_patch) and local shell
                b.tool_call(item.get("call_id") or item.get("id"), tool_call_name(item), tool_call_arguments(item))
            elif kind in TOOL_OUTPUT_ITEMS:
                b.tool_result(item.get("call_id"), item.get("output"))
            else:
                b.counts.dropped += 1
    else:
        raise ValueError("a Responses API call whose request has no input")
    return b.done()


def messages_prompt(request: dict) -> tuple[list[dict], Parts]:
    msgs = request.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise ValueError("a Messages API call whose request has no message list")
    b = _Builder()
    system = request.get("system")
    if isinstance(system, list):
        system = "".join(_s(p.get("text")) for p in system if isinstance(p, dict) and p.get("type") == "text")
    if isinstance(system, str) and system:
        b.turn("system", system)
    for m in msgs:
        role = m.get("role") if m.get("role") in ("assistant", "system") else "user"  # Claude Code's system turns
        content = m.get("content")
        if isinstance(content, str) or not isinstance(content, list):
            b.turn(role, content)
            continue
        rest: list = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "tool_result":
                b.tool_result(block.get("tool_use_id"), block.get("content"))
            elif kind == "tool_use" and role == "assistant":
                if rest:
                    b.turn("assistant", rest)
                    rest = []
                b.tool_call(block.get("id"), block.get("name"), block.get("input"))
            elif kind == "thinking" and role == "assistant":
                b.think(block.get("thinking"))
            elif kind == "redacted_thinking":
                b.counts.dropped += 1
            else:
                rest.append(block)
        if rest:
            last = b.messages[-1] if b.messages else None
            if role == "assistant" and last is not None and last["role"] == "assistant" and not last.get("content"):
                last["content"] = content_of(rest, b.counts)  # the text of a turn that began with its thinking
            else:
                b.turn(role, rest)
    return b.done()
