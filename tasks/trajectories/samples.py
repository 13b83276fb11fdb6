"""The sample kinds built from one session's records: conversations (SFT) and per-call transitions.

`build_session(records, ctx)` takes a finished session's records (in the order their calls started) and
returns its conversation candidates, its transitions and the calls it skipped, with reasons:

- Model calls are the `chat.completions`, `completions`, `responses` and `messages` routes; other routes
  (models, count_tokens, ...) are not data. Responses and Messages requests become the same OpenAI-form turns
  (wire_messages.py): tool calls and results in order, reasoning / thinking in `reasoning_content`, images
  as TRL multimodal parts (`images` in the transitions table); a Responses call with `previous_response_id`
  continues that earlier call of the session. A session that mixes APIs is built in call order.
- A failed call (HTTP status other than 200, or an error such as a stream cut before [DONE]) is skipped.
- Chat calls are split into conversations (see sessions.assign_conversations). A conversation is its last
  call's prompt messages plus that call's response, in the OpenAI form (samples.openai_message): assistant
  tool calls as `tool_calls` with JSON-string arguments, tool results as role `tool` with `tool_call_id`.
- Every successful call is a transition: its own prompt, its completion, the session's reward.
- Completions-route calls are transitions only (prompt_text / completion_text): they have no messages.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from evolforge.tasks.text.chat import text_and_images, tool_call
from evolforge.tasks.trajectories.sessions import Reward, assign_conversations, message_key
from evolforge.tasks.trajectories.wire_messages import chat_prompt, messages_prompt, responses_prompt

MODEL_ROUTES = ("chat.completions", "completions", "responses", "messages")
MESSAGE_ROUTES = ("chat.completions", "responses", "messages")  # calls with turns (the others have a prompt text)


def text_of(content) -> tuple[str, int]:
    """A message content as text, and how many non-text parts (images, audio) were left out."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if isinstance(content, list):
        texts, dropped = [], 0
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text") or ""))
            elif isinstance(part, str):
                texts.append(part)
            else:
                dropped += 1
        return "".join(texts), dropped
    return str(content), 0


def openai_message(m: dict) -> tuple[dict, int]:
    """A recorded message in the OpenAI form (only the keys that apply), and its non-text parts left out. A
    content of TRL multimodal parts (text and image, from wire_messages.content_of) is kept as it is."""
    role = m.get("role") or "user"
    if isinstance(m.get("content"), list) and all(isinstance(p, dict) and p.get("type") in ("text", "image")
                                                  and len(p) == 2 for p in m["content"]):
        content, dropped = m["content"], 0
    else:
        content, dropped = text_of(m.get("content"))
    out: dict = {"role": role, "content": content}
    if role == "assistant":
        calls = m.get("tool_calls") or []
        if not calls and isinstance(m.get("function_call"), dict):  # the legacy single function call
            calls = [{"type": "function", "function": m["function_call"]}]
        if calls:
            out["tool_calls"] = [tool_call(tc, i) for i, tc in enumerate(calls) if isinstance(tc, dict)]
        if m.get("reasoning_content"):
            out["reasoning_content"] = str(m["reasoning_content"])
    if role == "tool" and m.get("tool_call_id") is not None:
        out["tool_call_id"] = str(m["tool_call_id"])
    if m.get("name"):
        out["name"] = str(m["name"])
    return out, dropped


def response_message(resp: dict) -> dict:
    msg, _ = openai_message({"role": "assistant", "content": resp.get("content"), "tool_calls": resp.get("tool_calls"),
                             "reasoning_content": resp.get("reasoning_content")})
    return msg


def first_user_text(messages: list[dict]) -> str | None:
    return next((text_and_images(m["content"])[0] for m in messages if m["role"] == "user"), None)


def flat_message(m: dict) -> dict:
    """A message as the transitions table holds it: text `content`, its images' URLs in `images`."""
    text, images = text_and_images(m.get("content"))
    return {**m, "content": text, "images": images or None}


def _ids(v) -> list[int] | None:
    return v if isinstance(v, list) and v and all(isinstance(i, int) for i in v) else None


def _logprobs(lp) -> list[float] | None:
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        vals = [x.get("logprob") for x in lp["content"] if isinstance(x, dict)]
        if vals and all(isinstance(v, (int, float)) for v in vals):
            return [float(v) for v in vals]
    return None


