"""The sandbox's verdict cannot be forged by the code under test (tasks/sandbox/run.py, verdict.py, harness.py).

Each hostile solution below tries to make a wrong or incomplete solution pass; each of them passed the
verdict that parsed pytest's summary line from stdout, and several the single-process harness after it. The
verdict now comes from the runner's result channel (a pipe only the runner holds, each record carrying a
per-run nonce), and the solution runs in another process (tasks/sandbox/bridge.py). The issue-23 forgeries
and the runner/solution channel itself are in test_sandbox_split.py.
"""

from __future__ import annotations

import json
import os

import pytest

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.run import run_python_tests
from evolforge.tasks.sandbox.verdict import declared_tests, judge

HAS_BWRAP = os.access("/usr/bin/bwrap", os.X_OK)
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap not installed (apt-get install -y bubblewrap)")

TESTS = "from solution import add\n\ndef test_small():\n    assert add(1, 2) == 3\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
SCRIPT = "from solution import add\nassert add(2, 2) == 4\n"
GOOD = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
FAKE = "\\n2 passed in 0.01s\\n"  # pytest's summary line, as the old verdict parsed it
WRITE_FAKE_EVERYWHERE = (  # the saved real stdout is one of these fds: pytest's capture cannot hide it
    "import os\nfor _fd in range(1, 65):\n    try:\n"
    f"        os.write(_fd, b'{FAKE}')\n    except OSError:\n        pass\n"
)
GUESS = "0" * 32
FORGED = json.dumps({"nonce": GUESS, "kind": "final", "runner": "pytest", "collected": 2, "passed": 2, "failed": 0,
                     "errors": 0, "skipped": 0, "exitstatus": 0, "tampered": []})
# every descriptor the process has (the result channel's number depends on the host process's open files:
# in a long test session it is well above 64), and the low ones in case /proc is not there
_EVERY_FD = ("sorted(set(range(3, 65)) | ({int(f) for f in os.listdir('/proc/self/fd')} "
             "if os.path.isdir('/proc/self/fd') else set()))")
FORGE_EVERY_FD = (
    f"import os\nfor _fd in {_EVERY_FD}:\n    try:\n"
    f"        os.write(_fd, {(FORGED + chr(10)).encode()!r})\n    except OSError:\n        pass\n"
)
BOTH_MODES = pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), "rlimits-only"])


def _settings(**kw) -> SandboxSettings:
    base = dict(cpu_seconds=5, memory_mb=512, max_processes=32, wall_timeout_seconds=20,
                max_output_bytes=200_000, max_parallel=2)
    return SandboxSettings(**(base | kw))


def _run(solution: str, tests: str = TESTS, mode: str = "bwrap", **kw):
    return run_python_tests(solution, tests, _settings(mode=mode, **kw))


# ---------------------------------------------------------------- hostile solutions (each passed before)
# The solution runs in its own process: what it writes, closes, patches or exits touches neither the runner
# nor its result channel. Each of these now fails as a wrong solution, or because the channel to it broke.


@BOTH_MODES
def test_fake_summary_and_exit_at_import_fails(mode):
    r = _run(WRONG + WRITE_FAKE_EVERYWHERE + "os._exit(0)\n", mode=mode)
    assert not r.passed and r.tests_passed in (None, 0) and r.verdict_error


@BOTH_MODES
def test_exit_inside_a_test_fails(mode):
    sol = "def add(a, b):\n" + "".join("    " + line + "\n" for line in WRITE_FAKE_EVERYWHERE.splitlines()) + "    os._exit(0)\n"
    r = _run(sol, mode=mode)
    assert not r.passed and r.tests_passed == 0 and r.verdict_error


@BOTH_MODES
def test_forged_records_on_every_fd_fail(mode):
    r = _run(WRONG + FORGE_EVERY_FD + WRITE_FAKE_EVERYWHERE + "os._exit(0)\n", mode=mode)
    assert not r.passed and r.tests_passed in (None, 0) and r.verdict_error


