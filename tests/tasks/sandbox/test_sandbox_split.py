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

PER_CHECK = "one bwrap sandbox per check (reuse_workers = false); the warm-worker case, the default, stays"
# Both sandbox modes: warm workers (the default) in the quick tier, one bwrap sandbox per check (reuse_workers =
# false; a fresh sandbox and interpreter per check, 0.4 s of CPU each) in the full tier (make test-all, CI)
WORKER_MODES = pytest.mark.parametrize("reuse", [True, pytest.param(False, marks=pytest.mark.slow(PER_CHECK))],
                                       ids=["workers", "per-check"])


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
    r = _run(*F.FORGERIES["thread-keeps-writing"], reuse)  # a wrong answer: the tests' own failure may come first
    assert not r.passed, r.verdict_error
    # a right answer beside the thread that writes forged records on every descriptor: the stray writes or the
    # thread fail it, however soon after the last call the runner reports
    right = F.THREAD_KEEPS_WRITING.replace("return a - b", "return a + b")
    assert right != F.THREAD_KEEPS_WRITING
    r = _run(right, F.TESTS, reuse)
    assert not r.passed, (r.verdict_error, r.stdout[-500:])
    assert "solution process" in r.verdict_error or "thread" in r.verdict_error, r.verdict_error


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


# ---------------------------------------------------------------- round three (issue 36)
# The forgeries themselves are in F.FORGERIES (test_forgery_fails above runs every one in both modes); each of the
# round-three ones passed before issue 36 (`python -m evolforge.testing.sandbox_forgeries NAME` on the old tree).


@WORKER_MODES
@pytest.mark.parametrize("name", list(F.FAIR))
def test_round_three_tests_pass_a_right_solution(name, reuse):
    """The tests the forgeries attack are fair: a right solution passes them, every test counted."""
    solution, tests = F.FAIR[name]
    r = _run(solution, tests, reuse)
    assert r.passed, (name, r.verdict_error, r.stdout[-2000:], r.stderr[-1500:])


@WORKER_MODES
def test_stop_iteration_from_a_call_reaches_the_test_as_runtime_error(reuse):
    for solution in (F.STOP_ITERATION, F.STOP_ITERATION_SUBCLASS):
        r = _run(solution, F.PRIMES_TESTS, reuse)
        assert not r.passed and r.tests_failed == 4 and "RuntimeError" in r.stdout, (r.verdict_error, r.stdout[-1500:])
    # iterating a solution's iterator still ends with StopIteration (a generator, an iterator class of the task)
    tests = ("from solution import gen, Countdown\n\ndef test_iterate():\n    assert list(gen(3)) == [0, 1, 2]\n"
             "    assert list(Countdown(3)) == [3, 2, 1] and next(iter(Countdown(1))) == 1\n")
    solution = ("def gen(n):\n    yield from range(n)\n\nclass Countdown:\n    def __init__(self, n):\n        self.n = n\n"
                "    def __iter__(self):\n        return self\n    def __next__(self):\n        if self.n <= 0:\n"
                "            raise StopIteration\n        self.n -= 1\n        return self.n + 1\n")
    r = _run(solution, tests, reuse)
    assert r.passed, (r.verdict_error, r.stdout[-1500:])


