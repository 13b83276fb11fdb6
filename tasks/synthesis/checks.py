"""Small, pure checks of task synthesis: proposal pruning and the stub solutions tests must fail against.

The answer checks it uses (extract_code, eval_number, final_answer, same_number) live in tasks/text/ and are
re-exported here for the synthesis modules.
"""

from __future__ import annotations

from evolforge.tasks.text.answers import same_number as same_number
from evolforge.tasks.text.checks import eval_number as eval_number
from evolforge.tasks.text.checks import extract_code as extract_code
from evolforge.tasks.text.checks import final_answer as final_answer


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
