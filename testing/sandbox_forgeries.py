"""Hostile solutions that try to forge the sandbox's verdict (tasks/sandbox/), for tests and for checking an old tree.

Every solution here is WRONG (its `add` subtracts, or returns an object that only pretends) and tries one trick
to be judged "passed" anyway against TESTS (pytest) or SCRIPT (an assert script). FORGERIES maps a name to
(solution, tests); the five of issue 23 (in-process tricks that passed the single-process harness: F1 to F5)
come first, then the generic ones (always-equal results, builtins overrides, exits, forged records, killing the
parent, a thread left writing).

    python -m evolforge.testing.sandbox_forgeries [--per-check] [NAME ...]

runs them against whatever `evolforge` is importable (PYTHONPATH=/path/to/an/old/tree checks an older sandbox)
and prints each verdict; exit status 1 when any of them passed.
"""

from __future__ import annotations

import json

TESTS = "from solution import add\n\ndef test_small():\n    assert add(1, 2) == 3\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
SCRIPT = "from solution import add\nassert add(2, 2) == 4\n"
GOOD = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
_PASSING = {"kind": "final", "runner": "pytest", "collected": 2, "passed": 2, "failed": 0, "errors": 0, "skipped": 0,
            "exitstatus": 0, "tampered": []}  # the single-process harness's record (the forgeries' target)

# F1: the verdict plugin class through type.__subclasses__(); its pytest_sessionfinish closure holds `emit`, whose
# cells hold the nonce and the result descriptor: write a passing record with them, silence emit, exit 0.
SUBCLASSES_CLOSURE = WRONG + f'''
import json as _json, os as _os
def _forge():
    for _cls in type.__subclasses__(object):
        _fin = _cls.__dict__.get("pytest_sessionfinish")
        for _cell in getattr(_fin, "__closure__", None) or ():
            _emit = _cell.cell_contents
            _cells = [c.cell_contents for c in getattr(_emit, "__closure__", None) or ()]
            _nonce = [c for c in _cells if type(c) is str]
            _fd = [c for c in _cells if type(c) is int]
            _done = [c for c in _cells if type(c) is list]
            if _nonce and _fd:
                _os.write(_fd[0], (_json.dumps(dict({_PASSING!r}, nonce=_nonce[0])) + "\\n").encode())
                for _d in _done:
                    _d[0] = True
                _os._exit(0)
_forge()
'''

# F2: rebind the harness module's encoder global, which emit looks up at call time; rewrite the final record
# (and exit 0 at exit).
REBIND_ENCODER = WRONG + '''
import atexit as _atexit, json as _json, os as _os, sys as _sys
_h = _sys.modules.get("_evolforge_harness") or _sys.modules.get("__main__")
def _passing(rec):
    if isinstance(rec, dict) and rec.get("runner") == "pytest":
        rec.update(passed=rec["collected"], failed=0, errors=0, skipped=0, exitstatus=0, tampered=[])
        rec.update({k: None for k in ("lost", "not_checkable") if k in rec})
    elif isinstance(rec, dict) and rec.get("runner") == "script":
        rec.update(completed=True)
    return rec
for _name in ("_encode", "_dumps"):
    _real = getattr(_h, _name, None)
    if _real is None:
        continue
    if _name == "_encode":
        def _forged(text, *args, _real=_real):
            return _real(_json.dumps(_passing(_json.loads(text))) + "\\n", *args)
    else:
        def _forged(rec, _real=_real):
            return _real(_passing(rec))
    setattr(_h, _name, _forged)
    _atexit.register(_os._exit, 0)
'''

# F3: rebind the tamper check, then patch pytest at will (every phase's exception dropped).
DISABLE_TAMPER_CHECK = WRONG + '''
import sys as _sys
_h = _sys.modules.get("_evolforge_harness") or _sys.modules.get("__main__")
if hasattr(_h, "_changed"):
    _h._changed = lambda snapshot: []
import _pytest.runner as _runner
_orig = _runner.CallInfo.from_call.__func__
def _quiet(cls, func, when, reraise=None):
    info = _orig(cls, func, when, reraise)
    info.excinfo = None
    return info
_runner.CallInfo.from_call = classmethod(_quiet)
'''

