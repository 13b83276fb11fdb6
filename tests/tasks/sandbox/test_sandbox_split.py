"""The solution and the tests in separate processes (issue 23: tasks/sandbox/bridge.py, harness.py, worker.py).

First the hostile suite: every solution of evolforge.testing.sandbox_forgeries is wrong and tries one trick to be
judged passed; each of the five issue-23 forgeries and the always-equal results passed the single-process
harness (checked against the old tree with `PYTHONPATH=<old tree> python -m evolforge.testing.sandbox_forgeries`).
Each runs on warm workers and with one sandbox per check, and must fail. Then what the channel carries: plain
data both ways, handles, exceptions, output, in-place changes, callbacks, and what is "not checkable".
"""

from __future__ import annotations

import os

import pytest

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.run import run_many, run_python_tests
from evolforge.testing import sandbox_forgeries as F

pytestmark = pytest.mark.skipif(not os.access("/usr/bin/bwrap", os.X_OK), reason="bubblewrap not installed")

WORKER_MODES = pytest.mark.parametrize("reuse", [True, False], ids=["workers", "per-check"])


def _settings(**kw) -> SandboxSettings:
    base = dict(cpu_seconds=5, memory_mb=512, max_processes=32, wall_timeout_seconds=20, max_output_bytes=200_000,
                max_parallel=2)
    return SandboxSettings(**(base | kw))


def _run(solution: str, tests: str, reuse: bool = True, **kw):
    return run_python_tests(solution, tests, _settings(reuse_workers=reuse, **kw))


# ---------------------------------------------------------------- hostile solutions


@WORKER_MODES
@pytest.mark.parametrize("name", list(F.FORGERIES))
def test_forgery_fails(name, reuse):
    solution, tests = F.FORGERIES[name]
    r = _run(solution, tests, reuse)
    assert not r.passed, (name, r.stdout[-1500:], r.stderr[-1500:])
    assert r.verdict_error or r.killed_reason, r


@WORKER_MODES
@pytest.mark.parametrize("tests", [F.TESTS, F.SCRIPT, F.STAR_TESTS], ids=["pytest", "script", "star-import"])
def test_the_forgeries_tests_pass_a_right_solution(tests, reuse):
    r = _run(F.GOOD, tests, reuse)
    assert r.passed, (r.verdict_error, r.stdout[-1500:], r.stderr[-1500:])
    assert _run("def items(n):\n    return [0] * n\n", F.LEN_TESTS, reuse).passed


@WORKER_MODES
@pytest.mark.parametrize("name", ["F1-subclasses-closure", "F2-rebind-encoder", "F3-disable-tamper-check",
                                  "F5-prctl-memory-read", "builtins-override", "kill-parent"])
def test_in_process_tricks_leave_the_honest_failure(name, reuse):
    """What the trick touched is the solution's own process: the runner reports the wrong answer as it is."""
    solution, tests = F.FORGERIES[name]
    r = _run(solution, tests, reuse)
    assert not r.passed and r.tests_failed == 1 and r.verdict_error == "pytest exit status 1", r.verdict_error


@WORKER_MODES
def test_always_equal_results_are_compared_as_plain_data_or_not_at_all(reuse):
    for base in ("int", "str", "float"):  # subclasses of immutable types cross as the base type's value
        r = _run(F.ALWAYS_EQUAL[base], F.TESTS, reuse)
        assert not r.passed and r.tests_failed == 2 and r.not_checkable is None
    for base in ("list", "dict"):  # the solution's own mutable classes are handles: == on them is not checkable
        r = _run(F.ALWAYS_EQUAL[base], F.TESTS, reuse)
        assert not r.passed and "compares a solution object" in r.not_checkable
        assert r.verdict_error.startswith("not checkable: ")


@WORKER_MODES
def test_exits_and_stray_writes_break_the_channel(reuse):
    r = _run(*F.FORGERIES["exit-mid-test"], reuse)
    assert not r.passed and "solution process" in r.verdict_error
    r = _run(*F.FORGERIES["thread-keeps-writing"], reuse)
    assert not r.passed and ("solution process" in r.verdict_error or "thread" in r.verdict_error), r.verdict_error


@WORKER_MODES
def test_threads_and_processes_left_running_fail_a_right_answer(reuse):
    thread = "import threading, time\ndef add(a, b):\n    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n    return a + b\n"
    r = _run(thread, F.TESTS, reuse)
    assert not r.passed and r.tests_passed == 2 and "thread(s) running" in r.verdict_error, r.verdict_error
    child = "import subprocess\ndef add(a, b):\n    subprocess.Popen(['sleep', '60'])\n    return a + b\n"
    r = _run(child, F.TESTS, reuse)
    assert not r.passed and r.tests_passed == 2 and "child process(es)" in r.verdict_error, r.verdict_error
    joined = ("import threading\ndef add(a, b):\n    out = []\n    t = threading.Thread(target=lambda: out.append(a + b))\n"
              "    t.start()\n    t.join()\n    return out[0]\n")
    assert _run(joined, F.TESTS, reuse).passed  # threads that end before the call returns are fine


@WORKER_MODES
def test_a_solution_that_exits_at_import_fails(reuse):
    for exit_code in ("import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n", "raise SystemExit(3)\n"):
        r = _run(exit_code, "import solution\n\ndef test_nothing():\n    assert solution is not None\n", reuse)
        assert not r.passed and r.tests_passed in (None, 0) and "solution process" in r.verdict_error


