"""Adversarial probes of the direct path (tasks/sandbox/direct.py): a solution (and ordinary generated test files)
trying to get a different verdict with sandbox.pytest_direct on than off. Each check runs both ways (the helpers of
test_sandbox_direct.py). HELD: the verdicts agree, as they must. The tests after them are the differences the
review found: those fixed since are plain tests (a comment says what differed); the one left is an xfail(strict)
that asserts the two agree, its reason saying how they differ and why."""

from __future__ import annotations

import os

import pytest

from tests.tasks.sandbox.test_sandbox_direct import ADD, _agree, _both, _path, _same, _tests

pytestmark = pytest.mark.skipif(not os.access("/usr/bin/bwrap", os.X_OK), reason="bubblewrap not installed")

CALL = "def test_a():\n    _which_path()\n    assert add(1, 2) == 3\n"

HELD = {  # name: (solution, test body, passes); the same verdict, counts and reason on and off
    "a solution exception subclassing KeyboardInterrupt": (
        "class Stop(KeyboardInterrupt):\n    pass\ndef add(a, b):\n    raise Stop()\n", CALL, False),
    "a solution exception subclassing SystemExit": (
        "class Stop(SystemExit):\n    pass\ndef add(a, b):\n    raise Stop(0)\n", CALL, False),
    "a solution raising GeneratorExit": ("def add(a, b):\n    raise GeneratorExit\n", CALL, False),
    "solution exceptions named as pytest's outcomes": (
        "class Skipped(BaseException):\n    pass\nclass SkipTest(Exception):\n    pass\n"
        "class XFailed(Exception):\n    pass\ndef add(a, b):\n    raise SkipTest('skip me')\n", CALL, False),
    "a solution exception named XFailed": ("class XFailed(Exception):\n    pass\ndef add(a, b):\n    raise XFailed('x')\n",
                                           CALL, False),
    "a solution exception named Exit deriving from BaseException": (
        "class Exit(BaseException):\n    pass\ndef add(a, b):\n    raise Exit('x')\n", CALL, False),
    "StopIteration from the solution does not end the test's map()": (
        "def add(a, b):\n    raise StopIteration\n",
        "def test_a():\n    _which_path()\n    assert list(map(add, [1, 2], [2, 3])) in ([3, 5], [])\n", False),
    "an ExceptionGroup from the solution": (
        "def add(a, b):\n    raise ExceptionGroup('g', [ValueError('v')])\n",
        "def test_a():\n    _which_path()\n    try:\n        add(1, 2)\n    except* ValueError:\n        pass\n", True),
    "a solution object's truth asked once": (
        "class R:\n    def __bool__(self):\n        return True\ndef add(a, b):\n    return R()\n",
        "def test_a():\n    _which_path()\n    assert add(1, 2)\n", True),
    "a solution object compared": (
        "class R:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return R()\n", CALL, False),
    "a solution object compared inside a chain the first link passes": (
        "class R:\n    def __lt__(self, other):\n        return True\n    def __gt__(self, other):\n        return True\n"
        "def add(a, b):\n    return R()\n",
        "def test_a():\n    _which_path()\n    assert 0 < 1 < add(1, 2)\n", False),
    "a NaN the test compares": ("def add(a, b):\n    return float('nan')\n",
                                "def test_a():\n    _which_path()\n    assert not add(1, 2) > 3\n", False),
    "the solution prints a lot at import and in a passing test": (
        "print('x' * 3_000_000)\ndef add(a, b):\n    print('y' * 3_000_000)\n    return a + b\n", CALL, True),
    "the solution prints to stderr in a failing test": (
        "import sys\ndef add(a, b):\n    sys.stderr.write('z' * 100_000)\n    return a - b\n", CALL, False),
    "a warning the test raises about the solution's result": (
        ADD, "import warnings\ndef test_a():\n    _which_path()\n    warnings.warn(str(add(1, 2)))\n"
             "    assert add(1, 2) == 3\n", True),
    "a warning filter set to error at the module's top": (
        ADD, "import warnings\nwarnings.simplefilter('error')\ndef test_a():\n    _which_path()\n"
             "    warnings.warn('w')\n", True),
    "module-level stdin read is a collection error": (
        ADD, "import sys\nDATA = sys.stdin.read()\ndef test_a():\n    _which_path()\n    assert add(1, 2) == 3\n", False),
    "module-level data from the solution": (
        "def add(a, b):\n    return a + b\nTABLE = [(1, 2, 3), (2, 2, 4)]\n",
        "EXPECTED = [add(a, b) for a, b, _ in TABLE]\ndef test_a():\n    _which_path()\n"
        "    assert EXPECTED == [c for _, _, c in TABLE]\n", True),
    "an assert inside a helper, caught by the test": (
        "def add(a, b):\n    return a - b\n",
        "def check(x):\n    assert add(x, 1) == x + 1\ndef test_a():\n    _which_path()\n    try:\n        check(2)\n"
        "    except AssertionError:\n        return\n    raise ValueError('add is right')\n", True),
    "recursion both paths allow": (ADD, "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
                                        "def test_a():\n    _which_path()\n    assert depth(900) == add(899, 1)\n", True),
    "global state across tests, in definition order": (
        "def add(a, b):\n    return a + b\n",
        "SEEN = []\ndef test_b():\n    _which_path()\n    SEEN.append('b')\n"
        "def test_a():\n    SEEN.append('a')\n    assert SEEN == ['b', 'a'] and add(1, 2) == 3\n", True),
    "a test rebinding a later test while running": (
        ADD, "def test_a():\n    _which_path()\n    global test_b\n    test_b = lambda: None\n"
             "def test_b():\n    assert add(1, 2) == 4\n", False),
    "a solution thread still running when the tests end": (
        "import threading, time\ndef add(a, b):\n    threading.Thread(target=time.sleep, args=(1,)).start()\n"
        "    return a + b\n", CALL, False),
    "the solution process exits in its only call": ("import os\ndef add(a, b):\n    os._exit(0)\n", CALL, False),
    "the environment seen by a test": (
        ADD, "import os\ndef test_a():\n    _which_path()\n"
             "    assert os.environ['PYTEST_CURRENT_TEST'] == 'test_solution.py::test_a (call)'\n", True),
}


