"""Plain pytest files called directly (tasks/sandbox/direct.py): every check here is run twice, with
sandbox.pytest_direct on and off, and must get the same verdict (and the same counts and reason unless noted);
the files the direct path may take must take it, and everything else (fixtures, marks, classes, module setup,
generators, async tests, names a solution could inject, extra files) must go to pytest's own runner."""

from __future__ import annotations

import os
import re

import pytest

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.pool import run_in_worker
from evolforge.tasks.sandbox.run import PYTEST_ARGS, run_python_tests
from evolforge.tasks.sandbox.verdict import declared_tests

pytestmark = pytest.mark.skipif(not os.access("/usr/bin/bwrap", os.X_OK), reason="bubblewrap not installed")

# written to the runner's stdout (os.write: not captured) by a test: whether Direct._call called it
PROBE = '''
def _which_path():
    import os, sys
    f, direct = sys._getframe(1), False
    while f is not None:
        direct = direct or (f.f_code.co_name == "_call" and f.f_globals.get("__name__") == "_evolforge_direct")
        f = f.f_back
    os.write(1, b"PATH direct\\n" if direct else b"PATH pytest\\n")
'''
ADD = "def add(a, b):\n    return a + b\n"
SUB = "def add(a, b):\n    return a - b\n"


def _settings(direct: bool) -> SandboxSettings:
    return SandboxSettings(cpu_seconds=5, memory_mb=512, max_processes=32, wall_timeout_seconds=20,
                           max_output_bytes=200_000, max_parallel=1, reuse_workers=True, pytest_direct=direct)


def _tests(body: str, head: str = "") -> str:
    return f"{head}from solution import *\n{PROBE}\n{body}"


def _both(solution: str, tests: str):
    on = run_python_tests(solution, tests, _settings(True))
    off = run_python_tests(solution, tests, _settings(False))
    assert on.runner == off.runner == "pytest"
    assert "PATH direct" not in off.stdout
    return on, off


def _path(result) -> str | None:
    found = set(re.findall(r"PATH (direct|pytest)\n", result.stdout))
    assert len(found) <= 1, result.stdout
    return found.pop() if found else None


def _same(on, off, exact: bool = True) -> None:
    assert on.passed == off.passed, (on.verdict_error, off.verdict_error, on.stdout[-2000:], off.stdout[-2000:])
    if exact:
        assert (on.tests_passed, on.tests_failed, on.verdict_error, on.not_checkable) == \
               (off.tests_passed, off.tests_failed, off.verdict_error, off.not_checkable), (on.stdout, off.stdout)


def _agree(case: tuple, on_paths: tuple, off_paths: tuple) -> None:
    """(solution, test body, passes) checked with the setting on and off: the expected verdict, the path each
    took (one of `on_paths` / `off_paths`; None: no test printed one), the same record."""
    solution, body, passes = case
    on, off = _both(solution, _tests(body))
    assert on.passed is passes, (on.verdict_error, on.stdout[-2000:])
    assert _path(on) in on_paths and _path(off) in off_paths
    _same(on, off)