def function_tool(tool) -> dict | None:
    """A tool schema of any of the three APIs in the one form exports use, chat completions' function tool
    (`{"type": "function", "function": {"name", "description", "parameters"}}`, what TRL and chat templates take):
    a chat tool as it is; a Responses function tool (name and parameters at the top) and an Anthropic tool
    (`input_schema`) moved under `function`; a Responses custom tool (Codex's apply_patch: free text, its grammar
    in `format`) as a function of one string `input`; a built-in tool (Responses' local_shell, web_search,
    Anthropic's bash_*, web_search_*) as a function named after it, parameters an open object. None for what is
    not a tool object."""
    if not isinstance(tool, dict):
        return None
    if isinstance(tool.get("function"), dict):
        return tool
    kind = tool.get("type")
    name = tool.get("name") if isinstance(tool.get("name"), str) else kind if isinstance(kind, str) else None
    if not name:
        return None
    fn: dict = {"name": name}
    if isinstance(tool.get("description"), str):
        fn["description"] = tool["description"]
    if isinstance(tool.get("parameters"), dict):
        fn["parameters"] = tool["parameters"]
    elif isinstance(tool.get("input_schema"), dict):
        fn["parameters"] = tool["input_schema"]
    elif kind == "custom":
        fn["parameters"] = {"type": "object", "properties": {"input": {"type": "string", "description":
                            "the tool's free-text input" + (f" ({json.dumps(tool['format'], ensure_ascii=False)})"
                                                            if isinstance(tool.get("format"), dict) else "")}},
                            "required": ["input"]}
    else:
        fn["parameters"] = {"type": "object", "properties": {}}
    if isinstance(tool.get("strict"), bool):
        fn["strict"] = tool["strict"]
    return {"type": "function", "function": fn}


def tools_json(tools) -> str | None:
    """The request's tool schemas as one JSON text, each in the chat-completions function form (`function_tool`)."""
    if not isinstance(tools, list):
        return None
    out = [t for t in map(function_tool, tools) if t is not None]
    return json.dumps(out, ensure_ascii=False) if out else None


@dataclass
class SessionContext:
    session: str
    parent_session: str | None
    root_session: str
    finished_by: str | None
    reward: Reward


@dataclass
class SessionBuild:
    conversations: list[dict] = field(default_factory=list)
    transitions: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    failed_by_status: Counter = field(default_factory=Counter)


@dataclass
class _Call:
    rec: dict
    index: int
    prompt: list[dict] | None = None
    prompt_text: str | None = None
    response: dict | None = None


def build_session(records: list[dict], ctx: SessionContext) -> SessionBuild:
    out = SessionBuild()
    calls: list[_Call] = []
    index = 0
    answered: dict[str, list[dict]] = {}  # Responses API: response id -> that call's turns and its response
    for rec in records:
        route = rec.get("route")
        if route not in MODEL_ROUTES:
            out.counts["other_route_calls"] += 1
            continue
        call = _Call(rec, index)
        index += 1
        out.counts["model_calls"] += 1
        status, error = rec.get("status"), rec.get("error")
        if status != 200 or error:
            out.counts["failed_calls"] += 1
            out.failed_by_status[str(status or "none")] += 1
            out.skipped.append(_skip("call", ctx, rec, call.index, "failed_call",
                                     f"HTTP {status or '-'}: {error or 'no error message'}"))
            continue
        req, resp = rec.get("request") or {}, rec.get("response")
        if not isinstance(resp, dict):
            out.skipped.append(_skip("call", ctx, rec, call.index, "no_response", "the record holds no response"))
            out.counts["unusable_calls"] += 1
            continue
        if route in MESSAGE_ROUTES:
            try:
                if route == "chat.completions":
                    raw, parts = chat_prompt(req)
                elif route == "messages":
                    raw, parts = messages_prompt(req)
                else:
                    prev = req.get("previous_response_id")
                    history = answered.get(prev) if isinstance(prev, str) else None
                    if isinstance(prev, str) and history is None:
                        out.counts["responses_history_not_recorded"] += 1
                    raw, parts = responses_prompt(req, history)
            except ValueError as e:
                out.skipped.append(_skip("call", ctx, rec, call.index, "no_messages", str(e)))
                out.counts["unusable_calls"] += 1
                continue
            call.prompt = [openai_message(m)[0] for m in raw]
            out.counts["non_text_parts_dropped"] += parts.dropped
            out.counts["image_parts_kept"] += parts.images
            call.response = response_message(resp)
            if route == "responses" and isinstance(resp.get("id"), str):
                answered[resp["id"]] = call.prompt + [call.response]
        else:
            prompt = req.get("prompt")
            call.prompt_text = prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False)
            call.response = {"role": "assistant", "content": resp.get("content") or ""}
        calls.append(call)

    chat = [c for c in calls if c.prompt is not None]
    placed = assign_conversations([c.prompt for c in chat], [c.response for c in chat])
    by_conv: dict[int, list[tuple[_Call, int]]] = {}
    for c, (conv, turn) in zip(chat, placed):
        by_conv.setdefault(conv, []).append((c, turn))
    conv_of: dict[int, tuple[str, int, bool]] = {}
    for conv, members in sorted(by_conv.items()):
        conv_id = f"{ctx.session}#{conv}"
        out.conversations.append(_conversation(conv_id, [c for c, _ in members], ctx))
        for c, turn in members:
            conv_of[id(c)] = (conv_id, turn, turn == len(members) - 1)
    if len(by_conv) > 1:
        out.counts["sessions_with_several_conversations"] += 1
    for c in calls:
        conv_id, turn, last = conv_of.get(id(c), (None, None, None))
        out.transitions.append(_transition(c, ctx, conv_id, turn, last))
    out.counts["completions_route_calls"] += sum(1 for c in calls if c.prompt is None)
    return out