@WORKER_MODES
def test_a_result_that_is_not_plain_data_answers_no_question(reuse):
    r = _run(F.DUCK_TYPED, F.SHOUT_TESTS, reuse)
    assert not r.passed and r.not_checkable and "did not import from the solution" in r.not_checkable
    for use in ("r.upper", "r('x')", "r[0]", "r.value"):  # a method, a call, a question with an argument, an attribute
        tests = f"from solution import make\n\ndef test_use():\n    r = make()\n    assert {use}\n"
        solution = "class _Duck:\n    value = 1\n    def __call__(self, x):\n        return True\n" \
                   "    def __getitem__(self, k):\n        return True\n" \
                   "def make():\n    return _Duck()\n"
        r = _run(solution, tests, reuse)
        assert not r.passed and r.not_checkable, (use, r.verdict_error)
    # the task's own classes (imported by the test) keep their methods, on instances the solution returns too
    tests = ("from solution import Stack, build\n\ndef test_stack():\n    s = build([1, 2])\n"
             "    assert s.pop() == 2 and s.size == 1 and len(s) == 1\n")
    solution = ("class Stack:\n    def __init__(self):\n        self.items = []\n    def pop(self):\n"
                "        return self.items.pop()\n    @property\n    def size(self):\n        return len(self.items)\n"
                "    def __len__(self):\n        return len(self.items)\n\n"
                "def build(xs):\n    s = Stack()\n    s.items = list(xs)\n    return s\n")
    r = _run(solution, tests, reuse)
    assert r.passed, (r.verdict_error, r.stdout[-1500:])


@WORKER_MODES
def test_nan_compared_is_not_checkable_but_a_test_may_expect_nan(reuse):
    r = _run(F.NAN, F.AREA_TESTS, reuse)
    assert not r.passed and "compares a NaN" in (r.not_checkable or ""), r.verdict_error
    tests = ("import math\nfrom solution import area\n\ndef test_nan():\n    a = area(-1)\n"
             "    assert math.isnan(a) and a != a and math.isnan(a + 1)\n")
    r = _run("def area(r):\n    return float('nan') if r < 0 else 3.14 * r * r\n", tests, reuse)
    assert r.passed, (r.verdict_error, r.stdout[-1500:])


@WORKER_MODES
def test_star_import_binds_only_the_names_the_test_expects(reuse):
    r = _run(F.STAR_REBINDS, F.HYP_TESTS, reuse)
    assert not r.passed and r.tests_failed == 2, r.verdict_error  # the test's own math: hyp(3, 4) = 0.0 fails
    tests = "from solution import *\n\ndef test_names():\n    assert add(1, 2) == 3\n    assert 'helper' not in globals()\n"
    r = _run(F.GOOD + "def helper():\n    return 1\n", tests, reuse)
    assert r.passed, (r.verdict_error, r.stdout[-1500:])


@WORKER_MODES
def test_unittest_files_run_under_the_test_runner(reuse):
    r = _run(F.WRONG, F.UNITTEST_TESTS, reuse)
    assert r.runner == "pytest" and not r.passed and (r.tests_passed, r.tests_failed) == (1, 1), r.verdict_error
    r = _run(F.GOOD, F.UNITTEST_MAIN_TESTS, reuse)
    assert r.runner == "pytest" and r.passed and r.tests_passed == 2, r.verdict_error
    empty = "import unittest\nfrom solution import add\n\n\nclass Nothing(unittest.TestCase):\n    pass\n"
    r = _run(F.GOOD, empty, reuse)
    assert not r.passed and r.tests_passed == 0 and r.verdict_error in ("no tests collected", "pytest exit status 5")


def _humaneval(task_id: str):
    from evolforge.tasks.problems.benchmarks import humaneval_problems

    return next(p for p in humaneval_problems() if p.id == task_id)


# a completion (after the prompt) that rebinds the helper check() trusts, and answers with the helper's inverse
HELPER_FORGERIES = {
    "HumanEval/32": "    return 0.0\n\n\ndef poly(xs, x):\n    return 0.0\n",
    "HumanEval/38": "    return s\n\n\ndef encode_cyclic(s):\n    return s\n",
    "HumanEval/50": "    return s\n\n\ndef encode_shift(s):\n    return s\n",
}


