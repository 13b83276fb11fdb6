"""Token-level samples: input_ids, the assistant loss mask, per-turn boundaries, token drift.

The conversation is rendered with the tokenizer's chat template (`apply_chat_template(..., tokenize=False)`,
then tokenised without added special tokens, as apply_chat_template does). Boundaries come from rendering
every prefix: message i starts where the rendering of messages[:i] ends, and an assistant message's loss
starts where messages[:i] rendered with the generation prompt ends, so the mask (1) covers exactly what
the model writes for that turn, its end-of-turn marker included (as TRL's `{% generation %}` training
templates do), and nothing of the prompt, the role header, user or tool turns. A template that does not
render prefixes the same way inside the whole conversation gets the common prefix and a warning per turn.

Tool calls (the rendering is tasks/text/chat.py's ChatRenderer, the one SFT trains with): a template that renders
`tool_calls` gets them with parsed (dict) arguments, the form chat templates expect; one that ignores them
(SmolLM2's, the embedded model's) gets them as text in the assistant content,
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` per call, and the tool schemas as a `# Tools` block
in the system message (rendering "template+tool_fallback").

The upstream's own token ids (`response.token_ids`, e.g. vLLM's `return_token_ids`): for the assistant turn
a call produced, they are what the model sampled, so they replace the re-tokenised text of that turn
(a trailing stop token is dropped, the template's end-of-turn marker follows). When they differ from the
re-tokenised text, or `response.prompt_token_ids` differ from the sample's tokens before that turn, or the
agent sent back an edited version of the response, the sample is flagged `drift` with one reason per turn.
"""

from __future__ import annotations

import json
from pathlib import Path

from evolforge.storage.trajectory_sets import cached_tokenizer_ready, filling_tokenizer_cache, tokenizer_cache
from evolforge.tasks.text.chat import ChatRenderer, TokenizerError


def load_tokenizer(spec: str | None, embedded_model_path: str = ""):
    """(tokenizer, name): a model folder (or anything AutoTokenizer takes), or a GGUF file; by default the
    embedded model's GGUF. The GGUF conversion (about 20 s) is cached on this machine."""
    from transformers import AutoTokenizer

    try:
        if spec and not spec.lower().endswith(".gguf"):
            return AutoTokenizer.from_pretrained(spec), spec
        if spec:
            gguf = Path(spec)
        elif embedded_model_path:
            gguf = Path(embedded_model_path)
        else:
            from evolforge.tasks.core.embedded_model import default_model_path

            gguf = default_model_path()
        if not gguf.is_file():
            raise TokenizerError(f"tokenizer GGUF {gguf} does not exist")
        folder = tokenizer_cache(gguf)
        if not cached_tokenizer_ready(folder):
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            with filling_tokenizer_cache(folder) as tmp:
                tok.save_pretrained(tmp)
        return AutoTokenizer.from_pretrained(folder), str(gguf)
    except TokenizerError:
        raise
    except Exception as e:  # noqa: BLE001 - one clear error naming what was asked for
        raise TokenizerError(f"cannot load the tokenizer {spec or 'of the embedded model'}: {type(e).__name__}: {e}") from e


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _first_diff(a: list[int], b: list[int]) -> str:
    k = _common(a, b)
    x = a[k] if k < len(a) else "end"
    y = b[k] if k < len(b) else "end"
    return f"first difference at token {k} (upstream {x} vs re-tokenised {y})"


def token_sample(r: ChatRenderer, conv: dict) -> dict:
    """The token-level sample of one conversation candidate (see the module docstring)."""
    tools = json.loads(conv["tools"]) if conv.get("tools") else None
    msgs, tools_arg, shift, fallback = r.template_messages(conv["messages"], tools)
    full = r.ids(r.render(msgs, tools_arg))
    warnings: list[str] = []

    def boundary(prefix: list[dict], gen: bool, what: str) -> int:
        p = r.ids(r.render(prefix, tools_arg, gen=gen))
        k = _common(p, full)
        if k < len(p):
            warnings.append(f"{what}: the template renders this prefix differently inside the whole conversation "
                            f"(common prefix of {k} of {len(p)} tokens used)")
        return k

    n = len(msgs)
    starts = [0] + [boundary(msgs[:i], False, f"message {i - shift}") for i in range(1, n)]
    ends = starts[1:] + [len(full)]
    loss = {i: boundary(msgs[:i], True, f"assistant turn {i - shift}") if i else 0
            for i in range(n) if msgs[i]["role"] == "assistant"}
    by_message = {tc["message_index"] + shift: tc for tc in conv.get("turn_calls") or []}

    ids: list[int] = []
    mask: list[int] = []
    turns: list[dict] = []
    drift: list[str] = []
    upstream_turns = 0
    for i in range(n):
        s, e = starts[i], max(starts[i], ends[i])
        role = msgs[i]["role"]
        mi = i - shift if i >= shift else None
        turn = {"message_index": mi, "role": role, "start": len(ids), "end": None, "loss_start": None,
                "source": "template"}
        if role != "assistant":
            ids += full[s:e]
            mask += [0] * (e - s)
        else:
            ls = min(max(loss[i], s), e)
            span = full[ls:e]
            tc = by_message.get(i)
            upstream = tc.get("token_ids") if tc else None
            prompt_ids = tc.get("prompt_token_ids") if tc else None
            ids += full[s:ls]
            mask += [0] * (ls - s)
            if prompt_ids and prompt_ids != ids:
                drift.append(f"prompt of turn {mi}: the upstream tokenised the prompt into {len(prompt_ids)} ids, "
                             f"the sample has {len(ids)}; {_first_diff(prompt_ids, ids)}")
            turn["loss_start"] = len(ids)
            tail = r.tail if r.tail and span[-len(r.tail):] == r.tail else []
            body = span[:len(span) - len(tail)]
            if upstream:
                upstream_turns += 1
                core = upstream[:-1] if upstream[-1] in r.stop_ids else upstream
                if not tc.get("response_matches", True):
                    drift.append(f"turn {mi}: the agent sent back an edited assistant message, not the model's "
                                 "response; the upstream token ids were not used")
                else:
                    if core != body:
                        drift.append(f"turn {mi}: the upstream returned {len(core)} completion token ids, the "
                                     f"re-tokenised text has {len(body)}; {_first_diff(core, body)}")
                    span = core + tail
                    turn["source"] = "upstream"
            ids += span
            mask += [1] * len(span)
        turn["end"] = len(ids)
        turns.append(turn)
    return {
        "conversation_id": conv["conversation_id"], "session": conv["session"],
        "parent_session": conv.get("parent_session"), "root_session": conv.get("root_session"),
        "input_ids": ids, "assistant_mask": mask, "num_tokens": len(ids), "assistant_tokens": sum(mask),
        "turns": turns, "drift": bool(drift), "drift_reasons": drift, "upstream_ids_turns": upstream_turns,
        "warnings": warnings, "rendering": "template+tool_fallback" if fallback else "template",
        "tokenizer": r.name, "reward": conv.get("reward"), "reward_source": conv.get("reward_source"),
    }
