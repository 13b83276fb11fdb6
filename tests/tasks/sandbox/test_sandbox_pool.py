"""Warm sandbox workers (tasks/sandbox/pool.py, worker.py): one check sees nothing of an earlier one.

Each leak test runs two checks on the SAME worker (asserted from the pool's counters): the first plants
something of one kind (files, processes, environment, imported modules, System V IPC), the second looks
for it. Then the control channel and the verdict: code under test that tries to talk to the worker or
forge its report or the harness's record must fail, and the worker must keep judging the next checks right.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.pool import close_workers, pool_stats
from evolforge.tasks.sandbox.run import run_many, run_python_program, run_python_tests

pytestmark = pytest.mark.skipif(not os.access("/usr/bin/bwrap", os.X_OK), reason="bubblewrap not installed")

SOLUTION = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = "from solution import add\n\ndef test_small():\n    assert add(1, 2) == 3\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
PLANT_DIRS = ["/", "/sandbox", "/tmp", "/dev", "/dev/shm", "/evolforge", "/venv", "/usr", "/var/tmp", "/run", "/etc"]


def _settings(**kw) -> SandboxSettings:
    base = dict(cpu_seconds=5, memory_mb=512, max_processes=32, wall_timeout_seconds=20, max_output_bytes=200_000,
                max_parallel=2, reuse_workers=True)
    return SandboxSettings(**(base | kw))


def _script(code: str, settings: SandboxSettings | None = None):
    r = run_python_tests("", code, settings or _settings())
    assert r.runner == "script"
    return r


@pytest.fixture
def one_worker():
    """A single fresh worker; yields a function asserting that no other worker was started since."""
    close_workers()
    start = pool_stats()

    def same_worker() -> None:
        now = pool_stats()
        assert now["spawned"] - start["spawned"] <= 1 and now["retired"] == start["retired"], (start, now)

    yield same_worker
    close_workers()


# ---------------------------------------------------------------- leaks between checks


def test_files_of_an_earlier_check_are_gone(one_worker):
    plant = (
        "import json\nwritten = []\n"
        f"for d in {PLANT_DIRS!r}:\n"
        "    try:\n        open(d.rstrip('/') + '/planted-by-check-1', 'w').write('x')\n        written.append(d)\n"
        "    except OSError:\n        pass\nprint(json.dumps(written))\n"
    )
    first = _script(plant)
    assert first.passed, first.stderr
    assert set(json.loads(first.stdout)) == {"/sandbox", "/tmp", "/dev/shm"}  # its private tmpfs, nothing else
    look = (
        "import json, os\nseen = {}\n"
        f"for d in {PLANT_DIRS!r}:\n"
        "    try:\n        seen[d] = sorted(os.listdir(d))\n    except OSError as e:\n        seen[d] = [type(e).__name__]\n"
        "print(json.dumps(seen))\n"
    )
    second = _script(look)
    one_worker()
    assert second.passed, second.stderr
    seen = json.loads(second.stdout)
    assert not [d for d, names in seen.items() if "planted-by-check-1" in names], seen
    assert seen["/sandbox"] == ["test_solution.py"] and seen["/tmp"] == [] and seen["/dev/shm"] == []  # the runner's


def test_processes_of_an_earlier_check_are_gone(one_worker):
    marker = f"5150.{os.getpid()}"
    spawn = (
        "import os, signal, subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'])\n"
        f"p = subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "os.kill(p.pid, signal.SIGSTOP)\n"
        "if os.fork() == 0:\n    os.setsid()\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"    if os.fork() == 0:\n        os.execv('/usr/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\n"
        "print('spawned')\n"
    )
    assert _script(spawn).passed
    # The scan is repeated while a process has an empty command line: the fork that started this check's solution
    # process exits as soon as it has, and for a moment it is neither running nor a zombie (a CI run saw it).
    # A process left by the earlier check would still have its command line (sleep 5150.<pid>).
    look = (
        "import json, os, time\nimport solution  # connected: the solution process is up\n"
        "def scan():\n    procs, nested = {}, []\n"
        "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "        try:\n            if 'State:\\tZ' in open(f'/proc/{pid}/status').read():\n"
        "                continue  # a zombie: exited, not yet reaped (it runs nothing)\n"
        "            procs[pid] = open(f'/proc/{pid}/cmdline', 'rb').read().decode(errors='replace')\n"
        "            ns = [l for l in open(f'/proc/{pid}/status') if l.startswith('NSpid:')][0].split()[1:]\n"
        "            if len(ns) > 1:\n                nested.append(int(pid))\n"
        "        except OSError as e:\n            procs[pid] = type(e).__name__\n"
        "    return procs, nested\n"
        "deadline = time.monotonic() + 15  # well inside the check's wall timeout (20 s)\n"
        "while True:\n    procs, nested = scan()\n"
        "    if all(procs.values()) or time.monotonic() > deadline:\n        break\n    time.sleep(0.01)\n"
        "print(json.dumps({'procs': procs, 'nested': nested, 'me': os.getpid(), 'parent': os.getppid()}))\n"
    )
    second = _script(look)
    one_worker()
    seen = json.loads(second.stdout)
    assert not [c for c in seen["procs"].values() if marker in c], seen
    # bwrap's init, the worker, itself, and this check's solution process (the init of a PID namespace of its own)
    assert len(seen["nested"]) == 1, seen
    assert set(map(int, seen["procs"])) == {1, seen["parent"], seen["me"], *seen["nested"]}, seen
    ps = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True, check=True).stdout
    assert marker not in ps


def test_environment_of_an_earlier_check_is_gone(one_worker):
    show = "import json, os\nprint(json.dumps(dict(os.environ)))\n"
    before = json.loads(_script(show).stdout)
    plant = "import os\nos.environ['PLANTED'] = 'check-1'\nos.putenv('PLANTED_TOO', 'check-1')\nos.environ['PATH'] = '/planted'\n"
    assert _script(plant).passed
    after = json.loads(_script(show).stdout)
    one_worker()
    assert after == before and "PLANTED" not in after and after["PATH"] == "/usr/bin:/bin"


def test_imported_modules_of_an_earlier_check_are_gone(one_worker):
    plant = (
        "import builtins, colorsys, json, sys, types\n"
        "sys.modules['planted'] = types.ModuleType('planted')\njson.planted = 1\nbuiltins.planted = 1\n"
        "json.dumps = lambda *a, **k: 'forged'\nsys.path.append('/planted')\n"
        "import solution\nsolution.add = lambda a, b: 3\n"
    )
    assert run_python_tests("def add(a, b):\n    return 0\n", plant, _settings()).passed
    look = (
        "import builtins, json, sys\nfrom solution import add\n"
        "print(json.dumps({'planted': 'planted' in sys.modules, 'colorsys': 'colorsys' in sys.modules,\n"
        "    'json_attr': hasattr(json, 'planted'), 'builtin': hasattr(builtins, 'planted'),\n"
        "    'path': '/planted' in sys.path, 'add': add(1, 2)}))\n"
    )
    second = run_python_tests("def add(a, b):\n    return a * b\n", look, _settings())
    one_worker()
    assert json.loads(second.stdout) == {"planted": False, "colorsys": False, "json_attr": False, "builtin": False,
                                         "path": False, "add": 2}
    # and a passing solution is judged on its own, after a wrong one was imported in the same worker
    assert not run_python_tests(WRONG, TESTS, _settings()).passed
    assert run_python_tests(SOLUTION, TESTS, _settings()).passed
    one_worker()


def test_ipc_objects_of_an_earlier_check_are_gone(one_worker):
    plant = (
        "import subprocess\n"
        "print(subprocess.run(['ipcmk', '-M', '4096', '-p', '0666'], capture_output=True, text=True).stdout)\n"
        "print(subprocess.run(['ipcmk', '-Q', '-p', '0666'], capture_output=True, text=True).stdout)\n"
    )
    first = _script(plant)
    assert "Shared memory id" in first.stdout, first.stdout + first.stderr
    look = "import subprocess\nprint(subprocess.run(['ipcs', '-m', '-q'], capture_output=True, text=True).stdout)\n"
    second = _script(look)
    one_worker()
    listed = [line for line in second.stdout.splitlines() if line[:2] == "0x"]
    assert listed == [], second.stdout


def test_each_check_runs_as_its_own_unprivileged_uid():
    me = (
        "import json, os\nstatus = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        "print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'groups': os.getgroups(), 'pgid': os.getpgid(0),\n"
        "    'sid': os.getsid(0), 'pid': os.getpid(), 'caps': [status[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')],\n"
        "    'nnp': status['NoNewPrivs'].strip()}))\n"
    )
    settings = _settings(max_parallel=2)
    results = run_many([("", me + "import time\ntime.sleep(0.5)\n")] * 2, settings)
    seen = [json.loads(r.stdout) for r in results]
    for s in seen:
        assert s["caps"] == ["0000000000000000"] * 5 and s["nnp"] == "1"
        assert s["pgid"] == s["sid"] == s["pid"]  # its own session and process group
        if os.geteuid() == 0:
            assert s["uid"] == s["euid"] and settings.uid_base <= s["uid"] < settings.uid_base + 65_536 and s["groups"] == []
    if os.geteuid() == 0:
        assert seen[0]["uid"] != seen[1]["uid"]  # two checks at once never share a uid


# ---------------------------------------------------------------- the control channel and the verdict


ATTACK_WORKER = (
    "import glob, json, os, signal, socket\nreport = {'parent': os.getppid(), 'pids': sorted(filter(str.isdigit, os.listdir('/proc')))}\n"
    "forged_done = b''.join(json.dumps({'id': i, 'status': 0, 'clean': True}).encode() + b'\\n' for i in range(1, 60))\n"
    "forged_record = json.dumps({'nonce': '0' * 32, 'kind': 'final', 'runner': 'pytest', 'collected': 2, 'passed': 2,\n"
    "    'failed': 0, 'errors': 0, 'skipped': 0, 'exitstatus': 0, 'tampered': []}).encode() + b'\\n'\n"
    "for fd in sorted(int(f) for f in os.listdir('/proc/self/fd')):  # every descriptor it holds\n"
    "    try:\n        os.write(fd, forged_done + forged_record)\n        report.setdefault('wrote', []).append(fd)\n"
    "    except OSError:\n        pass\n"
    "    try:\n        s = socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM)\n    except OSError:\n        continue\n"
    "    try:\n        s.getsockname()\n        s.sendall(forged_done)\n        report.setdefault('socket', []).append(fd)\n"
    "    except OSError:\n        pass\n    finally:\n        s.close()\n"
    "for pid in (1, os.getppid()):\n"
    "    for what in ('fd', 'mem', 'environ', 'maps'):\n"
    "        try:\n            p = f'/proc/{pid}/{what}'\n"
    "            report[p] = sorted(os.listdir(p)) if what == 'fd' else len(open(p, 'rb').read())\n"
    "        except OSError as e:\n            report[p] = type(e).__name__\n"
    "    try:\n        os.kill(pid, signal.SIGKILL)\n        report[f'kill {pid}'] = 'sent'\n"
    "    except OSError as e:\n        report[f'kill {pid}'] = type(e).__name__\n"
    "import sys\nsys.__stderr__.write('REPORT ' + json.dumps(report) + '\\n')\n"
)


def test_code_cannot_reach_the_worker_or_forge_its_report(one_worker):
    r = run_python_tests(WRONG + ATTACK_WORKER, TESTS, _settings())
    assert not r.passed and "solution process" in r.verdict_error, r.verdict_error  # its lines broke the channel
    script = run_python_tests(WRONG + ATTACK_WORKER, "from solution import add\nassert add(1, 2) == 3\n", _settings())
    assert not script.passed and script.verdict_error, script.verdict_error
    # the solution and the harness write to one stderr from two processes: the harness's traceback may end
    # without a newline just before the solution's one-write REPORT line, so the line is found, not assumed
    found = re.search(r"REPORT (\{[^\n]*\})\n", script.stderr)
    assert found, script.stderr[-2000:]
    report = json.loads(found.group(1))
    assert "socket" not in report and report["wrote"] == [1, 2, 4], report  # stdout, stderr, its pipe to the runner
    # the solution is the init of a PID namespace of its own: its parent is outside it (ppid 0), pid 1 is itself,
    # and neither bwrap's init, nor the worker, nor the runner has a pid it could name
    assert report["parent"] == 0 and report["pids"] == ["1"], report
    # the worker was not confused: it judges the next checks right, and it is still the same worker
    assert run_python_tests(SOLUTION, TESTS, _settings()).passed
    assert not run_python_tests(WRONG, TESTS, _settings()).passed
    one_worker()


def test_a_forged_record_with_an_early_exit_fails_in_the_worker(one_worker):
    forge = ATTACK_WORKER + "os._exit(0)\n"
    r = run_python_tests(WRONG + forge, TESTS, _settings())
    assert not r.passed and r.verdict_error, r.verdict_error
    assert run_python_tests(SOLUTION, TESTS, _settings()).passed
    one_worker()


# ---------------------------------------------------------------- recycling and the switch


def test_worker_is_replaced_after_max_checks_and_after_a_timeout():
    close_workers()
    settings = _settings(worker_max_checks=2, wall_timeout_seconds=3)
    start = pool_stats()
    for _ in range(3):
        assert run_python_tests(SOLUTION, TESTS, settings).passed
    after = pool_stats()
    assert (after["spawned"] - start["spawned"], after["retired"] - start["retired"]) == (2, 1)
    slow = run_python_tests("import time\ntime.sleep(60)\n", TESTS, settings)
    assert slow.timed_out and slow.killed_reason == "wall_timeout" and slow.duration_s < 30  # half the sleep
    assert pool_stats()["retired"] - after["retired"] == 1  # the timed-out worker was killed, not reused
    assert run_python_tests(SOLUTION, TESTS, settings).passed
    close_workers()


def test_output_flood_retires_the_worker_and_the_next_check_is_clean():
    close_workers()
    start = pool_stats()
    flood = "import sys\nfor _ in range(10_000):\n    sys.stdout.write('x' * 65536)\n"
    r = _script(flood, _settings(max_output_bytes=100_000))
    assert r.killed_reason == "output_cap" and not r.passed
    assert pool_stats()["retired"] == start["retired"] + 1
    clean = _script("print('fine')\n")
    assert clean.passed and clean.stdout == "fine\n"
    close_workers()


def test_switch_off_runs_one_sandbox_per_check():
    close_workers()
    start = pool_stats()
    per_check = _settings(reuse_workers=False)
    assert run_python_tests(SOLUTION, TESTS, per_check).passed
    assert not run_python_tests(WRONG, TESTS, per_check).passed
    assert run_python_program("print(input()[::-1])", "abc", per_check).stdout == "cba\n"
    assert pool_stats() == start  # no worker was started


def test_programs_with_stdin_run_in_the_worker():
    r = run_python_program("import sys\nprint(sys.stdin.read().upper(), end='')\nsys.exit(3)\n", "hello\n", _settings())
    assert r.exit_code == 3 and r.stdout == "HELLO\n" and not r.passed and r.runner == "raw"
    crash = run_python_program("raise ValueError('boom')\n", None, _settings())
    assert crash.exit_code == 1 and "ValueError: boom" in crash.stderr


def test_rlimits_are_per_check(one_worker):
    burn = "import time\nend = time.process_time() + 0.7\nwhile time.process_time() < end:\n    pass\nprint('done')\n"
    settings = _settings(cpu_seconds=1)
    for _ in range(3):  # 2.1 CPU seconds on one worker, under a 1-second limit per check
        r = _script(burn, settings)
        assert r.passed and r.killed_reason is None, (r.killed_reason, r.stderr[-500:])
    assert _script("while True:\n    pass\n", settings).killed_reason == "cpu_limit"
    one_worker()


def test_a_forked_host_gets_its_own_workers():
    assert run_python_tests(SOLUTION, TESTS, _settings()).passed  # the parent has a worker now
    pid = os.fork()
    if pid == 0:  # the child must neither hang on the parent's spawner thread nor use the parent's workers
        code = 1
        try:
            ok = run_python_tests(SOLUTION, TESTS, _settings()).passed
            bad = run_python_tests(WRONG, TESTS, _settings()).passed
            code = 0 if ok and not bad and pool_stats()["spawned"] == 1 else 2
        finally:
            close_workers()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert run_python_tests(SOLUTION, TESTS, _settings()).passed  # the parent's workers are untouched


@pytest.mark.parametrize("reuse", [True, False], ids=["workers", "per-check"])
def test_patching_the_harness_in_the_solutions_process_changes_nothing(reuse):
    """The solution's process is a fork of the worker too: it holds a copy of the harness, the runner's is apart."""
    patch = (
        "import sys\nharness = sys.modules.get('_evolforge_harness') or sys.modules['__main__']\n"
        "harness.channel_state = lambda ep: {'lost': None, 'not_checkable': None}\n"
        "harness.Verdict.pytest_sessionfinish = lambda self, session, exitstatus: None\n"
    )
    r = run_python_tests(WRONG + patch, TESTS, _settings(reuse_workers=reuse))
    assert not r.passed and (r.tests_passed, r.tests_failed) == (1, 1), r.verdict_error
    assert run_python_tests(SOLUTION + patch, TESTS, _settings(reuse_workers=reuse)).passed


def test_an_idle_worker_that_died_is_replaced():
    from evolforge.tasks.sandbox import pool

    close_workers()
    assert run_python_tests(SOLUTION, TESTS, _settings()).passed
    (worker,) = [w for ws in pool._POOL.idle.values() for w in ws]
    os.killpg(worker.proc.pid, 9)  # its whole sandbox, as an OOM kill or an operator would
    worker.proc.wait()
    start = pool_stats()
    r = run_python_tests(SOLUTION, TESTS, _settings())
    assert r.passed, (r.verdict_error, r.stderr[-500:])
    now = pool_stats()
    assert (now["spawned"] - start["spawned"], now["retired"] - start["retired"]) == (1, 1)
    close_workers()