@BOTH_MODES
def test_a_forged_line_fails_even_a_correct_solution(mode):
    """The lines it writes on its own descriptors reach the runner only as garbage on the channel: the run fails."""
    r = _run(GOOD + FORGE_EVERY_FD, mode=mode)
    assert not r.passed and r.verdict_error


@BOTH_MODES
@pytest.mark.parametrize("exit_code", ["import sys\nsys.exit(0)\n", "raise SystemExit\n", "raise SystemExit(0)\n",
                                       "import os\nos._exit(0)\n"])
def test_script_runner_early_exit_fails(mode, exit_code):
    r = _run(WRONG + exit_code, SCRIPT, mode=mode)
    assert r.runner == "script" and not r.passed and "solution" in r.verdict_error, r.verdict_error


@BOTH_MODES
def test_system_exit_in_the_script_itself_fails(mode):
    r = _run(GOOD, SCRIPT + "import sys\nsys.exit(0)\n", mode=mode)
    assert r.exit_code == 0 and not r.passed and "SystemExit" in r.verdict_error


@BOTH_MODES
@pytest.mark.parametrize("tests", [TESTS, SCRIPT])
def test_closing_every_fd_at_import_fails(mode, tests):
    close_all = f"import os\nfor _fd in {_EVERY_FD}:\n    if _fd > 2:\n        try:\n            os.close(_fd)\n" \
                "        except OSError:\n            pass\n"
    r = _run(close_all + GOOD, tests, mode=mode)
    assert not r.passed and r.verdict_error


@BOTH_MODES
def test_the_test_module_is_out_of_the_solutions_reach(mode):
    """The solution swapped the test module (and printed a summary after pytest's) in the single-process harness;
    here there is no test module in its process: the swap fails at import and the run fails."""
    sol = WRONG + (
        "import atexit, os, sys, types\n"
        "_fake = types.ModuleType('test_solution')\n_fake.__file__ = sys.modules['test_solution'].__file__\n"
        "sys.modules['test_solution'] = _fake\n"
        f"atexit.register(lambda: (sys.stdout.write('{FAKE}'), sys.stdout.flush(), os._exit(0)))\n"
    )
    r = _run(sol, mode=mode)
    assert not r.passed and "KeyError" in r.stdout + r.stderr and r.tests_passed in (None, 0)


@BOTH_MODES
def test_hiding_tests_fails(mode):
    """A test file that declares more tests than it collects fails (here: the module-level code deletes one)."""
    tests = TESTS + "\ndel test_zero\n"
    r = _run(GOOD, tests, mode=mode)
    assert not r.passed and "declares 2" in r.verdict_error


PATCH_CALL_AND_REPORT = WRONG + """
import _pytest.runner as _runner
_orig = _runner.call_and_report
def _flip(item, when, log=True, **kw):
    rep = _orig(item, when, log=False, **kw)
    if rep.failed:
        rep.outcome, rep.longrepr = "passed", None
    if log:
        item.ihook.pytest_runtest_logreport(report=rep)
    return rep
_runner.call_and_report = _flip
"""


@BOTH_MODES
def test_patching_pytest_in_the_solution_changes_nothing(mode):
    """Failed reports flipped to passed, CallInfo made blind: in the solution's process, not the runner's."""
    r = _run(PATCH_CALL_AND_REPORT, mode=mode)
    assert "1 failed, 1 passed" in r.stdout  # pytest (the runner's) was not fooled
    assert not r.passed and (r.tests_passed, r.tests_failed) == (1, 1)
    blind = WRONG + (
        "import _pytest.runner as _runner\n_orig = _runner.CallInfo.from_call.__func__\n"
        "def _quiet(cls, func, when, reraise=None):\n    info = _orig(cls, func, when, reraise)\n"
        "    info.excinfo = None\n    return info\n"
        "_runner.CallInfo.from_call = classmethod(_quiet)\n"
    )
    r = _run(blind, mode=mode)
    assert not r.passed and (r.tests_passed, r.tests_failed) == (1, 1)