@pytest.mark.parametrize("name", sorted(HELD))
def test_held(name):
    _agree(HELD[name], ("direct", None), ("pytest", None))


@pytest.mark.parametrize("how", ["os._exit(3)", "os.kill(os.getpid(), 9)", "time.sleep(0.5)",
                                 "print('x' * 100_000)"])
def test_what_the_solution_does_in_the_report_rerun_changes_nothing(how):
    """The failed test is called again after the verdict (for the report): whatever the solution does on that
    second call, the record (verdict, counts, reason) is the one pytest's runner gives."""
    solution = f"import os, time\nN = [0]\ndef add(a, b):\n    N[0] += 1\n    if N[0] == 2:\n        {how}\n" \
               "    return a - b\n"
    on, off = _both(solution, _tests(CALL))
    assert not on.passed and not off.passed
    assert _path(on) == "direct"
    _same(on, off)
    assert on.killed_reason == off.killed_reason and on.exit_code == off.exit_code == 1


def test_a_report_rerun_that_passes_does_not_pass_the_check():
    """Right only from the second call on: the rerun passes, the record stays failed."""
    solution = "N = [0]\ndef add(a, b):\n    N[0] += 1\n    return a + b if N[0] > 1 else 0\n"
    on, off = _both(solution, _tests(CALL + "def test_b():\n    assert add(2, 2) == 4\n"))
    assert not on.passed and not off.passed
    _same(on, off)


# ------------------------------ differences the review found: fixed (plain tests), or kept and documented (xfail)

BOOL = "class R:\n    n = 0\n    def __bool__(self):\n        R.n += 1\n        return {}\ndef f():\n    return R()\n"


# fixed after review (both paths now agree); the difference was:
# solution-controlled (a solution passes only on the direct path): pytest's rewritten `assert r or x` asks bool(r)
# twice (the `or`, then the assert on the result), plain Python once; a solution object truthy only on its
# first __bool__ passes direct (True) and fails under pytest's runner (False). Any BoolOp operand that is a
# solution object (bool is a free op over the bridge) is affected.
def test_or_asks_a_solution_object_for_its_truth_once_on_the_direct_path():
    on, off = _both(BOOL.format("R.n == 1"), _tests("def test_a():\n    _which_path()\n    assert f() or False\n"))
    assert not off.passed
    assert _path(on) == "direct"
    _same(on, off)


# fixed after review (both paths now agree); the difference was:
# the mirror image: rewritten `assert r and x` with r falsy asks bool(r) again for the assert, so a solution
# object falsy on its first __bool__ and truthy after passes under pytest's runner WITHOUT x being evaluated,
# and fails on the direct path (pytest's own leniency; the direct path is the stricter one here)
def test_and_asks_a_falsy_solution_object_twice_under_pytest():
    on, off = _both(BOOL.format("R.n != 1"), _tests("def test_a():\n    _which_path()\n    assert f() and False\n"))
    assert _path(on) == "direct"
    _same(on, off)


