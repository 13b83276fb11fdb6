"""Answer checks shared by synthesis, SFT, PPO and eval: code extraction and numeric answers (stdlib only).

    extract_code(text)    the first fenced Python block, else the whole reply
    eval_number(expr)     a number or arithmetic expression evaluated safely (no names, no calls), or None
    final_answer(text)    a reply's final answer as a number (the one answer extractor, tasks/text/answers.py)

`same_number` and `answer_correct` (tasks/text/answers.py) are the shared numeric comparisons.
"""

from __future__ import annotations

import ast
import operator
import re

from evolforge.tasks.text.answers import extract_answer

_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)
_EXPR = re.compile(r"[-+]?[\d.,/*()+\- ^]*\d[\d.,/*()+\- ^]*")  # the first arithmetic in "12 apples", "x = 3*4"
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")  # LaTeX \frac{a}{b} -> (a)/(b)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Mod: operator.mod,
        ast.FloorDiv: operator.floordiv}


def extract_code(text: str) -> str:
    """The first fenced Python block, else the whole reply."""
    m = _CODE_BLOCK.search(text or "")
    return (m.group(1) if m else (text or "")).strip() + "\n"


def eval_number(expr: str) -> float | None:
    """Evaluate a number or arithmetic expression safely (no names, no calls); None when it is not one."""
    s = (expr or "").strip().replace(",", "").rstrip(".").replace("^", "**")
    if not s or len(s) > 200:
        return None
    try:
        tree = ast.parse(s, mode="eval")
    except SyntaxError:
        return None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("not arithmetic")

    try:
        return float(ev(tree))
    except (ValueError, ZeroDivisionError, OverflowError, TypeError):
        return None


def final_answer(text: str) -> float | None:
    """The solver's final answer as a number: the text `extract_answer` finds ('The answer is X', '#### X',
    '\\boxed{X}', else the last number in the text) evaluated by `eval_number`; when the whole answer is not
    arithmetic ('12 apples', 'x = 12'), its first arithmetic expression. None when there is no number."""
    ans = extract_answer(text, fallback_last_number=True)
    if ans is None:
        return None
    ans = _FRAC.sub(r"(\1)/(\2)", ans)
    v = eval_number(ans)
    if v is None and (m := _EXPR.search(ans)):
        v = eval_number(m.group(0))
    return v