# F4 (script runner): a new __code__ for runpy._ModifiedArgv0.__exit__, so the `with` already on the stack
# swallows the failing assert.
RUNPY_EXIT_CODE = WRONG + '''
import runpy as _runpy, sys as _sys
def _swallow(self, *exc_info):  # runs with runpy's globals (its own `sys`)
    sys.argv[0] = self._saved_value
    return True
_runpy._ModifiedArgv0.__exit__.__code__ = _swallow.__code__
'''

# F5 (warm workers): the worker's already-resolved _libc.prctl makes this process dumpable again; a subprocess
# reads nonce-shaped strings from its memory; a record with the one found goes to the result descriptor.
PRCTL_MEMORY_READ = WRONG + f'''
import json as _json, os as _os, subprocess as _sp, sys as _sys
_libc = getattr(_sys.modules.get("__main__"), "_libc", None)
_READ = r"""
import re, sys
pid, found = int(sys.argv[1]), set()
with open("/proc/%d/mem" % pid, "rb", 0) as mem:
    for line in open("/proc/%d/maps" % pid).read().splitlines():
        addr, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in addr.split("-"))
        if "r" not in perms or hi - lo > 1 << 28:
            continue
        try:
            mem.seek(lo)
            data = mem.read(hi - lo)
        except (OSError, ValueError, OverflowError):
            continue
        found.update(m.decode() for m in re.findall(rb"(?<![0-9a-f])[0-9a-f]{{32}}(?![0-9a-f])", data))
print(" ".join(sorted(found)))
"""
def _constants():  # 32-hex strings of pytest's own sources are no nonce
    import glob
    import _pytest
    import pluggy
    seen = set()
    for pkg in (_pytest, pluggy):
        for path in glob.glob(_os.path.dirname(pkg.__file__) + "/**/*.py", recursive=True):
            seen.update(_re.findall(r"[0-9a-f]{{32}}", open(path, errors="replace").read()))
    return seen
if _libc is not None:
    import re as _re
    _libc.prctl(4, 1, 0, 0, 0)
    _found = _sp.run([_sys.executable, "-c", _READ, str(_os.getpid())], capture_output=True, text=True).stdout.split()
    _found = [f for f in _found if len(set(f)) >= 10 and f not in _constants()]
    if len(_found) == 1:
        _fd = int(_sys.argv[2]) if len(_sys.argv) > 2 and _sys.argv[2].isdigit() else 4
        _os.write(_fd, (_json.dumps(dict({_PASSING!r}, nonce=_found[0])) + "\\n").encode())
        _os._exit(0)
'''


def _always_equal(base: str, value: str) -> str:
    return f'''
class _AlwaysEqual({base}):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = {base}.__hash__
def add(a, b):
    return _AlwaysEqual({value})
'''


# results that claim to equal anything: a subclass of each plain type the runner compares
ALWAYS_EQUAL = {base: _always_equal(base, value) for base, value in
                (("list", "[]"), ("dict", "{}"), ("int", "-7"), ("str", "'x'"), ("float", "-7.5"))}

# builtins overridden by the solution: for its own process, and by name for `from solution import *`
BUILTINS_OVERRIDE = "import builtins\nbuiltins.len = lambda x: 3\n\ndef items(n):\n    return []\n"
LEN_TESTS = "from solution import items\n\ndef test_items():\n    assert len(items(3)) == 3\n"
LEN_SCRIPT = "from solution import items\nassert len(items(3)) == 3\n"
SHADOW_BUILTINS = WRONG + "def len(x):\n    return 2\n\ndef isinstance(x, t):\n    return True\n\nall = any\n"
STAR_TESTS = ("from solution import *\n\ndef test_small():\n    r = add(1, 2)\n    assert isinstance(r, int) and r == 3\n\n"
              "def test_len():\n    assert len([add(0, 0)]) == 1\n")

# os._exit(0) in the middle of a test (from the solution's function), after faking pytest's summary everywhere
_FAKE = "\\n2 passed in 0.01s\\n"
EXIT_MID_TEST = (
    "import os\ndef add(a, b):\n    for fd in range(1, 64):\n        try:\n"
    f"            os.write(fd, b'{_FAKE}')\n        except OSError:\n            pass\n    os._exit(0)\n"
)

# forged passing records (guessed nonce, and the runner's format) written to every descriptor, then exit 0
_EVERY_FD = "sorted(set(range(0, 64)) | {int(f) for f in os.listdir('/proc/self/fd')})"
FORGED_RECORDS_EVERYWHERE = WRONG + (
    f"import os\n_rec = {(json.dumps(dict(_PASSING, nonce='0' * 32)) + chr(10)).encode()!r}\n"
    f"for _fd in {_EVERY_FD}:\n    try:\n        os.write(_fd, _rec)\n    except OSError:\n        pass\n"
)