def _skip(kind: str, ctx: SessionContext, rec: dict | None, call_index: int | None, reason: str, detail: str) -> dict:
    return {"kind": kind, "session": ctx.session, "record_id": (rec or {}).get("record_id"), "call_index": call_index,
            "reason": reason, "detail": detail}


def _conversation(conv_id: str, members: list[_Call], ctx: SessionContext) -> dict:
    last = members[-1]
    messages = last.prompt + [last.response]
    turn_calls = []
    for c in members:
        at = len(c.prompt)
        resp = c.rec.get("response") or {}
        turn_calls.append({"message_index": at, "record_id": c.rec.get("record_id"),
                           "response_matches": message_key(messages[at]) == message_key(c.response),
                           "token_ids": _ids(resp.get("token_ids")),
                           "prompt_token_ids": _ids(resp.get("prompt_token_ids"))})
    req = last.rec.get("request") or {}
    return {
        "conversation_id": conv_id, "session": ctx.session, "parent_session": ctx.parent_session,
        "root_session": ctx.root_session, "agent_role": last.rec.get("role"),
        "model": (last.rec.get("response") or {}).get("model") or last.rec.get("model"),
        "messages": messages, "tools": tools_json(req.get("tools")),
        "reward": ctx.reward.value, "reward_source": ctx.reward.source, "calls": len(members),
        "finished_by": ctx.finished_by, "started_at": members[0].rec.get("ts"), "ended_at": last.rec.get("ts"),
        "prompt_key": first_user_text(messages), "turn_calls": turn_calls,
    }


SFT_INTERNAL = ("prompt_key", "turn_calls")


def sft_row(candidate: dict) -> dict:
    """The SFT line of a conversation candidate: messages, tools and provenance."""
    return {k: v for k, v in candidate.items() if k not in SFT_INTERNAL}


def _transition(c: _Call, ctx: SessionContext, conv_id: str | None, turn: int | None, last: bool | None) -> dict:
    rec = c.rec
    req, resp = rec.get("request") or {}, rec.get("response") or {}
    usage = resp.get("usage") or {}
    if "input_tokens" in usage or "output_tokens" in usage:  # the Responses and Messages APIs' own names
        usage = {"prompt_tokens": sum(v for k, v in usage.items() if type(v) is int and (
                     k == "input_tokens" or k.startswith("cache_") and k.endswith("input_tokens"))),
                 "completion_tokens": usage.get("output_tokens")}
    chat = c.prompt is not None
    return {
        "transition_id": f"{ctx.session}@{c.index}", "session": ctx.session, "parent_session": ctx.parent_session,
        "root_session": ctx.root_session, "conversation_id": conv_id, "call_index": c.index, "turn_index": turn,
        "record_id": rec.get("record_id"), "ts": rec.get("ts"), "route": rec.get("route"),
        "agent_role": rec.get("role"), "model": resp.get("model") or rec.get("model"),
        "prompt": [flat_message(m) for m in c.prompt] if chat else None,
        "completion": [flat_message(c.response)] if chat else None,
        "prompt_text": c.prompt_text, "completion_text": c.response.get("content"),
        "tools": tools_json(req.get("tools")), "finish_reason": resp.get("finish_reason"),
        "reward": ctx.reward.value, "reward_source": ctx.reward.source,
        "reward_details": json.dumps(ctx.reward.details, ensure_ascii=False, default=str)
        if ctx.reward.details is not None else None,
        "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
        "latency_s": rec.get("latency_s"), "prompt_token_ids": _ids(resp.get("prompt_token_ids")),
        "completion_token_ids": _ids(resp.get("token_ids")), "completion_logprobs": _logprobs(resp.get("logprobs")),
        "last_in_conversation": last,
    }
