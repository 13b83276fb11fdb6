"""The scripted agent upstream's Responses API and Messages API (testing/agent_upstream.py serves them): replies
and SSE event sequences in the shapes OpenAI's and Anthropic's endpoints send, so the real openai and anthropic
SDKs parse them.

Script (both APIs, as for chat): a request with tools whose last user text contains CALL_TOOLS gets a reasoning
or thinking part, then two tool calls (get_weather for Paris and for Oslo); after tool results it answers
"It is sunny in Paris and cold in Oslo."; anything else is echoed ("Echo: <last user text>", with
" [N image(s)]" when the last user turn carried images).

The agent CLIs' script (`shell_call`, `cli_answer`; chat upstreams use it too, testing/chat_upstream.py): a
request whose last user text asks to run CLI_COMMAND and that offers a shell tool (Claude Code's Bash, Codex's
shell / shell_command / exec_command) gets one call of that tool running CLI_COMMAND, in the arguments that tool
takes; after its result the answer is "The command printed CLI_MARKER." when the result shows the marker (the
CLI really ran it), else "The command failed: <result>".
"""

from __future__ import annotations

import json

ANSWER = "It is sunny in Paris and cold in Oslo."
CITIES = ("Paris", "Oslo")


def _sse(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def _pieces(text: str, n: int = 5) -> list[str]:
    return [text[i:i + n] for i in range(0, len(text), n)] or [""]


def _tokens(obj) -> int:
    return max(1, len(json.dumps(obj)) // 4)


# ------------------------------------------------------------------ the agent CLIs' script
CLI_MARKER = "evolforge-ok"
CLI_COMMAND = f"echo {CLI_MARKER}"
CLI_PROMPT = f"Run the shell command `{CLI_COMMAND}` and tell me what it printed."
SHELL_ARGUMENTS = {  # each CLI's shell tool, and its arguments for running CLI_COMMAND
    "Bash": {"command": CLI_COMMAND, "description": "Print the marker"},  # Claude Code
    "shell": {"command": ["bash", "-lc", CLI_COMMAND]},  # Codex
    "shell_command": {"command": CLI_COMMAND},  # Codex
    "exec_command": {"cmd": CLI_COMMAND},  # Codex (unified exec)
}


def tool_names(tools) -> list[str]:
    """The names of the tools a request offers, in any of the three APIs' forms."""
    names = []
    for t in tools if isinstance(tools, list) else ():
        if isinstance(t, dict):
            fn = t.get("function") if isinstance(t.get("function"), dict) else t
            if isinstance(fn.get("name"), str):
                names.append(fn["name"])
    return names


def shell_call(tools, last_user_text: str) -> tuple[str, dict] | None:
    """(tool name, arguments) of the shell call the CLI script makes, or None when it makes none."""
    if CLI_COMMAND not in last_user_text:
        return None
    name = next((n for n in SHELL_ARGUMENTS if n in tool_names(tools)), None)
    return (name, SHELL_ARGUMENTS[name]) if name else None


def cli_answer(tool_output: str) -> str:
    if CLI_MARKER in tool_output:
        return f"The command printed {CLI_MARKER}."
    return f"The command failed: {tool_output[:200]}"


def is_cli_conversation(body: dict) -> bool:
    return CLI_COMMAND in json.dumps(body)


# ------------------------------------------------------------------ Responses API
def _responses_last(body: dict) -> tuple[str, str, int]:
    """(kind of the last input item: user | tool_output, its text, images in it)."""
    inp = body.get("input")
    if isinstance(inp, str):
        return "user", inp, 0
    items = inp if isinstance(inp, list) else []
    last = items[-1] if items else {}
    if last.get("type") in ("function_call_output", "custom_tool_call_output"):
        out = last.get("output")
        if isinstance(out, list):
            out = " ".join(str(p.get("text", "")) for p in out if isinstance(p, dict))
        return "tool_output", str(out), 0
    content = last.get("content")
    if isinstance(content, str):
        return "user", content, 0
    parts = content if isinstance(content, list) else []
    text = " ".join(p.get("text", "") for p in parts if p.get("type") in ("input_text", "text"))
    return "user", text, sum(p.get("type") == "input_image" for p in parts)


def responses_output(body: dict) -> list[dict]:
    kind, text, images = _responses_last(body)
    shell = shell_call(body.get("tools"), text) if kind == "user" else None
    if shell:
        return [{"type": "function_call", "id": "fc_shell", "call_id": "call_shell", "name": shell[0],
                 "arguments": json.dumps(shell[1]), "status": "completed"}]
    if kind == "tool_output" and is_cli_conversation(body):
        return [{"type": "message", "id": "msg_0", "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": cli_answer(text), "annotations": []}]}]
    if kind == "user" and body.get("tools") and "CALL_TOOLS" in text:
        out = [{"type": "reasoning", "id": "rs_0", "summary": [{"type": "summary_text",
                                                                "text": "The user wants two cities."}]}]
        for i, city in enumerate(CITIES):
            out.append({"type": "function_call", "id": f"fc_{i}", "call_id": f"call_{i}", "name": "get_weather",
                        "arguments": json.dumps({"city": city}), "status": "completed"})
        return out
    reply = ANSWER if kind == "tool_output" else f"Echo: {text[:60]}" + (f" [{images} image(s)]" if images else "")
    part = {"type": "output_text", "text": reply, "annotations": []}
    if "message.output_text.logprobs" in (body.get("include") or []):
        part["logprobs"] = _char_logprobs(reply)
    return [{"type": "message", "id": "msg_0", "status": "completed", "role": "assistant", "content": [part]}]


