"""The warm worker's cache of rewritten test files (harness.PytestTemplate.precompile): a later check of the same
tests is not rewritten again, a changed test file never gets the code of another, and pytest still reports what it
reported without the cache (syntax errors, the rewriter's warnings)."""

from __future__ import annotations

import ast
import os
import re

import pytest

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.pool import close_workers, pool_stats
from evolforge.tasks.sandbox.run import run_python_tests

pytestmark = pytest.mark.skipif(not os.access("/usr/bin/bwrap", os.X_OK), reason="bubblewrap not installed")

SOLUTION = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
# the runner writes the cache's counts as its pytest saw them (os.write: not captured by --capture=sys)
TESTS = """from solution import add
import os, sys

def test_add():
    os.write(1, b"STATS " + repr(sys.modules["_evolforge_harness"].REWRITE_STATS).encode() + b"\\n")
    assert add(1, 2) == {expected}
"""


def _settings() -> SandboxSettings:
    return SandboxSettings(cpu_seconds=5, memory_mb=512, max_processes=32, wall_timeout_seconds=20,
                           max_output_bytes=200_000, max_parallel=1, reuse_workers=True)


@pytest.fixture
def one_worker():
    """Every check of the test in one fresh worker (its cache starts empty)."""
    close_workers()
    start = pool_stats()
    yield
    now = pool_stats()
    close_workers()
    assert now["spawned"] - start["spawned"] == 1 and now["retired"] == start["retired"], (start, now)


def _check(solution: str, tests: str):
    r = run_python_tests(solution, tests, _settings())
    assert r.runner == "pytest"
    found = re.findall(r"^STATS (\{.*\})$", r.stdout, re.M)
    return r, (ast.literal_eval(found[0]) if found else None)


def test_a_second_check_of_the_same_tests_is_not_rewritten_again(one_worker):
    tests = TESTS.format(expected=3)
    first, stats = _check(SOLUTION, tests)
    assert first.passed, first.stdout
    assert stats == {"compiled": 1, "reused": 0, "served": 1, "rewritten": 0}
    second, stats = _check(WRONG, tests)  # the same tests, another solution: the cached code, judged as before
    assert not second.passed and second.tests_failed == 1
    assert "assert -1 == 3" in second.stdout  # pytest's assertion introspection: the rewritten asserts ran
    assert stats == {"compiled": 1, "reused": 1, "served": 1, "rewritten": 0}


def test_a_changed_test_file_is_not_served_the_code_of_the_old_one(one_worker):
    old, stats = _check(SOLUTION, TESTS.format(expected=3))
    assert old.passed and stats["compiled"] == 1
    changed, stats = _check(SOLUTION, TESTS.format(expected=4))  # one byte changed: fails with its own assert
    assert not changed.passed and "assert 3 == 4" in changed.stdout
    assert stats == {"compiled": 2, "reused": 0, "served": 1, "rewritten": 0}
    again, stats = _check(SOLUTION, TESTS.format(expected=3))
    assert again.passed and stats == {"compiled": 2, "reused": 1, "served": 1, "rewritten": 0}


def test_a_syntax_error_in_the_tests_is_reported_by_pytest_as_before(one_worker):
    broken = "from solution import add\n\ndef test_add(:\n    assert add(1, 2) == 3\n"
    results = [_check(SOLUTION, broken)[0] for _ in range(2)]  # nothing cached: the second is reported the same way
    for r in results:
        assert not r.passed and r.tests_failed == 1, r.stdout
        assert "ERROR collecting test_solution.py" in r.stdout and "SyntaxError" in r.stdout
    assert [re.sub(r" in [\d.]+s", "", r.stdout) for r in results][0] == re.sub(r" in [\d.]+s", "",
                                                                                  results[1].stdout)
    fixed, stats = _check(SOLUTION, TESTS.format(expected=3))  # the worker is fine and caches the next file
    assert fixed.passed and stats == {"compiled": 1, "reused": 0, "served": 1, "rewritten": 0}


def test_the_rewriters_warnings_are_still_reported(one_worker):
    """A file whose rewrite warns (an assert of a tuple is always true) is rewritten by its runner, whose pytest
    reports the warning as it did without the cache."""
    tests = TESTS.format(expected=3) + "\ndef test_tuple():\n    assert (add(1, 2) == 4, 'never fails')\n"
    for _ in range(2):
        r, stats = _check(SOLUTION, tests)
        assert r.passed and r.tests_passed == 2
        assert "PytestAssertRewriteWarning: assertion is always true" in r.stdout
        assert stats == {"compiled": 0, "reused": 0, "served": 0, "rewritten": 1}