@BOTH_MODES
def test_builtins_patched_by_the_solution_stay_in_its_process(mode):
    patch = "import builtins\nbuiltins.len = lambda x: 2\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n"
    assert not _run(WRONG + patch, mode=mode).passed
    uses_len = "from solution import add\n\ndef test_len():\n    assert len([add(1, 2)]) == 1 and add(1, 2) == 3\n"
    r = _run(GOOD + patch, uses_len, mode=mode)  # the runner's len and AssertionError are its own
    assert r.passed, (r.verdict_error, r.stdout[-1500:])


# ---------------------------------------------------------------- what the solution's own process holds


@BOTH_MODES
def test_the_solutions_process_holds_no_nonce(mode):
    """Everything the single-process harness had to refuse (gc scans, ctypes, /proc/*/mem) is the solution's to
    use now: its own interpreter holds nothing of the verdict. It scans itself for nonce-shaped strings and the
    memory of every process it can see, and forges a record with each on every descriptor: the run fails."""
    scan = WRONG + (
        "import gc, json, os, re\n_found = set()\n"
        "for _o in gc.get_objects():\n"
        "    for _v in (_o.values() if isinstance(_o, dict) else [_o]):\n"
        "        if isinstance(_v, str) and re.fullmatch('[0-9a-f]{32}', _v):\n            _found.add(_v)\n"
        "for _pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n        with open(f'/proc/{_pid}/mem', 'rb') as _m:\n            _m.read(1)\n"
        "    except (OSError, ValueError):\n        pass\n"
        f"for _n in sorted(_found):\n    _rec = (json.dumps(dict({json.loads(FORGED)!r}, nonce=_n)) + '\\n').encode()\n"
        f"    for _fd in {_EVERY_FD}:\n        try:\n            os.write(_fd, _rec)\n        except OSError:\n"
        "            pass\n"
    )
    r = _run(scan, mode=mode)
    assert not r.passed and r.verdict_error


@needs_bwrap
def test_memory_of_the_runner_is_not_readable_by_a_child_process():
    """The runner is not dumpable: a fresh child (its own test's) cannot read its memory in /proc/<ppid>/mem."""
    tests = (
        "import os, subprocess, sys\n\ndef test_child_reads_parent():\n"
        "    code = 'import os; open(\"/proc/%d/mem\" % os.getppid(), \"rb\")'\n"
        "    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)\n"
        "    assert r.returncode != 0 and 'PermissionError' in r.stderr, r.stderr\n"
    )
    r = _run("", tests)
    assert r.passed, r.stdout[-1500:]


# ---------------------------------------------------------------- ordinary runs still pass or fail


@BOTH_MODES
def test_ordinary_pytest_features_still_pass(mode):
    tests = (
        "import unittest\n\nimport pytest\nfrom solution import add\n\n\n@pytest.fixture\ndef test_data():\n    return [(1, 2, 3), (2, 2, 4)]\n\n\n"
        "@pytest.mark.parametrize('a,b,c', [(1, 1, 2), (2, 3, 5), (-1, 1, 0)])\ndef test_param(a, b, c):\n    assert add(a, b) == c\n\n\n"
        "def test_fixture(test_data, tmp_path, capsys, monkeypatch):\n    monkeypatch.setenv('X', '1')\n"
        "    for a, b, c in test_data:\n        assert add(a, b) == c\n    print('hello')\n"
        "    assert capsys.readouterr().out == 'hello\\n'\n    (tmp_path / 'f').write_text('x')\n\n\n"
        "def test_raises_and_approx():\n    with pytest.raises(TypeError):\n        add(1, 'x')\n"
        "    assert add(0.1, 0.2) == pytest.approx(0.3)\n\n\n"
        "class TestAdd:\n    def test_method(self):\n        assert add(2, 2) == 4\n\n"
        "    @pytest.mark.parametrize('n', range(3))\n    def test_many(self, n):\n        assert add(n, 0) == n\n\n\n"
        "class TestUnit(unittest.TestCase):\n    def test_unittest(self):\n        self.assertEqual(add(2, 5), 7)\n"
    )
    r = _run(GOOD, tests, mode=mode)
    assert r.passed, (r.verdict_error, r.stdout[-2000:])
    assert (r.tests_passed, r.tests_failed) == (10, 0) and r.verdict_error is None
    bad = _run(WRONG, tests, mode=mode)
    assert not bad.passed and (bad.tests_passed, bad.tests_failed) == (3, 7) and bad.exit_code == 1


