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


def _pytest_own_rewriter(monkeypatch) -> None:
    """pytest's own traverse_node and visit_Assert again (until the test ends), whatever an earlier test installed."""
    visit = rewrite.AssertionRewriter.visit_Assert
    monkeypatch.setattr(rewrite.AssertionRewriter, "visit_Assert", getattr(visit, "_evolforge_original", visit))
    walk = rewrite.traverse_node
    if walk in (harness._walk, harness._iter_tree):
        walk = rewrite.__dict__.get("_evolforge_traverse_node", walk)
    monkeypatch.setattr(rewrite, "traverse_node", walk)


@pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")  # the sample's `assert (a, b)`
def test_the_faster_walk_rewrites_asserts_exactly_as_pytest_does(monkeypatch):
    sources = [(ASSERTS.encode(), "test_asserts.py"), (harness._SAMPLE, "test_sample.py")]
    sources += [(p.read_bytes(), p.name) for p in sorted(Path(__file__).parent.glob("test_*.py"))]
    _pytest_own_rewriter(monkeypatch)
    assert rewrite.traverse_node not in (harness._walk, harness._iter_tree)
    before = [_rewritten(src, name) for src, name in sources]
    harness.fast_assertion_rewrite()
    assert rewrite.traverse_node is harness._walk
    assert rewrite.AssertionRewriter.visit_Assert._evolforge_original is not None
    assert [_rewritten(src, name) for src, name in sources] == before
    harness.fast_assertion_rewrite()  # a second call changes nothing
    assert [_rewritten(src, name) for src, name in sources] == before


def test_a_rewriter_that_rewrites_otherwise_is_not_installed(monkeypatch):
    """The speed-up checks itself on a sample when installed: a pytest whose rewriter it would change keeps its own."""
    _pytest_own_rewriter(monkeypatch)
    walk, visit = rewrite.traverse_node, rewrite.AssertionRewriter.visit_Assert
    monkeypatch.setattr(harness, "_copied", lambda assert_: [("lineno", assert_.lineno + 1)])  # a wrong location
    harness.fast_assertion_rewrite()
    assert (rewrite.traverse_node, rewrite.AssertionRewriter.visit_Assert) == (walk, visit)


@pytest.mark.parametrize("source", [ASSERTS, "x = 1\n", "def f(a, /, b=2, *c, d, **e):\n    return [a async for a in b]\n"])
def test_the_walk_visits_every_node(source):
    tree = ast.parse(source)
    assert sorted(map(id, harness._iter_tree(tree))) == sorted(map(id, ast.walk(tree)))
