"""The conversation form a policy is trained on, and its rendering through the policy's chat template: the SFT stage
trains on these conversations, the trajectories stage writes them from recorded agent traffic and makes token-level
samples from them, so both render a conversation the same way (stdlib only: the tokenizer is passed in).

- `text_and_images(content)`: a message content (text, or TRL multimodal parts) as its text and image URLs.
- `tool_call(tc, i)`: one tool call in the OpenAI form (id, type, function name, arguments as a JSON string).
- `tool_call_text(tc)`, `tools_block(tools)`: a call as `<tool_call>{"name", "arguments"}</tool_call>` text and
  the tool schemas as a `# Tools` block, for a template that does not render them itself.
- `ChatRenderer(tok, name)`: a tokenizer with a chat template, probed once for what it renders (tool calls, tool
  schemas); `template_messages` turns a conversation into what the template takes (the text fallback above where
  it renders neither), `render` and `ids` render and tokenise it.
"""

from __future__ import annotations

import json

PROBE = "probe_7f3a"


class TokenizerError(RuntimeError):
    """The tokenizer for the token-level samples cannot be loaded or has no chat template."""


def text_and_images(content) -> tuple[str, list[str]]:
    """A message content (text or TRL parts) as its text and its image URLs; parts of another shape (a hand-made
    sft.jsonl's) are left out, a content that is neither text nor parts is its str."""
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict)]
        return ("".join(str(p.get("text") or "") for p in parts if p.get("type") == "text"),
                [str(p["image"]) for p in parts if p.get("type") == "image" and p.get("image")])
    return (content if isinstance(content, str) else "" if content is None else str(content)), []



def tool_call(tc: dict, i: int) -> dict:
    fn = tc.get("function") or {}
    args = fn.get("arguments")
    if args is None:
        args = "{}"
    elif not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {"id": tc.get("id") or f"call_{i}", "type": tc.get("type") or "function",
            "function": {"name": fn.get("name") or "", "arguments": args}}



def _parsed(args):
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def tool_call_text(tc: dict) -> str:
    fn = tc.get("function") or {}
    return "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": _parsed(fn.get("arguments"))},
                                        ensure_ascii=False) + "\n</tool_call>"


def tools_block(tools: list) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call these functions. Their signatures are within <tools></tools>:\n<tools>\n"
            f"{lines}\n</tools>\n\nCall a function with a JSON object in <tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class ChatRenderer:
    """A tokenizer with a chat template, probed once for what it renders (tool calls, tool schemas)."""

    def __init__(self, tok, name: str):
        if not getattr(tok, "chat_template", None):
            raise TokenizerError(f"the tokenizer {name} has no chat template: pass one that has (a model folder)")
        self.tok, self.name = tok, name
        self.native_calls = self._renders_tool_calls()
        self.native_tools = self._renders_tools()
        self.tail = self._tail()
        self.stop_ids = {i for i in (tok.eos_token_id, *(self.tail[:1])) if i is not None}

    # ---- probes
    def _try(self, msgs, **kw) -> str:
        try:
            return self.render(msgs, **kw)
        except Exception:  # noqa: BLE001 - a template that cannot render the probe does not support it
            return ""

    def _renders_tool_calls(self) -> bool:
        msgs = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c0", "type": "function", "function": {"name": f"{PROBE}_fn", "arguments": {f"{PROBE}_k": 1}}}]},
                {"role": "tool", "tool_call_id": "c0", "content": f"{PROBE}_out"}]
        text = self._try(msgs)
        return all(s in text for s in (f"{PROBE}_fn", f"{PROBE}_k", f"{PROBE}_out"))

    def _renders_tools(self) -> bool:
        tool = {"type": "function", "function": {"name": f"{PROBE}_tool", "description": "probe",
                                                 "parameters": {"type": "object", "properties": {}}}}
        return f"{PROBE}_tool" in self._try([{"role": "user", "content": "hi"}], tools=[tool])

    def _tail(self) -> list[int]:
        """The tokens the template puts after an assistant message's text (its end-of-turn marker)."""
        text = self._try([{"role": "user", "content": "hi"}, {"role": "assistant", "content": f"{PROBE}_end"}])
        cut = text.rfind(f"{PROBE}_end")
        return self.ids(text[cut + len(f"{PROBE}_end"):]) if cut >= 0 else []

    # ---- rendering
    def render(self, msgs: list[dict], tools: list | None = None, gen: bool = False) -> str:
        out = self.tok.apply_chat_template(msgs, tools=tools or None, tokenize=False, add_generation_prompt=gen)
        return out if isinstance(out, str) else out[0]

    def ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def template_messages(self, messages: list[dict], tools: list | None) -> tuple[list[dict], list | None, int, bool]:
        """(messages for the template, tools argument, index shift, fallback used)."""
        fallback = False
        out = []
        for m in messages:
            d = {"role": m["role"], "content": text_and_images(m.get("content"))[0]}  # a text model: images out
            calls = m.get("tool_calls") or []
            if calls and self.native_calls:
                d["tool_calls"] = [{"id": c.get("id"), "type": "function",
                                    "function": {"name": c["function"]["name"],
                                                 "arguments": _parsed(c["function"]["arguments"])}} for c in calls]
            elif calls:
                fallback = True
                d["content"] = "\n".join([d["content"]] * bool(d["content"]) + [tool_call_text(c) for c in calls])
            for k in ("tool_call_id", "name", "reasoning_content"):
                if m.get(k):
                    d[k] = m[k]
            out.append(d)
        shift = 0
        if tools and not self.native_tools:
            fallback = True
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + tools_block(tools)}
            else:
                out.insert(0, {"role": "system", "content": tools_block(tools)})
                shift = 1
            tools = None
        return out, tools, shift, fallback