@BOTH_MODES
def test_normal_pass_and_fail_in_both_runners(mode):
    ok, bad = _run(GOOD, mode=mode), _run(WRONG, mode=mode)
    assert ok.passed and (ok.tests_passed, ok.tests_failed) == (2, 0) and ok.verdict_error is None
    assert not bad.passed and (bad.tests_passed, bad.tests_failed) == (1, 1)
    sok, sbad = _run(GOOD, SCRIPT, mode=mode), _run(WRONG, SCRIPT, mode=mode)
    assert sok.passed and sok.verdict_error is None and sok.runner == "script"
    assert not sbad.passed and sbad.exit_code == 1 and "AssertionError" in sbad.stderr


@needs_bwrap
def test_skipped_and_errored_tests_do_not_pass():
    skip = "import pytest\nfrom solution import add\n\ndef test_a():\n    assert add(1, 1) == 2\n\n@pytest.mark.skip\ndef test_b():\n    pass\n"
    err = "import pytest\nfrom solution import add\n\n@pytest.fixture\ndef boom():\n    raise ValueError\n\ndef test_a(boom):\n    pass\n\ndef test_b():\n    assert add(1, 1) == 2\n"
    r = _run(GOOD, skip)
    assert r.exit_code == 0 and not r.passed and r.tests_passed == 1
    r = _run(GOOD, err)
    assert not r.passed and (r.tests_passed, r.tests_failed) == (1, 1)
    xfail = "import pytest\nfrom solution import add\n\n@pytest.mark.xfail\ndef test_a():\n    assert add(1, 1) == 3\n"
    r = _run(GOOD, xfail)  # pytest exits 0 ("1 xfailed"), but an expected failure checks nothing
    assert r.exit_code == 0 and not r.passed and r.tests_failed == 1


@BOTH_MODES
def test_flooding_every_descriptor_hits_the_output_cap(mode):
    """The solution has no descriptor of the result channel; what it writes anywhere counts against the cap."""
    sol = GOOD + f"import os\nfor _fd in {_EVERY_FD}:\n    for _ in range(8):\n        try:\n" \
                 "            os.write(_fd, b'x' * 65536)\n        except OSError:\n            break\n"
    r = _run(sol, mode=mode, wall_timeout_seconds=10)
    assert not r.passed and r.killed_reason == "output_cap" and len(r.stdout) + len(r.stderr) <= 200_000


# ---------------------------------------------------------------- the host's reading of the channel (pure)

NONCE = "ab" * 16
ALIVE = {"alive": True, "status": None, "threads": 1, "children": 0}


def _rec(**kw) -> bytes:
    rec = {"nonce": NONCE, "kind": "final", "runner": "pytest", "collected": 2, "passed": 2, "failed": 0, "errors": 0,
           "skipped": 0, "exitstatus": 0, "lost": None, "not_checkable": None} | kw
    return (json.dumps(rec) + "\n").encode()


def _script_rec(**kw) -> bytes:
    rec = {"nonce": NONCE, "kind": "final", "runner": "script", "completed": True, "ended_by": None, "lost": None,
           "not_checkable": None} | kw
    return (json.dumps(rec) + "\n").encode()


def test_judge_accepts_exactly_one_good_record():
    v = judge(_rec(), NONCE, "pytest", declared=2, solution=ALIVE)
    assert v.ok and v.error is None and (v.tests_passed, v.tests_failed) == (2, 0) and v.not_checkable is None
    assert judge(_rec(collected=3, passed=3), NONCE, "pytest", 2, ALIVE).ok  # parametrized: more items than defs