def _char_logprobs(text: str) -> list[dict]:
    """One logprob per character (the scripted upstream's tokens are characters)."""
    return [{"token": c, "logprob": -0.5, "bytes": list(c.encode()), "top_logprobs": []} for c in text]


def responses_body(body: dict, rid: str) -> dict:
    output = responses_output(body)
    it, ot = _tokens(body.get("input")) + _tokens(body.get("instructions") or ""), _tokens(output)
    return {"id": rid, "object": "response", "created_at": 1, "status": "completed", "model": body.get("model"),
            "output": output, "parallel_tool_calls": True, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "previous_response_id": body.get("previous_response_id"),
            "instructions": body.get("instructions"), "error": None, "incomplete_details": None,
            "usage": {"input_tokens": it, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": ot,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": it + ot}}


def responses_events(body: dict, rid: str) -> list[bytes]:
    full = responses_body(body, rid)
    seq = iter(range(10_000))
    ev = lambda kind, **d: _sse(kind, {**d, "sequence_number": next(seq)})  # noqa: E731
    start = {**full, "status": "in_progress", "output": [], "usage": None}
    out = [ev("response.created", response=start), ev("response.in_progress", response=start)]
    for i, item in enumerate(full["output"]):
        kind = item["type"]
        if kind == "message":
            text = item["content"][0]["text"]
            out.append(ev("response.output_item.added", output_index=i, item={**item, "status": "in_progress",
                                                                               "content": []}))
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(ev("response.content_part.added", item_id=item["id"], output_index=i, content_index=0, part=part))
            with_lp = "logprobs" in item["content"][0]
            for p in _pieces(text):
                out.append(ev("response.output_text.delta", item_id=item["id"], output_index=i, content_index=0,
                              delta=p, logprobs=_char_logprobs(p) if with_lp else []))
            out.append(ev("response.output_text.done", item_id=item["id"], output_index=i, content_index=0, text=text,
                          logprobs=[]))
            out.append(ev("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                          part={**part, "text": text}))
        elif kind == "function_call":
            out.append(ev("response.output_item.added", output_index=i, item={**item, "arguments": "",
                                                                               "status": "in_progress"}))
            for p in _pieces(item["arguments"]):
                out.append(ev("response.function_call_arguments.delta", item_id=item["id"], output_index=i, delta=p))
            out.append(ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                          arguments=item["arguments"], name=item["name"]))
        elif kind == "reasoning":
            text = item["summary"][0]["text"]
            out.append(ev("response.output_item.added", output_index=i, item={**item, "summary": []}))
            for p in _pieces(text):
                out.append(ev("response.reasoning_summary_text.delta", item_id=item["id"], output_index=i,
                              summary_index=0, delta=p))
        out.append(ev("response.output_item.done", output_index=i, item=item))
    out.append(ev("response.completed", response=full))
    return out


# ------------------------------------------------------------------ Messages API
def _messages_last(body: dict) -> tuple[str, str, int]:
    msgs = [m for m in body.get("messages") or [] if m.get("role") != "system"]  # Claude Code's system turns
    last = msgs[-1] if msgs else {}
    content = last.get("content")
    if isinstance(content, str):
        return "user", content, 0
    blocks = content if isinstance(content, list) else []
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if results:
        inner = [r.get("content") for r in results]
        text = " ".join(c if isinstance(c, str) else " ".join(str(x.get("text", "")) for x in c if isinstance(x, dict))
                        for c in inner if isinstance(c, (str, list)))
        return "tool_output", text, 0
    text = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    return "user", text, sum(b.get("type") == "image" for b in blocks)


def messages_content(body: dict) -> tuple[list[dict], str]:
    kind, text, images = _messages_last(body)
    shell = shell_call(body.get("tools"), text) if kind == "user" else None
    if shell:
        return [{"type": "text", "text": "Running it."},
                {"type": "tool_use", "id": "toolu_shell", "name": shell[0], "input": shell[1]}], "tool_use"
    if kind == "tool_output" and is_cli_conversation(body):
        return [{"type": "text", "text": cli_answer(text)}], "end_turn"
    if kind == "user" and body.get("tools") and "CALL_TOOLS" in text:
        blocks = [{"type": "thinking", "thinking": "The user wants two cities.", "signature": "sig-0"},
                  {"type": "text", "text": "Checking both."}]
        for i, city in enumerate(CITIES):
            blocks.append({"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather", "input": {"city": city}})
        return blocks, "tool_use"
    reply = ANSWER if kind == "tool_output" else f"Echo: {text[:60]}" + (f" [{images} image(s)]" if images else "")
    return [{"type": "text", "text": reply}], "end_turn"


def messages_body(body: dict, mid: str) -> dict:
    blocks, stop = messages_content(body)
    return {"id": mid, "type": "message", "role": "assistant", "model": body.get("model"), "content": blocks,
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": _tokens([body.get("system"), body.get("messages")]),
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 2, "output_tokens": _tokens(blocks)}}