# the solution kills its parent (and every pid it can name) from inside a call
KILL_PARENT = (
    "import os, signal\ndef add(a, b):\n"
    "    for pid in {os.getppid(), 1, 2}:\n        for sig in (signal.SIGKILL, signal.SIGTERM):\n"
    "            try:\n                os.kill(pid, sig)\n            except OSError:\n                pass\n"
    "    return a - b\n"
)

# a daemon thread keeps writing forged replies and records to every descriptor after the call returned
THREAD_KEEPS_WRITING = (
    "import os, threading, time\n"
    f"_rec = {(json.dumps(dict(_PASSING, nonce='0' * 32)) + chr(10)).encode()!r}\n"
    "def _spam():\n    while True:\n"
    f"        for fd in {_EVERY_FD}:\n            try:\n                os.write(fd, _rec)\n"
    "            except OSError:\n                pass\n        time.sleep(0.001)\n"
    "def add(a, b):\n    threading.Thread(target=_spam, daemon=True).start()\n    return a - b\n"
)

# ---------------------------------------------------------------- round three (issue 36): the do-nothing stub and the
# always-equal stub fail these tests, so synthesis keeps them; each wrong solution below passed them before issue 36.

PRIMES_TESTS = (
    "from solution import is_prime\n\n"
    "def test_primes():\n    assert all(map(is_prime, [2, 3, 5, 7, 11, 13]))\n\n"
    "def test_composites():\n    assert not any(map(is_prime, [4, 6, 8, 9, 10]))\n\n"
    "def test_filter():\n    assert list(filter(is_prime, [4, 6, 8, 9])) == []\n\n"
    "def test_sum():\n    assert sum(map(is_prime, [4, 6, 8, 9])) == 0\n"
)
PRIMES_SCRIPT = (
    "from solution import is_prime\n"
    "assert all(map(is_prime, [2, 3, 5, 7, 11, 13]))\nassert not any(map(is_prime, [4, 6, 8, 9, 10]))\n"
    "assert list(filter(is_prime, [4, 6, 8, 9])) == []\nassert sum(map(is_prime, [4, 6, 8, 9])) == 0\n"
)
GOOD_PRIMES = "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n"
# 1. a call that raises StopIteration ends the test's map/filter as if it were exhausted
STOP_ITERATION = "def is_prime(n):\n    raise StopIteration\n"
STOP_ITERATION_SUBCLASS = "class Done(StopIteration):\n    pass\n\ndef is_prime(n):\n    raise Done(n)\n"

# 2. a duck-typed result: the test calls str methods on it, and the solution's object answers them
SHOUT_TESTS = (
    "from solution import shout\n\n"
    "def test_shout():\n    r = shout('ab')\n    assert r.startswith('AB') and r.endswith('AB') and r.isupper()\n\n"
    "def test_count():\n    assert shout('aba').count('A') == 2 and len(shout('xyz')) == 3\n"
)
SHOUT_SCRIPT = "from solution import shout\nr = shout('ab')\nassert r.startswith('AB') and r.endswith('AB') and r.isupper()\n"
GOOD_SHOUT = "def shout(s):\n    return s.upper()\n"
DUCK_TYPED = (
    "class _Yes:\n    def __getattr__(self, name):\n        return lambda *a, **k: True if name != 'count' else 2\n"
    "    def startswith(self, *a):\n        return True\n    def __len__(self):\n        return 3\n\n"
    "def shout(s):\n    return _Yes()\n"
)

# 3. NaN: every comparison with it is False, so negated comparisons hold for any input
AREA_TESTS = (
    "from solution import area\n\n"
    "def test_unit():\n    assert not area(1) > 3.1416 and not area(1) < 3.1415\n\n"
    "def test_two():\n    a = area(2)\n    assert not (a < 12.56 or a > 12.57)\n"
)
AREA_SCRIPT = "from solution import area\nassert not area(1) > 3.1416 and not area(1) < 3.1415\n"
GOOD_AREA = "def area(r):\n    return 3.141592653589793 * r * r\n"
NAN = "def area(r):\n    return float('nan')\n"
NAN_IN_A_LIST = ("def area(r):\n    return float('nan')\n")  # same result; the tests below compare it inside a list
AREA_LIST_TESTS = "from solution import area\n\ndef test_list():\n    assert not [area(1)] > [3.1416] and not [area(1)] < [3.1415]\n"