@pytest.mark.parametrize("raw,needle", [
    (b"", "no result record"),
    (_rec() + _rec(), "2 records"),
    (_rec(nonce="cd" * 16), "nonce"),
    (_rec() + (json.dumps({"nonce": GUESS}) + "\n").encode(), "nonce"),
    (b"garbage\n" + _rec(), "nonce"),
    (_rec()[:-1], "incomplete"),
    (_rec()[:-5] + b"\n", "malformed"),
    (_rec(passed=1), "passed 1 of 2"),
    (_rec(failed=1), "failed"),
    (_rec(errors=1), "error"),
    (_rec(collected=0, passed=0), "no tests"),
    (_rec(collected=1, passed=1), "declares 2"),
    (_rec(exitstatus=1), "exit status"),
    (_rec(lost="the solution process is gone"), "solution process is gone"),
    (_rec(not_checkable="the test compares a handle"), "not checkable: the test compares a handle"),
    (_rec(lost=1), "malformed"),
    (_rec(tampered=[]), "malformed"),
    (_rec(passed=True), "malformed"),
    (_rec(passed="2"), "malformed"),
    (_rec(kind="progress"), "final"),
    (_rec(runner="script"), "runner"),
    (_rec(untrusted_module=False), "malformed"),
])
def test_judge_rejects(raw, needle):
    v = judge(raw, NONCE, "pytest", declared=2, solution=ALIVE)
    assert not v.ok and needle in v.error, v.error


def test_judge_reports_not_checkable_apart():
    v = judge(_rec(passed=1, failed=1, not_checkable="the test passes a generator"), NONCE, "pytest", 2, ALIVE)
    assert not v.ok and v.not_checkable == "the test passes a generator" and v.tests_failed == 1


@pytest.mark.parametrize("state,needle", [
    (None, "never seen"),
    (dict(ALIVE, alive=False, status=0), "ended before the tests were done (exit status 0)"),
    (dict(ALIVE, alive=False, status=137), "signal 9"),
    (dict(ALIVE, threads=2), "1 thread(s) running"),
    (dict(ALIVE, children=3), "3 child process(es)"),
])
def test_judge_requires_a_solution_process_alive_alone_and_idle(state, needle):
    v = judge(_rec(), NONCE, "pytest", 2, state)
    assert not v.ok and needle in v.error, v.error


def test_judge_script_records():
    ok = _script_rec()
    assert judge(ok, NONCE, "script", 0, ALIVE).ok
    assert not judge(b"", NONCE, "script", 0, ALIVE).ok
    assert not judge(ok + ok, NONCE, "script", 0, ALIVE).ok
    assert "did not run to its end (SystemExit)" in judge(_script_rec(completed=False, ended_by="SystemExit"), NONCE,
                                                          "script", 0, ALIVE).error
    assert not judge(_script_rec(completed=1), NONCE, "script", 0, ALIVE).ok
    assert not judge(_script_rec(lost="gone"), NONCE, "script", 0, ALIVE).ok
    assert not judge(ok, NONCE, "script", 0, dict(ALIVE, threads=3)).ok


def test_declared_tests_counts_what_pytest_collects():
    code = (
        "import pytest\n\ndef test_a():\n    pass\n\nasync def test_async():\n    pass\n\ndef test_a():\n    pass\n\n"
        "def helper():\n    pass\n\n@pytest.fixture\ndef test_data():\n    return 1\n\n@pytest.fixture()\ndef test_more():\n    return 1\n\n"
        "class TestX:\n    def test_m(self):\n        pass\n\n    def helper(self):\n        pass\n\n"
        "class Helper:\n    def test_not_collected(self):\n        pass\n\nif True:\n    def test_nested():\n        pass\n"
    )
    assert declared_tests(code) == 3  # test_a (once), test_async, TestX.test_m
    assert declared_tests("def broken(:\n") == 0