DIRECT = {  # name: (solution, test body, passes); each must take the direct path
    "one test passes": (ADD, "def test_a():\n    _which_path()\n    assert add(1, 2) == 3\n", True),
    "one test fails": (SUB, "def test_a():\n    _which_path()\n    assert add(1, 2) == 3\n", False),
    "one of three fails": (ADD, "def test_a():\n    _which_path()\n    assert add(1, 2) == 3\n"
                                "def test_b():\n    assert add(1, 1) == 3\ndef test_c():\n    assert add(0, 0) == 0\n",
                           False),
    "an alias is a second test": (ADD, "def test_a():\n    _which_path()\n    assert add(1, 2) == 3\ntest_b = test_a\n",
                                  True),
    "a returned value only warns": (ADD, "def test_a():\n    _which_path()\n    return add(1, 2) == 4\n", True),
    "a skip does not pass": (ADD, "import pytest\ndef test_a():\n    _which_path()\n    pytest.skip('no')\n", False),
    "an xfail does not pass": (ADD, "import pytest\ndef test_a():\n    _which_path()\n    pytest.xfail('no')\n",
                               False),
    "a unittest skip does not pass": (ADD, "import unittest\ndef test_a():\n    _which_path()\n"
                                           "    raise unittest.SkipTest('no')\n", False),
    "SystemExit(0) fails": (ADD, "def test_a():\n    _which_path()\n    raise SystemExit(0)\n", False),
    "reading stdin fails as under pytest": (ADD, "import sys\ndef test_a():\n    _which_path()\n"
                                                 "    assert sys.stdin.read() == ''\n", False),
    "printing a lot in a passing test is captured": (ADD, "def test_a():\n    _which_path()\n"
                                                          "    print('x' * 1_000_000)\n    assert add(1, 2) == 3\n", True),
    "a warning turned into an error by the test fails": (ADD, "import warnings\ndef test_a():\n    _which_path()\n"
                                                              "    warnings.simplefilter('error')\n"
                                                              "    warnings.warn('w')\n", False),
    "a test bound at import time by globals()": (ADD, "def test_a():\n    assert add(1, 2) == 3\n"
                                                      "globals()['test_dyn'] = lambda: _which_path()\n", True),
    "the solution raises": ("def add(a, b):\n    raise ValueError('no')\n",
                            "def test_a():\n    _which_path()\n    assert add(1, 2) == 3\n", False),
    "the solution raises KeyboardInterrupt": ("def add(a, b):\n    raise KeyboardInterrupt\n",
                                              "def test_a():\n    _which_path()\n    assert add(1, 2) == 3\n", False),
    "pytest.raises still works": ("def add(a, b):\n    raise ValueError('no')\n",
                                  "import pytest\ndef test_a():\n    _which_path()\n"
                                  "    with pytest.raises(ValueError):\n        add(1, 2)\n", True),
    "asserts with side effects run as rewritten ones": (
        ADD, "CALLS = []\ndef f(x):\n    CALLS.append(x)\n    return x\n"
             "def test_a():\n    _which_path()\n    assert f(1) < f(2) < f(3)\n    assert f(0) or f(5)\n"
             "    assert (y := f(4)) == 4 and y\n    assert not f(0) and all(f(i) for i in (6, 7))\n"
             "    assert CALLS == [1, 2, 3, 0, 5, 4, 0, 6, 7], CALLS\n", True),
    "a chained comparison fails as rewritten": (ADD, "def test_a():\n    _which_path()\n"
                                                     "    assert 1 < add(1, 1) < 2\n", False),
    "helpers and data beside the tests": (ADD, "import math\nLIMIT = {'a': [1, 2]}\nclass Helper:\n    pass\n"
                                               "def check(f):\n    assert f(1, 2) == 3\n"
                                               "def test_a():\n    _which_path()\n    check(add)\n", True),
}


@pytest.mark.parametrize("name", sorted(DIRECT))
def test_plain_files_take_the_direct_path_with_pytests_verdict(name):
    _agree(DIRECT[name], ("direct",), ("pytest",))


FALLBACK = {  # name: (solution, test body, passes); each must go to pytest's runner
    "a fixture argument": (ADD, "import pytest\n@pytest.fixture\ndef x():\n    return 1\n"
                                "def test_a(x):\n    _which_path()\n    assert add(x, 2) == 3\n", True),
    "an autouse fixture decides": (ADD, "import pytest\nSTATE = []\n@pytest.fixture(autouse=True)\n"
                                        "def fill():\n    STATE.append(1)\n"
                                        "def test_a():\n    _which_path()\n    assert STATE == [1]\n", True),
    "a parameter with a default": (ADD, "def test_a(x=1):\n    _which_path()\n    assert add(x, 2) == 3\n", True),
    "parametrize": (ADD, "import pytest\n@pytest.mark.parametrize('x', [1, 2])\n"
                         "def test_a(x):\n    _which_path()\n    assert add(x, 0) == x\n", True),
    "a skip mark": (ADD, "import pytest\n@pytest.mark.skip\ndef test_a():\n    _which_path()\n", False),
    "a module mark": (ADD, "import pytest\npytestmark = pytest.mark.skip\ndef test_a():\n    _which_path()\n", False),
    "setup_module decides": (ADD, "STATE = []\ndef setup_module(m):\n    STATE.append(1)\n"
                                  "def test_a():\n    _which_path()\n    assert STATE == [1]\n", True),
    "setup_function decides": (ADD, "STATE = []\ndef setup_function(f):\n    STATE.append(1)\n"
                                    "def test_a():\n    _which_path()\n    assert STATE == [1]\n", True),
    "a Test class": (ADD, "class TestA:\n    def test_a(self):\n        _which_path()\n        assert add(1, 2) == 3\n",
                     True),
    "a unittest class of any name": (ADD, "import unittest\nclass Cases(unittest.TestCase):\n"
                                          "    def test_a(self):\n        _which_path()\n"
                                          "        self.assertEqual(add(1, 2), 3)\n", True),
    "a generator test": (ADD, "def test_a():\n    _which_path()\n    yield 1\n", False),
    "an async test": (ADD, "async def test_a():\n    _which_path()\n", False),
    "a wrapped test": (ADD, "import functools\ndef deco(f):\n    @functools.wraps(f)\n"
                            "    def inner():\n        return f()\n    return inner\n"
                            "@deco\ndef test_a():\n    _which_path()\n    assert add(1, 2) == 3\n", True),
    "__test__ = False": (ADD, "__test__ = False\ndef test_a():\n    _which_path()\n", False),
    "a helper marked __test__": (ADD, "def helper():\n    _which_path()\n    assert add(1, 2) == 4\n"
                                      "helper.__test__ = True\ndef test_a():\n    assert add(1, 2) == 3\n", False),
    "a mark bound by globals()": (ADD, "import pytest\nglobals()['pytest' + 'mark'] = pytest.mark.skip\n"
                                       "def test_a():\n    _which_path()\n", False),
    "a TestCase subclass through an alias": (ADD, "import unittest\nBase = unittest.TestCase\nclass Cases(Base):\n"
                                                  "    def test_a(self):\n        _which_path()\n"
                                                  "def test_b():\n    assert add(1, 2) == 3\n", True),
    "pytest_generate_tests": (ADD, "def pytest_generate_tests(metafunc):\n"
                                   "    if 'x' in metafunc.fixturenames:\n        metafunc.parametrize('x', [1, 2])\n"
                                   "def test_a(x):\n    _which_path()\n    assert add(x, 0) == x\n", True),
}