# fixed after review (both paths now agree); the difference was:
# plain data, a correct stateful solution: pytest's rewriter evaluates every operand of a chained comparison
# (no short-circuit), plain Python stops at the first false link; `assert 5 < 3 < next_id() or next_id() == 1`
# calls next_id once on the direct path (passes) and twice under pytest (fails)
def test_a_chained_comparison_calls_the_solution_fewer_times_on_the_direct_path():
    solution = "N = [0]\ndef next_id():\n    N[0] += 1\n    return N[0]\n"
    on, off = _both(solution, _tests("def test_a():\n    _which_path()\n    assert 5 < 3 < next_id() or next_id() == 1\n"))
    assert not off.passed
    _same(on, off)


# fixed after review (both paths now agree); the difference was:
# plain data, ADD: a walrus in a later operand of a chained comparison runs under pytest's rewriting even when
# an earlier link is false; `x = 1; assert (add(1, 1) > 3 > (x := 0)) or x == 1` passes direct, fails pytest
def test_a_walrus_in_a_chained_comparison_binds_only_under_pytest():
    on, off = _both(ADD, _tests("def test_a():\n    _which_path()\n    x = 1\n"
                                "    assert (add(1, 1) > 3 > (x := 0)) or x == 1\n"))
    _same(on, off)


@pytest.mark.xfail(strict=True, reason=(
    "both fail, classified differently: a wrong-length list with a NaN (`[1.0, nan] == [1.0, 2.0, 3.0]` is False "
    "without comparing elements); pytest's failure explanation then compares element by element and hits the NaN, "
    "so under pytest the run is 'not checkable', on the direct path a plain failure (the rewritten rerun hits it "
    "too, after the record)"))
def test_a_nan_met_only_by_the_failure_explanation_is_not_checkable_only_under_pytest():
    on, off = _both("def f():\n    return [1.0, float('nan')]\n",
                    _tests("def test_a():\n    _which_path()\n    assert f() == [1.0, 2.0, 3.0]\n"))
    assert not on.passed and not off.passed
    _same(on, off)


# fixed after review (both paths now agree); the difference was:
# test file pytest cannot import: an assert over a 700-term `1 + 1 + ...` is a RecursionError in pytest's
# (recursive) assertion rewriter, a collection error (exit 2); compile_plain compiles it unrewritten and the
# direct path passes ADD. compile_plain does not check that pytest's rewrite of the file would succeed
def test_an_assert_too_deep_for_pytests_rewriter_passes_only_on_the_direct_path():
    chain = " + ".join(["1"] * 700)
    on, off = _both(ADD, _tests(f"def test_a():\n    _which_path()\n    assert add(699, 1) == {chain}\n"))
    _same(on, off)


# fixed after review (both paths now agree); the difference was:
# recursion headroom: a test runs 13 frames deep on the direct path and 33 under pytest's runner (limit
# 1000), so a recursive helper of depth 975 passes direct and is a RecursionError under pytest
def test_recursion_near_the_limit_passes_only_on_the_direct_path():
    on, off = _both(ADD, _tests("def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
                                "def test_a():\n    _which_path()\n    assert depth(975) == add(975, 0)\n"))
    _same(on, off)


# fixed after review (both paths now agree); the difference was:
# logging: under pytest's runner the logging plugin's handlers are on the root logger during a test, so
# logging.basicConfig() does nothing; on the direct path the root logger has no handler and basicConfig
# configures it: a test reading its log through basicConfig(stream=...) passes only on the direct path
def test_logging_basic_config_takes_effect_only_on_the_direct_path():
    on, off = _both(ADD, _tests("import io, logging\ndef test_a():\n    _which_path()\n    buf = io.StringIO()\n"
                                "    logging.basicConfig(stream=buf, level=logging.INFO)\n"
                                "    logging.info('sum %d', add(1, 2))\n"
                                "    assert buf.getvalue() == 'INFO:root:sum 3\\n'\n"))
    _same(on, off)


# fixed after review (both paths now agree); the difference was:
# a module-level __getattr__ (PEP 562) in the test file: pytest reads __test__, pytestmark, setup_module,
# pytest_generate_tests, ... with getattr on the module, so `def __getattr__(name): return None` makes it
# collect nothing (exit 5); plain_tests only looks at the module's __dict__ and the direct path runs and
# passes the test
def test_a_module_getattr_changes_pytests_collection_but_not_the_direct_path():
    on, off = _both(ADD, _tests("def __getattr__(name):\n    return None\n" + CALL))
    _same(on, off)