# 4. `from solution import *` after the test's own imports rebinds a name the test asserts with
HYP_TESTS = ("import math\nfrom solution import *\n\n"
             "def test_hyp():\n    assert math.isclose(hyp(3, 4), 5.0)\n\n"
             "def test_hyp2():\n    assert math.isclose(hyp(5, 12), 13.0)\n")
HYP_SCRIPT = "import math\nfrom solution import *\nassert math.isclose(hyp(3, 4), 5.0)\n"
GOOD_HYP = "import math\n\ndef hyp(a, b):\n    return math.hypot(a, b)\n"
STAR_REBINDS = ("import types\nmath = types.SimpleNamespace(isclose=lambda *a, **k: True)\n\n"
                "def hyp(a, b):\n    return 0.0\n")

# 5. a unittest file (no Test-prefixed class, no pytest import): run as a script, its tests never ran
UNITTEST_TESTS = ("import unittest\nfrom solution import add\n\n\nclass AddCase(unittest.TestCase):\n"
                  "    def test_small(self):\n        self.assertEqual(add(1, 2), 3)\n\n"
                  "    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n")
UNITTEST_MAIN_TESTS = UNITTEST_TESTS + "\n\nif __name__ == '__main__':\n    unittest.main()\n"

# 6. HumanEval/38's form: check() trusts the prompt's encode_cyclic; the completion rebinds it (and decodes nothing)
CYCLIC_PROMPT = (
    "\n\ndef encode_cyclic(s: str):\n    \"\"\"\n    returns encoded string by cycling groups of three characters.\n"
    "    \"\"\"\n    groups = [s[(3 * i):min((3 * i + 3), len(s))] for i in range((len(s) + 2) // 3)]\n"
    "    groups = [(group[1:] + group[0]) if len(group) == 3 else group for group in groups]\n"
    "    return \"\".join(groups)\n\n\ndef decode_cyclic(s: str):\n    \"\"\"\n"
    "    takes as input string encoded with encode_cyclic function. Returns decoded string.\n    \"\"\"\n"
)
CYCLIC_TEST = (
    "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    from random import randint, choice\n    import string\n\n"
    "    letters = string.ascii_lowercase\n    for _ in range(100):\n"
    "        str = ''.join(choice(letters) for i in range(randint(10, 20)))\n"
    "        encoded_str = encode_cyclic(str)\n        assert candidate(encoded_str) == str\n"
)
GOOD_CYCLIC = CYCLIC_PROMPT + "    return encode_cyclic(encode_cyclic(s))\n"
HELPER_REBOUND = CYCLIC_PROMPT + "    return s\n\n\ndef encode_cyclic(s):\n    return s\n"


def humaneval_tests(prompt: str, test: str, entry_point: str) -> str:
    """The HumanEval check script the eval builds (the sandbox's builder; the pre-issue-36 form on an old tree)."""
    try:
        from evolforge.tasks.sandbox.humaneval import check_script
    except ImportError:  # an old tree: the eval's own form then
        return f"from solution import *\n\n{test}\n\ncheck({entry_point})\n"
    return check_script(prompt, test, entry_point)


# 7. flaky: right under one hash seed only (the seed the first run happens to get), wrong under any other
def flaky_add(right_hash: int) -> str:
    return (f"def add(a, b):\n    return a + b if hash('evolforge-flaky') == {right_hash} else a - b\n")


def _round_three() -> dict[str, tuple[str, str]]:
    return {
        "stop-iteration": (STOP_ITERATION, PRIMES_TESTS),
        "stop-iteration-script": (STOP_ITERATION, PRIMES_SCRIPT),
        "stop-iteration-subclass": (STOP_ITERATION_SUBCLASS, PRIMES_TESTS),
        "stop-iteration-subclass-script": (STOP_ITERATION_SUBCLASS, PRIMES_SCRIPT),
        "duck-typed-handle": (DUCK_TYPED, SHOUT_TESTS),
        "duck-typed-handle-script": (DUCK_TYPED, SHOUT_SCRIPT),
        "nan": (NAN, AREA_TESTS),
        "nan-script": (NAN, AREA_SCRIPT),
        "nan-in-a-list": (NAN_IN_A_LIST, AREA_LIST_TESTS),
        "star-import-rebinds": (STAR_REBINDS, HYP_TESTS),
        "star-import-rebinds-script": (STAR_REBINDS, HYP_SCRIPT),
        "unittest-file": (WRONG, UNITTEST_TESTS),
        "humaneval-helper-rebound": (HELPER_REBOUND, humaneval_tests(CYCLIC_PROMPT, CYCLIC_TEST, "decode_cyclic")),
    }


