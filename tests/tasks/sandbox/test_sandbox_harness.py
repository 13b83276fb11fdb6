"""The runner's speed-ups of pytest (tasks/sandbox/harness.py) change nothing pytest produces."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from _pytest.assertion import rewrite
from _pytest.config import get_config

from evolforge.tasks.sandbox import harness

ASSERTS = '''
import math

def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    assert abs(candidate(3.5) - 0.5) < 1e-6, "close " + str(3.5)
    assert not candidate([1, 2], 0.05), f"{candidate!r}"
    assert (n := candidate([], 1)) in (False, None) and n is not True
    assert all(candidate([x], 0) is False for x in range(3)) or math.isnan(float("nan"))
    assert candidate(*[[1, 2]], **{"threshold": 0.5}) != [candidate(a) for a in [1, 2] if a] < [3]

class TestThing:
    def test_it(self):
        x = {"a": [1, (2, 3)]}
        assert x["a"][1][0] + -x["a"][0] == 1 and not x.get("b")
'''


def _rewritten(source: bytes, name: str) -> str:
    tree = ast.parse(source, name)
    rewrite.rewrite_asserts(tree, source, name, get_config([]))
    compile(tree, name, "exec")  # every node has a location
    return ast.dump(tree, include_attributes=True)


def test_the_faster_walk_rewrites_asserts_exactly_as_pytest_does(monkeypatch):
    sources = [(ASSERTS.encode(), "test_asserts.py")]
    sources += [(p.read_bytes(), p.name) for p in sorted(Path(__file__).parent.glob("test_*.py"))]
    original = rewrite.traverse_node
    before = [_rewritten(src, name) for src, name in sources]
    monkeypatch.setattr(rewrite, "traverse_node", original)
    harness.fast_assertion_rewrite()
    assert rewrite.traverse_node is harness._iter_tree
    assert [_rewritten(src, name) for src, name in sources] == before


@pytest.mark.parametrize("source", [ASSERTS, "x = 1\n", "def f(a, /, b=2, *c, d, **e):\n    return [a async for a in b]\n"])
def test_the_walk_visits_every_node(source):
    tree = ast.parse(source)
    assert sorted(map(id, harness._iter_tree(tree))) == sorted(map(id, ast.walk(tree)))