def messages_events(body: dict, mid: str) -> list[bytes]:
    full = messages_body(body, mid)
    usage = full["usage"]
    start = {**full, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    out = [_sse("message_start", {"message": start}), _sse("ping", {})]
    for i, b in enumerate(full["content"]):
        kind = b["type"]
        if kind == "text":
            out.append(_sse("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}))
            out += [_sse("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": p}})
                    for p in _pieces(b["text"])]
        elif kind == "thinking":
            out.append(_sse("content_block_start", {"index": i, "content_block": {"type": "thinking", "thinking": "",
                                                                                  "signature": ""}}))
            out += [_sse("content_block_delta", {"index": i, "delta": {"type": "thinking_delta", "thinking": p}})
                    for p in _pieces(b["thinking"])]
            out.append(_sse("content_block_delta", {"index": i, "delta": {"type": "signature_delta",
                                                                          "signature": b["signature"]}}))
        elif kind == "tool_use":
            out.append(_sse("content_block_start", {"index": i, "content_block": {**b, "input": {}}}))
            out += [_sse("content_block_delta", {"index": i, "delta": {"type": "input_json_delta", "partial_json": p}})
                    for p in _pieces(json.dumps(b["input"]), 4)]
        out.append(_sse("content_block_stop", {"index": i}))
    out.append(_sse("message_delta", {"delta": {"stop_reason": full["stop_reason"], "stop_sequence": None},
                                      "usage": {"output_tokens": usage["output_tokens"]}}))
    out.append(_sse("message_stop", {}))
    return out


def count_tokens(body: dict) -> dict:
    return {"input_tokens": _tokens([body.get("system"), body.get("messages")])}