@pytest.mark.parametrize("name", sorted(FALLBACK))
def test_everything_else_runs_under_pytests_runner(name):
    _agree(FALLBACK[name], ("pytest", None), ("pytest", None))


INJECTED = {  # a solution that defines test-like names the test file uses freely (the star import binds them)
    "a test function": "def test_injected():\n    pass\n",
    "a Test class": "class TestInjected:\n    def test_x(self):\n        pass\n",
    "an object marked __test__": "class T:\n    __test__ = True\n    def __call__(self):\n        pass\n"
                                 "test_injected = TestInjected = T()\n",
    "a fixture": "import pytest\n@pytest.fixture(autouse=True)\ndef test_injected():\n    raise SystemExit(0)\n"
                 "TestInjected = test_injected\n",
}


@pytest.mark.parametrize("name", sorted(INJECTED))
def test_names_a_solution_binds_through_the_star_import_get_pytests_verdict(name):
    solution = ADD.replace("a + b", "a - b") + INJECTED[name]
    body = ("def test_a():\n    _which_path()\n    assert add(1, 2) == 3\n"
            "def test_uses():\n    assert test_injected is not None and TestInjected is not None\n")
    on, off = _both(solution, _tests(body))
    assert not on.passed and not off.passed
    _same(on, off)


EXITS = {  # the same verdict (fail), counted differently: pytest stops the session and counts nothing
    "KeyboardInterrupt in the test": "def test_a():\n    _which_path()\n    raise KeyboardInterrupt\n",
    "pytest.exit with status 0": "import pytest\ndef test_a():\n    _which_path()\n    pytest.exit('x', returncode=0)\n",
}


@pytest.mark.parametrize("name", sorted(EXITS))
def test_a_test_that_ends_the_session_fails_the_check(name):
    on, off = _both(ADD, _tests(EXITS[name] + "def test_b():\n    assert add(1, 2) == 3\n"))
    assert not on.passed and not off.passed, (on.stdout, off.stdout)
    assert _path(on) == "direct"


@pytest.mark.parametrize("head,why", [("import nosuchmodule\n", "ImportError"), ("def broken(:\n", "SyntaxError"),
                                      ("raise ValueError('at import')\n", "ValueError"),
                                      ("import pytest\npytest.skip('all', allow_module_level=True)\n", "skip")])
def test_a_file_that_does_not_import_is_a_collection_error_as_under_pytest(head, why):
    on, off = _both(ADD, _tests("def test_a():\n    assert add(1, 2) == 3\n", head=head))
    assert not on.passed
    _same(on, off)
    if why != "skip":
        assert "ERROR collecting test_solution.py" in on.stdout and why in on.stdout, on.stdout


def test_a_failure_is_reported_in_pytests_short_form():
    on, off = _both(SUB, _tests("def check(f):\n    assert f(1, 2) == 3\n"
                                "def test_a():\n    print('seen by the report')\n    _which_path()\n    check(add)\n"))
    assert not on.passed
    for result in (on, off):
        assert "in check" in result.stdout and "assert -1 == 3" in result.stdout, result.stdout
        assert "where -1 = " in result.stdout and "seen by the report" in result.stdout, result.stdout
        assert "FAILED test_solution.py::test_a - assert -1 == 3" in result.stdout, result.stdout