@WORKER_MODES
@pytest.mark.parametrize("task_id", list(HELPER_FORGERIES))
def test_humaneval_helpers_come_from_the_prompt(task_id, reuse):
    """The eval's own HumanEval path (tasks/eval/prompts.py sandbox_job): a completion that rebinds a helper of the
    prompt is checked against the prompt's helper, and fails; the canonical solution passes."""
    from evolforge.tasks.eval.prompts import sandbox_job

    p = _humaneval(task_id)
    solution, tests = sandbox_job(p, HELPER_FORGERIES[task_id], "humaneval_completion")
    r = _run(solution, tests, reuse)
    assert not r.passed and "AssertionError" in r.stderr, (r.verdict_error, r.stderr[-1500:])
    solution, tests = sandbox_job(p, p.check["canonical_solution"], "humaneval_completion")
    assert _run(solution, tests, reuse).passed


def _hashes(strings: list[str], seed: int) -> list[int]:
    import subprocess
    import sys

    code = "import sys\nfor s in sys.argv[1:]:\n    print(hash(s))\n"
    out = subprocess.run([sys.executable, "-c", code, *strings], env={"PYTHONHASHSEED": str(seed)},
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


@WORKER_MODES
def test_a_flaky_solution_never_passes_as_a_reward(reuse):
    """Right when the hash of a string is odd (so on about half the hash seeds): judged on one run, it was paid on
    about half the runs. As a reward (confirm_runs=2, seeds 1 and 2) it never passes: 20 repeated runs. The
    string is picked so the solution is right under seed 1 and wrong under seed 2 (the confirmation must catch
    it; a string right under both would be a solution our seeds cannot tell from a right one)."""
    from evolforge.tasks.sandbox.host import hash_seed

    names = [f"evolforge-flaky-{i}" for i in range(64)]
    under1, under2 = _hashes(names, hash_seed(0)), _hashes(names, hash_seed(1))
    name = next(n for n, a, b in zip(names, under1, under2) if a % 2 and not b % 2)
    flaky = f"def add(a, b):\n    return a + b if hash({name!r}) % 2 else a - b\n"
    settings = _settings(reuse_workers=reuse, confirm_runs=2)
    assert run_python_tests(flaky, F.TESTS, settings).passed  # one run (seed 1): the lucky seed
    results = run_many([(flaky, F.TESTS)] * 20, settings, reward=True)
    assert not any(r.passed for r in results)
    assert all(r.runs == 2 and "confirmation run 2 of 2" in r.verdict_error for r in results), results[0].verdict_error
    right = run_python_tests(F.GOOD, F.TESTS, settings, reward=True)
    assert right.passed and right.runs == 2
    wrong = run_python_tests(F.WRONG, F.TESTS, settings, reward=True)
    assert not wrong.passed and wrong.runs == 1  # a failing first run is not re-run
    seeds = "import sys\ndef seed():\n    return hash('x')\n"
    seen = {_run(seeds, "from solution import seed\nassert seed() == %d\n" % h, reuse).passed
            for h in _hashes(["x"], hash_seed(0))}
    assert seen == {True}  # the first run's hash seed is hash_seed(0), on a warm worker as on a fresh one


SOCKET_PROBE = """
import socket


def probe(port):
    seen = {}
    for name, family, address in (("abstract", socket.AF_UNIX, "\\0evolforge-probe"),
                                  ("tcp", socket.AF_INET, ("127.0.0.1", port))):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(address)
            seen[name] = True
        except OSError:
            seen[name] = False
        finally:
            s.close()
    return seen
"""
SOCKET_TESTS = """
import socket
from solution import probe


def test_the_runners_sockets_are_out_of_reach():
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\\0evolforge-probe")
    srv.listen(1)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    assert probe(tcp.getsockname()[1]) == {"abstract": False, "tcp": False}
"""


@WORKER_MODES
def test_the_solution_has_its_own_network_namespace(reuse):
    """The runner's abstract unix socket and a TCP listener on its loopback are not reachable from the solution."""
    r = _run(SOCKET_PROBE, SOCKET_TESTS, reuse)
    assert r.passed, (r.verdict_error, r.stdout[-1500:], r.stderr[-800:])