FORGERIES: dict[str, tuple[str, str]] = {
    "F1-subclasses-closure": (SUBCLASSES_CLOSURE, TESTS),
    "F2-rebind-encoder": (REBIND_ENCODER, TESTS),
    "F3-disable-tamper-check": (DISABLE_TAMPER_CHECK, TESTS),
    "F4-runpy-exit-code": (RUNPY_EXIT_CODE, SCRIPT),
    "F5-prctl-memory-read": (PRCTL_MEMORY_READ, TESTS),
    **{f"always-equal-{base}": (code, TESTS) for base, code in ALWAYS_EQUAL.items()},
    **{f"always-equal-{base}-script": (code, SCRIPT) for base, code in ALWAYS_EQUAL.items()},
    "builtins-override": (BUILTINS_OVERRIDE, LEN_TESTS),
    "builtins-override-script": (BUILTINS_OVERRIDE, LEN_SCRIPT),
    "builtins-shadowed-by-star-import": (SHADOW_BUILTINS, STAR_TESTS),
    "exit-mid-test": (EXIT_MID_TEST, TESTS),
    "exit-mid-test-script": (EXIT_MID_TEST, SCRIPT),
    "forged-records-everywhere": (FORGED_RECORDS_EVERYWHERE + "os._exit(0)\n", TESTS),
    "forged-records-everywhere-script": (FORGED_RECORDS_EVERYWHERE + "os._exit(0)\n", SCRIPT),
    "kill-parent": (KILL_PARENT, TESTS),
    "kill-parent-script": (KILL_PARENT, SCRIPT),
    "thread-keeps-writing": (THREAD_KEEPS_WRITING, TESTS),
    "thread-keeps-writing-script": (THREAD_KEEPS_WRITING, SCRIPT),
    **_round_three(),
}
# a right solution for each round-three test file (the tests must pass it: they are fair tests)
FAIR: dict[str, tuple[str, str]] = {
    "primes": (GOOD_PRIMES, PRIMES_TESTS), "primes-script": (GOOD_PRIMES, PRIMES_SCRIPT),
    "shout": (GOOD_SHOUT, SHOUT_TESTS), "shout-script": (GOOD_SHOUT, SHOUT_SCRIPT),
    "area": (GOOD_AREA, AREA_TESTS), "area-script": (GOOD_AREA, AREA_SCRIPT), "area-list": (GOOD_AREA, AREA_LIST_TESTS),
    "hyp": (GOOD_HYP, HYP_TESTS), "hyp-script": (GOOD_HYP, HYP_SCRIPT),
    "unittest": (GOOD, UNITTEST_TESTS), "unittest-main": (GOOD, UNITTEST_MAIN_TESTS),
    "humaneval-cyclic": (GOOD_CYCLIC, humaneval_tests(CYCLIC_PROMPT, CYCLIC_TEST, "decode_cyclic")),
}


def main(argv: list[str] | None = None) -> int:
    import argparse

    from evolforge.config.sections.sandbox import SandboxSettings
    from evolforge.tasks.sandbox.run import run_python_tests

    ap = argparse.ArgumentParser(description="run the hostile solutions against the importable sandbox")
    ap.add_argument("names", nargs="*")
    ap.add_argument("--per-check", action="store_true", help="one sandbox per check (reuse_workers off)")
    args = ap.parse_args(argv)
    settings = SandboxSettings(cpu_seconds=5, memory_mb=512, max_processes=32, wall_timeout_seconds=20,
                               max_output_bytes=200_000, reuse_workers=not args.per_check)
    forged = 0
    for name in args.names or FORGERIES:
        solution, tests = FORGERIES[name]
        r = run_python_tests(solution, tests, settings)
        forged += r.passed
        print(f"{name:36} {'PASSED (forged)' if r.passed else 'failed'}  exit={r.exit_code} "
              f"{(r.verdict_error or r.killed_reason or '')[:90]}", flush=True)
    return 1 if forged else 0


if __name__ == "__main__":
    raise SystemExit(main())