def test_a_job_with_other_files_runs_under_pytest():
    """A job with a file beside the solution and the tests (run_tests sends none, run_in_worker accepts them): a
    conftest.py or package file could change how pytest collects, so its tests never take the direct path."""
    tests = _tests("def test_a():\n    _which_path()\n    assert add(1, 2) == 3\n")
    files = {"solution.py": ADD, "test_solution.py": tests, "conftest.py": "X = 1\n"}
    args = ["test_solution.py", *PYTEST_ARGS[2:-1]]
    on = run_in_worker(_settings(True), files, args, "pytest", declared_tests(tests))
    off = run_in_worker(_settings(False), files, args, "pytest", declared_tests(tests))
    assert on.passed and off.passed, (on.stdout, off.stdout)
    assert _path(on) == _path(off) == "pytest"
    _same(on, off)


def test_a_failure_is_reported_with_the_values_even_when_the_tests_ran_unrewritten():
    """A plain file runs without pytest's assertion rewriting; its failed tests are run again, rewritten, after the
    verdict is written, for the report only."""
    tests = _tests("def test_a():\n    _which_path()\n    assert add(2, 2) == 5\n")
    on = run_python_tests(ADD, tests, _settings(True))
    assert not on.passed and on.tests_failed == 1 and _path(on) == "direct"
    assert "assert 4 == 5" in on.stdout and "where 4 = add(2, 2)" in on.stdout, on.stdout


def test_a_solution_that_passes_the_run_for_the_report_still_fails():
    """The second run (for the report) comes after the verdict: a solution right only on its second call fails,
    and the report says the test passed when run again."""
    flaky = "CALLS = [0]\ndef add(a, b):\n    CALLS[0] += 1\n    return a + b + (CALLS[0] == 1)\n"
    tests = _tests("def test_a():\n    _which_path()\n    assert add(2, 2) == 4\n")
    on, off = _both(flaky, tests)
    assert not on.passed and not off.passed
    _same(on, off)
    assert "passed when run again" in on.stdout + on.stderr, (on.stdout, on.stderr)


def test_a_test_runs_as_deep_in_the_stack_as_under_pytest():
    """Recursion near the limit ends the same way on both paths: the direct path calls a test under as many frames
    as pytest's runner has below it (direct._PYTEST_EXTRA_FRAMES; a new pytest that changes its depth fails here)."""
    tests = _tests("def test_a():\n    import os, sys\n    f, n = sys._getframe(), 0\n"
                   "    while f is not None:\n        n += 1\n        f = f.f_back\n"
                   "    _which_path()\n    os.write(1, b'DEPTH %d\\n' % n)\n")
    on, off = _both(ADD, tests)
    assert _path(on) == "direct"
    depths = [re.findall(r"DEPTH (\d+)", r.stdout) for r in (on, off)]
    assert depths[0] and depths[0] == depths[1], depths


def test_a_rewards_failed_tests_are_not_run_again_for_a_report():
    """run_tests(reward=True): nobody reads the report, so an unrewritten failed test is not run again."""
    tests = _tests("def test_a():\n    _which_path()\n    assert add(2, 2) == 5\n")
    reward = run_python_tests(ADD, tests, _settings(True).model_copy(update={"confirm_runs": 1}), reward=True)
    plain = run_python_tests(ADD, tests, _settings(True))
    assert not reward.passed and not plain.passed and _path(reward) == "direct"
    assert "where 4 = add(2, 2)" in plain.stdout and "where 4 = add(2, 2)" not in reward.stdout, reward.stdout
    assert "assert add(2, 2) == 5" in reward.stdout and "AssertionError" in reward.stdout, reward.stdout


def test_the_run_for_the_report_is_given_up_after_its_time():
    """A solution that sleeps on its second call (the run for the report) does not hold the check: after
    direct._RERUN_SECONDS the first report stands."""
    slow = "import time\nCALLS = [0]\ndef add(a, b):\n    CALLS[0] += 1\n    if CALLS[0] > 1:\n" \
           "        time.sleep(15)\n    return a - b\n"
    tests = _tests("def test_a():\n    _which_path()\n    assert add(2, 2) == 4\n")
    on = run_python_tests(slow, tests, _settings(True))
    assert not on.passed and on.tests_failed == 1 and not on.timed_out, on
    assert on.duration_s < 8, on.duration_s
    assert "took over 2 s: first reports" in on.stdout, on.stdout
