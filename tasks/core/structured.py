"""Structured outputs: the `response_format` a JSON call asks for, and what the endpoint turned out to accept.

A call that expects JSON passes the pydantic model of its reply (defined by its stage) to `Gateway.chat_json`.
The gateway sends, best first (`MODES`):
  - json_schema: `{"type": "json_schema", "json_schema": {"name", "schema": <strict schema>, "strict": true}}`.
    vLLM, OpenAI and llama-server honour it; llama-server and vLLM turn the schema into a grammar, so even a
    135M model returns JSON of the schema's shape;
  - json_object: `{"type": "json_object"}` (any JSON object; the prompt describes the form);
  - prompt: no `response_format`; the prompt describes the form and the reply is parsed tolerantly
    (tasks/core/json_parse.py).
`gateway.structured_outputs` is the best mode a call may use. An endpoint that rejects the field (HTTP 400 or
422 whose error names it: response_format, json_schema, schema...) gets the next mode at once; the mode that
worked is remembered per (base URL, model) for the rest of the process (`remembered_mode`), and the downgrade is
logged once.

`strict_schema(model)` is the model's JSON schema made strict-compatible: every object has
`additionalProperties: false` and lists all its properties as required, `const` becomes a one-value `enum`, and
titles and defaults are dropped. String lengths (minLength / maxLength: OpenAI's strict mode refuses them) are
kept only when `keep_lengths` (llama-server and vLLM honour them: they keep a small model from an empty string
or a string that runs to the token cap).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from functools import lru_cache
from typing import Any

from pydantic import BaseModel

log = logging.getLogger("evolforge.gateway")

MODES = ("json_schema", "json_object", "prompt")
LENGTH_KEYWORDS = ("minLength", "maxLength")
DROPPED_KEYWORDS = ("title", "default", "examples")
# words of an HTTP 400/422 body that say the endpoint rejected the structured-output field itself
FORMAT_ERROR_WORDS = ("response_format", "json_schema", "json_object", "schema", "grammar", "structured")

_lock = threading.Lock()
_remembered: dict[tuple[str, str], str] = {}
_logged: set[tuple[str, str, str]] = set()


def _strict(node: Any, keep_lengths: bool) -> Any:
    if isinstance(node, list):
        return [_strict(n, keep_lengths) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in DROPPED_KEYWORDS:
            continue
        if key in LENGTH_KEYWORDS and not keep_lengths:
            continue
        if key in ("properties", "$defs"):
            out[key] = {name: _strict(sub, keep_lengths) for name, sub in value.items()}
        else:
            out[key] = _strict(value, keep_lengths)
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if out.get("type") == "object" or "properties" in out:
        out.setdefault("properties", {})
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=512)
def _schema_text(model: type[BaseModel], keep_lengths: bool) -> str:
    return json.dumps(_strict(model.model_json_schema(), keep_lengths), sort_keys=False)


def char_budget(max_tokens: int, overhead_tokens: int = 45, chars_per_token: float = 2.0, floor: int = 60) -> int:
    """Characters of free text a JSON reply can hold within `max_tokens` completion tokens, after
    `overhead_tokens` for its keys, punctuation and the whitespace a grammar lets a model put between them.
    Stages size their schemas' string lengths by it, so a grammar-constrained reply closes its JSON before the
    token cap instead of being cut inside a string (measured on the embedded 135M model: a free string runs on,
    repeating itself, until the cap; repetitive text with numbers takes about 2 characters a token)."""
    return max(floor, int((max_tokens - overhead_tokens) * chars_per_token))


def strict_schema(model: type[BaseModel], keep_lengths: bool = False) -> dict:
    """The strict-compatible JSON schema of `model` (a fresh copy)."""
    return json.loads(_schema_text(model, keep_lengths))


def schema_name(model: type[BaseModel]) -> str:
    """The schema's `name` on the wire: the model's name, in the characters OpenAI allows (a-z, A-Z, 0-9, _ -)."""
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in model.__name__)
    return name[:64] or "reply"


def response_format(mode: str, model: type[BaseModel] | None, keep_lengths: bool = False) -> dict | None:
    """The `response_format` field for `mode` (None: send none)."""
    if mode == "json_schema" and model is not None:
        return {"type": "json_schema",
                "json_schema": {"name": schema_name(model), "schema": strict_schema(model, keep_lengths),
                                "strict": True}}
    if mode in ("json_schema", "json_object"):
        return {"type": "json_object"}
    return None


def mode_of(fmt: dict | None) -> str:
    if not fmt:
        return "prompt"
    return "json_schema" if fmt.get("type") == "json_schema" else "json_object"


def next_mode(mode: str) -> str | None:
    i = MODES.index(mode)
    return MODES[i + 1] if i + 1 < len(MODES) else None


def lower_mode(a: str, b: str) -> str:
    """The weaker of two modes."""
    return MODES[max(MODES.index(a), MODES.index(b))]


def rejects_format(status: int | None, body: str) -> bool:
    """Whether an HTTP error says the endpoint does not take the structured-output field."""
    if status not in (400, 422):
        return False
    low = body.lower()
    return any(w in low for w in FORMAT_ERROR_WORDS)


def remembered_mode(base_url: str, model: str) -> str | None:
    with _lock:
        return _remembered.get((base_url, model))


def remember_mode(base_url: str, model: str, mode: str, tried: str, reason: str) -> None:
    """Remember that `model` at `base_url` takes `mode` (it rejected `tried`); log it once per process."""
    with _lock:
        current = _remembered.get((base_url, model))
        _remembered[(base_url, model)] = lower_mode(current, mode) if current else mode
        first = (base_url, model, mode) not in _logged
        _logged.add((base_url, model, mode))
    if first:
        how = "no response_format (the prompt describes the JSON)" if mode == "prompt" else f"response_format {mode}"
        log.warning("model %r at %s rejected response_format %s (%s); its JSON calls use %s for the rest of this "
                    "process (gateway.structured_outputs)", model, base_url, tried, reason[:200], how)


def forget_modes() -> None:
    """Forget every remembered mode (tests)."""
    with _lock:
        _remembered.clear()
        _logged.clear()


def with_format(params: dict, fmt: dict | None) -> dict:
    out = copy.copy(params)
    out.pop("response_format", None)
    if fmt is not None:
        out["response_format"] = fmt
    return out
