"""Tolerant recovery of JSON from model output.

Models wrap JSON in code fences, prose ("Sure! Here is the JSON: {...}") or
trailing commentary. `extract_json` recovers the first complete JSON object or
array; output with none raises `JSONParseFailure`, which callers count as an
explicit failure instead of crashing.
"""

from __future__ import annotations

import json
import re

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)


class JSONParseFailure(ValueError):
    def __init__(self, message: str, text: str):
        super().__init__(message)
        self.text = text


def _balanced_candidates(text: str):
    """Yield substrings that start at { or [ and end at their matching bracket."""
    for start, ch in enumerate(text):
        if ch not in "{[":
            continue
        stack = []
        in_str = esc = False
        for i in range(start, len(text)):
            c = text[i]
            if in_str:
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == '"':
                    in_str = False
                continue
            if c == '"':
                in_str = True
            elif c in "{[":
                stack.append("}" if c == "{" else "]")
            elif c in "}]":
                if not stack or stack.pop() != c:
                    break
                if not stack:
                    yield text[start : i + 1]
                    break


def _loads_lenient(s: str):
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        # trailing commas are the most common model slip
        return json.loads(re.sub(r",\s*([}\]])", r"\1", s))


def extract_json(text: str | None, expect: type | tuple = (dict, list)):
    if not text or not text.strip():
        raise JSONParseFailure("empty model output", text or "")
    candidates = [text.strip()]
    candidates += [m.strip() for m in _FENCE.findall(text)]
    for cand in candidates:
        try:
            value = _loads_lenient(cand)
            if isinstance(value, expect):
                return value
        except json.JSONDecodeError:
            pass
    for cand in _balanced_candidates(text):
        try:
            value = _loads_lenient(cand)
        except json.JSONDecodeError:
            continue
        if isinstance(value, expect):
            return value
    raise JSONParseFailure(f"no JSON {getattr(expect, '__name__', 'value')} found in model output", text)
