"""HumanEval's check as a test script for the sandbox, with the prompt's helpers bound on the test side.

    script = check_script(prompt, test, entry_point)
    script = check_script_js(test, entry_point)        # JavaScript (language "nodejs")

HumanEval's `check(candidate)` trusts helpers of the prompt (HumanEval/32's `poly`, 38's `encode_cyclic`,
50's `encode_shift`). The solution file is the prompt plus the completion, so a completion can redefine such a
helper; a check script that takes the helper from the solution (`from solution import *`) then checks the
completion against its own rebinding (decode(encode(s)) == s with both the identity). Here the test side binds
the entry point alone from the solution, and runs the prompt's own code (its imports, constants and helper
functions: the benchmark's text, trusted like the test) before the test, so `check` uses the prompt's helpers
whatever the completion defines.
"""

from __future__ import annotations

import ast

__all__ = ["check_script", "check_script_js", "prompt_helpers"]


def prompt_helpers(prompt: str, entry_point: str) -> str:
    """The prompt's top-level statements except the entry point's definition (its docstring-only stub), as source.
    "" when the prompt does not parse (the test then names only what it defines itself)."""
    for text in (prompt, prompt + "    pass\n"):
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        parts = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == entry_point:
                continue
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
            parts.append("".join(lines[start:node.end_lineno]))
        return "\n\n".join(p.rstrip("\n") + "\n" for p in parts)
    return ""


def check_script(prompt: str, test: str, entry_point: str) -> str:
    """The test script of a HumanEval problem against solution.py: the entry point from the solution, the prompt's
    helpers and imports from the prompt, HumanEval's test, then check(entry_point)."""
    if not entry_point.isidentifier():
        raise ValueError(f"not an entry point name: {entry_point!r}")
    return (f"from solution import {entry_point}\n\n{prompt_helpers(prompt, entry_point)}\n\n{test}\n\n"
            f"check({entry_point})\n")


def check_script_js(test: str, entry_point: str) -> str:
    """The test script of a JavaScript HumanEval-style problem (a `check(candidate)` using node's assert) against
    solution.js, the prompt plus the completion: the entry point from the solution process (a top-level function
    declaration needs no export, tasks/sandbox/bridge.js), then check(entry_point). The prompt is a function
    header with its comment, so it has no helpers to bind on the test side."""
    if not entry_point.isidentifier():
        raise ValueError(f"not an entry point name: {entry_point!r}")
    return f"const {{ {entry_point} }} = require('./solution');\n\n{test}\n\ncheck({entry_point});\n"