@WORKER_MODES
def test_the_solution_sees_neither_the_tests_nor_the_runner(reuse):
    spy = ("import os\ndef look():\n    return {'files': sorted(os.listdir('.')), 'pids': sorted(p for p in os.listdir('/proc')"
           " if p.isdigit()), 'parent': os.getppid()}\n")
    tests = "from solution import look\n\ndef test_look():\n    assert look() == {'files': ['solution.py'], 'pids': ['1'], 'parent': 0}\n"
    r = _run(spy, tests, reuse)
    assert r.passed, (r.verdict_error, r.stdout[-1500:])


# ---------------------------------------------------------------- what the channel carries


STACK = """
from collections import Counter, namedtuple

Point = namedtuple("Point", "x y")


class StackError(IndexError):
    pass


class Stack:
    def __init__(self):
        self.items = []

    def push(self, x):
        self.items.append(x)
        return self

    def pop(self):
        if not self.items:
            raise StackError("pop from an empty stack")
        return self.items.pop()

    @property
    def size(self):
        return len(self.items)

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        return iter(list(self.items))


def parse(text):
    return int(text)


def letters(s):
    return Counter(s)


def point():
    return Point(1, 2)


def shout(s):
    print(s.upper())
    return len(s)


def sort_in_place(xs):
    xs.sort()


def apply(f, *args):
    return f(*args)


def total(node):
    n = 0
    while node is not None:
        n += node.val
        node = node.next
    return n


def relink(node):
    node.next = None
    return node


def gen(n):
    yield from range(n)
"""

CHANNEL_TESTS = """
import pytest
import solution
from solution import *


class Node:
    def __init__(self, val, next=None):
        self.val, self.next = val, next


def test_exceptions_keep_type_and_message():
    with pytest.raises(ValueError, match="invalid literal for int"):
        parse("x")
    with pytest.raises(StackError, match="empty stack"):
        Stack().pop()
    with pytest.raises(IndexError):  # the builtin base of the solution's exception
        Stack().pop()
    assert issubclass(solution.StackError, IndexError) and StackError.__name__ == "StackError"
    with pytest.raises(ZeroDivisionError):
        apply(lambda: 1 / 0)  # raised in the test's callback, through the solution, back to the test


def test_handles():
    s = Stack().push(1).push(2)
    assert isinstance(s, Stack) and len(s) == 2 and s.size == 2 and list(s) == [1, 2]
    assert s.pop() == 2 and s.items == [1]
    assert s is s and s == s


def test_plain_subclasses_cross_as_plain_data():
    assert letters("aab") == {"a": 2, "b": 1} and type(letters("aab")) is dict
    assert point() == (1, 2) and type(point()) is tuple
    assert list(gen(3)) == [0, 1, 2]


def test_output_and_in_place_changes(capsys):
    assert shout("hi") == 2
    assert capsys.readouterr().out == "HI\\n"
    xs = [3, 1, 2]
    sort_in_place(xs)
    assert xs == [1, 2, 3]


def test_callbacks_and_test_objects():
    assert apply(lambda x, y: x * y, 6, 7) == 42
    assert apply(len, "abcd") == 4 and apply(str.upper, "ab") == "AB"
    head = Node(1, Node(2, Node(3)))
    assert total(head) == 6
    assert relink(head) is head and head.next is None


@pytest.mark.parametrize("a,b", [(1, 2), (2, 3)])
def test_parametrize_and_approx(a, b):
    assert apply(lambda x, y: x / y, a, b) == pytest.approx(a / b)
"""


@WORKER_MODES
def test_the_channel_carries_what_tests_use(reuse):
    r = _run(STACK, CHANNEL_TESTS, reuse)
    assert r.passed, (r.verdict_error, r.stdout[-3000:], r.stderr[-1500:])
    assert (r.tests_passed, r.tests_failed) == (7, 0)


def test_the_same_in_rlimits_only_mode():
    r = run_python_tests(STACK, CHANNEL_TESTS, _settings(mode="rlimits-only"))
    assert r.passed, (r.verdict_error, r.stdout[-3000:], r.stderr[-1500:])


HUMANEVAL_LIKE = '''
def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
'''
CHECK = '''from solution import *

METADATA = {"author": "jt", "dataset": "test"}


def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False


check(has_close_elements)
'''


@WORKER_MODES
def test_humaneval_script_form(reuse):
    assert _run(HUMANEVAL_LIKE, CHECK, reuse).passed
    broken = HUMANEVAL_LIKE.replace("return any(", "return None and any(")
    r = _run(broken, CHECK, reuse)
    assert not r.passed and "AssertionError" in r.stderr


@WORKER_MODES
@pytest.mark.parametrize("tests,needle", [
    ("from solution import apply\n\ndef test_gen():\n    assert apply(list, (x for x in range(3))) == [0, 1, 2]\n",
     "cannot cross to the solution"),
    ("from solution import Stack\n\ndef test_eq():\n    assert Stack() == []\n", "compares a solution object"),
    ("from solution import Stack\n\ndef test_caught():\n    try:\n        assert Stack() != 1\n    except BaseException:\n"
     "        pass\n", "compares a solution object"),
], ids=["generator-argument", "handle-compared", "caught-but-sticky"])
def test_not_checkable(tests, needle, reuse):
    r = _run(STACK, tests, reuse)
    assert not r.passed and r.not_checkable and needle in r.not_checkable, (r.verdict_error, r.stdout[-1500:])
    assert r.verdict_error == "not checkable: " + r.not_checkable


def test_many_solutions_against_the_same_tests():
    """The PPO reward's shape: one test file, many solutions, in one run_many."""
    wrong = "def add(a, b):\n    return a - b\n"
    jobs = [(F.GOOD if i % 3 else wrong, F.TESTS) for i in range(12)] + [(F.GOOD, F.SCRIPT), (wrong, F.SCRIPT)]
    results = run_many(jobs, _settings(max_parallel=2))
    assert [r.passed for r in results] == [bool(i % 3) for i in range(12)] + [True, False]
