"""Small, pure checks used by task synthesis: code extraction, numeric answers, proposal pruning.

A solver's final answer is found by the one answer extractor, tasks/text/answers.py (`extract_answer`), and
evaluated here as safe arithmetic (`eval_number`); `same_number` is the shared numeric comparison.
"""

from __future__ import annotations

import ast
import operator
import re

from evolforge.tasks.text.answers import extract_answer
from evolforge.tasks.text.answers import same_number as same_number  # re-exported for synthesize.py

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


def shingles(text: str, n: int = 5) -> set[str]:
    t = " ".join((text or "").lower().split())
    return {t[i : i + n] for i in range(max(1, len(t) - n + 1))}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def difficulty(pass_rate: float) -> str:
    """KodCode's labels: easy over 2/3, medium 1/3 to 2/3, hard under 1/3."""
    if pass_rate > 2 / 3:
        return "easy"
    if pass_rate >= 1 / 3:
        return "medium"
    return "hard"


def stub_solution(entry_point: str) -> str:
    """A solution that does nothing: tests that pass against it check nothing."""
    return f"def {entry_point}(*args, **kwargs):\n    return None\n"


_ALWAYS_EQUAL = """\
class _AlwaysEqual:
    \"\"\"Equal to everything, greater and less than everything, truthy, hashable, an empty iterable;
    arithmetic, calls, items and attributes give itself.\"\"\"

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __contains__ = __eq__

    def __hash__(self):
        return 0

    def __bool__(self):
        return True

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __repr__(self):
        return "AlwaysEqual()"

    def _self(self, *args, **kwargs):
        return self

    __call__ = __getitem__ = _self
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _self
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __pos__ = __abs__ = _self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self


"""


def always_equal_stub(entry_point: str) -> str:
    """A solution whose result equals anything (`__eq__` True, `__ne__` False, every order comparison True,
    truthy, hashable, empty when iterated): tests that pass against it only compare the result with ==, <, >
    or truthiness and would reward an object that fakes them."""
    return _ALWAYS_EQUAL + f"def {entry_point}(*args, **kwargs):\n    return _AlwaysEqual()\n"
