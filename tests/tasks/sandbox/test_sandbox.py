"""Security and functional tests of the sandbox (tasks/sandbox/run.py), on warm workers and one sandbox per check.

Each attack runs as untrusted code inside the sandbox; the test checks that the
attempt failed or was killed, that the result records why, and that the host is
unharmed (no file written, no secret read, no process left behind).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.run import SandboxUnavailable, check_sandbox_available, run_many, run_python_tests

REPO = Path(__file__).resolve().parents[3]  # tests/tasks/sandbox/ -> the repository root
HAS_BWRAP = os.access("/usr/bin/bwrap", os.X_OK)
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap not installed (apt-get install -y bubblewrap)")

SOLUTION = "def add(a, b):\n    return a + b\n"
TESTS = "from solution import add\n\ndef test_small():\n    assert add(1, 2) == 3\n\ndef test_zero():\n    assert add(0, 0) == 0\n"


_REUSE_WORKERS = [True]  # set per test by the fixture below
PER_CHECK = "one bwrap sandbox per check (reuse_workers = false); the warm-worker case, the default, stays"


# warm workers (the default) in the quick tier; one bwrap sandbox per check in the full tier (make test-all, CI)
@pytest.fixture(autouse=True, params=[True, pytest.param(False, marks=pytest.mark.slow(PER_CHECK))],
                ids=["workers", "per-check"])
def _both_sandbox_paths(request):
    """Every case runs on warm workers (the default) and with one bwrap sandbox per check."""
    _REUSE_WORKERS[0] = request.param
    yield
    _REUSE_WORKERS[0] = True


def _settings(**kw) -> SandboxSettings:
    base = dict(cpu_seconds=3, memory_mb=512, max_processes=32, wall_timeout_seconds=15,
                max_output_bytes=200_000, max_parallel=4, reuse_workers=_REUSE_WORKERS[0])
    return SandboxSettings(**(base | kw))


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _another_runs_it(pid: int, sandbox_uids: range) -> bool:
    """Whether the process belongs to another live process tree than this test's: above it, before init, is a
    Python process outside the sandbox uids that is not this test process (another test process on the machine,
    with warm sandbox workers of its own). A process that escaped this test's sandbox is orphaned to init (or a
    subreaper) and is nobody's."""
    me, p, hops = os.getpid(), _parent(pid), 0
    while p not in (None, 0, 1) and hops < 64:
        if p == me:
            return False
        if _uid(p) not in sandbox_uids and os.path.basename(_exe(p)).startswith("python"):
            return True
        p, hops = _parent(p), hops + 1
    return False


def _uid(pid: int) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _survivors(settings: SandboxSettings, marker: str | None = None, settle_s: float = 3.0) -> list[str]:
    """Host processes running as a sandbox uid, or whose command line holds `marker`, except those of another
    test run's sandboxes (other pytest processes on the machine keep warm workers of their own), that are still
    there after `settle_s`: another test process that kills its sandbox workers at that moment leaves their
    processes orphaned for the instant before the kernel ends their namespace (seen once in `make test`); an
    escape from this test's sandbox stays (its sleeps last over an hour)."""
    found = _census(settings, marker)
    deadline = time.monotonic() + settle_s
    while found and time.monotonic() < deadline:
        time.sleep(0.1)
        found = [line for line in _census(settings, marker) if line in found]
    return found


def _census(settings: SandboxSettings, marker: str | None) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "uid=,pid=,args="], capture_output=True, text=True, check=True).stdout
    uids = range(settings.uid_base, settings.uid_base + 65_536)
    found = []
    for line in ps.splitlines():
        uid, pid, args = line.split(None, 2) if len(line.split(None, 2)) == 3 else (*line.split(None, 1), "")
        if int(pid) == os.getpid() or "ps -eo" in args:
            continue
        if (int(uid) in uids or (marker and marker in args)) and not _another_runs_it(int(pid), uids):
            found.append(line)
    return found


def test_the_census_counts_an_orphan_and_not_another_test_runs_process():
    """The survivor census this module relies on: a process orphaned to init (what an escape from a sandbox leaves)
    is counted; a process under another live Python process (another test run's sandbox worker) is not."""
    settings = SandboxSettings()
    orphan, owned = "4242.1717", "4242.2727"
    subprocess.run(["sh", "-c", f"sleep {orphan} >/dev/null 2>&1 &"], check=True)  # sh exits: sleep goes to init
    other = subprocess.Popen([sys.executable, "-c", f"import subprocess; subprocess.run(['sleep', '{owned}'])"])
    try:
        deadline = time.monotonic() + 10
        while not any(owned in line for line in subprocess.run(["ps", "-eo", "args="], capture_output=True,
                                                                text=True).stdout.splitlines()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert [x for x in _survivors(settings, orphan) if orphan in x]
        assert _survivors(settings, owned) == []
    finally:
        subprocess.run(["pkill", "-f", f"sleep {orphan}"])
        other.kill()
        subprocess.run(["pkill", "-f", f"sleep {owned}"])


# ---------------------------------------------------------------- functional


@needs_bwrap
def test_passing_task_passes():
    r = run_python_tests(SOLUTION, TESTS, _settings())
    assert r.passed and r.exit_code == 0 and r.killed_reason is None and not r.timed_out
    assert (r.runner, r.tests_passed, r.tests_failed) == ("pytest", 2, 0)
    assert r.duration_s > 0


@needs_bwrap
def test_failing_test_fails_with_output_captured():
    r = run_python_tests("def add(a, b):\n    return a - b\n", TESTS, _settings())
    assert not r.passed and r.exit_code == 1 and r.killed_reason is None
    assert (r.tests_passed, r.tests_failed) == (1, 1)
    assert "assert -1 == 3" in r.stdout and "FAILED test_solution.py::test_small" in r.stdout


@needs_bwrap
def test_assert_script_mode():
    ok = run_python_tests(SOLUTION, "from solution import add\nassert add(2, 2) == 4\n", _settings())
    bad = run_python_tests(SOLUTION, "from solution import add\nassert add(2, 2) == 5, 'wrong sum'\n", _settings())
    assert ok.passed and ok.runner == "script" and ok.tests_passed is None
    assert not bad.passed and bad.exit_code == 1 and "AssertionError: wrong sum" in bad.stderr


@needs_bwrap
def test_early_exit_does_not_pass_pytest():
    r = run_python_tests("import os\nos._exit(0)\n", TESTS, _settings())
    assert not r.passed and r.tests_passed in (None, 0) and "solution process" in r.verdict_error


def _pids_running(argv: list[str]) -> list[int]:
    want = ("\0".join(argv) + "\0").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == want:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@needs_bwrap
def test_run_many_in_parallel_keeps_order():
    """The runs overlap, shown by a condition and not a clock (which a loaded host stretches): each of the four
    slow checks waits on a `sleep` of its own, and this test ends those sleeps only once all four are alive at
    once. Checks run one after the other never show four, and would each end at their wall timeout."""
    argv = ["sleep", f"7373.{os.getpid()}"]
    slow = f"import subprocess\nfrom solution import add\n\ndef test_slow():\n    subprocess.run({argv!r})\n" \
           "    assert add(1, 1) == 2\n"
    jobs = [(SOLUTION, slow)] * 4 + [("def add(a, b):\n    return 0\n", TESTS), (SOLUTION, TESTS)]
    done, seen = threading.Event(), []

    def end_the_sleeps_once_four_run():
        while not done.is_set():
            pids = _pids_running(argv)
            if len(pids) >= 4:
                seen.append(len(pids))
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    watcher = threading.Thread(target=end_the_sleeps_once_four_run, daemon=True)
    watcher.start()
    try:
        results = run_many(jobs, _settings(max_parallel=4))
    finally:
        done.set()
        watcher.join()
    assert seen, "the four slow checks never ran at the same time"
    assert [r.passed for r in results] == [True, True, True, True, False, True]


def test_bwrap_missing_refuses_unless_rlimits_only_is_chosen():
    missing = _settings(bwrap_path="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match=r"apt-get install -y bubblewrap.*rlimits-only"):
        check_sandbox_available(missing)
    with pytest.raises(SandboxUnavailable):
        run_python_tests(SOLUTION, TESTS, missing)
    with pytest.raises(SandboxUnavailable):
        run_many([(SOLUTION, TESTS)], missing)
    weak = missing.model_copy(update={"mode": "rlimits-only"})
    r = run_python_tests(SOLUTION, TESTS, weak)
    assert r.passed and r.tests_passed == 2
    slow = run_python_tests("", "import time\ntime.sleep(60)\n", weak.model_copy(update={"wall_timeout_seconds": 1.0}))
    assert slow.timed_out and slow.killed_reason == "wall_timeout" and slow.duration_s < 30  # half the sleep


def test_settings_are_validated():
    with pytest.raises(ValidationError):
        SandboxSettings(mode="docker")
    with pytest.raises(ValidationError):
        SandboxSettings(cpu_secs=3)
    with pytest.raises(ValidationError):
        SandboxSettings(extra_ro_binds=["relative/path"])
    assert SandboxSettings().python == sys.executable


# ---------------------------------------------------------------- security


@needs_bwrap
def test_network_is_unreachable():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    attack = (
        "import socket\n\ndef test_connect_to_host():\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).sendall(b'stolen')\n\n"
        "def test_connect_outside():\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n\n"
        "def test_dns():\n    socket.getaddrinfo('example.com', 443)\n"
    )
    try:
        r = run_python_tests("", attack, _settings())
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached the host listener
    finally:
        listener.close()
    assert not r.passed and (r.tests_passed, r.tests_failed) == (0, 3)
    assert "ConnectionRefusedError" in r.stdout and "Network is unreachable" in r.stdout


@needs_bwrap
def test_host_secrets_are_not_readable():
    homes = [Path("/root")] if os.access("/root", os.W_OK) else [Path.home()]
    secrets_on_host = [h / f".evolforge-sbx-secret-{os.getpid()}" for h in homes + [REPO]]
    attack = (
        "import json, os\nseen = {}\n"
        f"for path in {[str(p) for p in secrets_on_host]!r} + ['/proc/1/environ', '/work/main/pyproject.toml', '/etc/shadow']:\n"
        "    try:\n        seen[path] = open(path).read()\n    except OSError as e:\n        seen[path] = type(e).__name__\n"
        "seen['/'] = sorted(os.listdir('/'))\nseen['/root'] = sorted(os.listdir('/root'))\n"
        "seen['/root/.pyenv'] = sorted(os.listdir('/root/.pyenv')) if os.path.isdir('/root/.pyenv') else []\n"
        "print(json.dumps(seen))\n"
    )
    try:
        for p in secrets_on_host:
            p.write_text("TOP-SECRET-VALUE")
        r = run_python_tests("", attack, _settings())
    finally:
        for p in secrets_on_host:
            p.unlink(missing_ok=True)
    assert r.passed, r.stderr
    assert "TOP-SECRET-VALUE" not in r.stdout
    seen = json.loads(r.stdout)
    for p in secrets_on_host:
        assert seen[str(p)] == "FileNotFoundError"
    assert seen["/proc/1/environ"] == "PermissionError"  # bwrap's init (root) is not readable by the sandbox uid
    assert seen["/work/main/pyproject.toml"] == seen["/etc/shadow"] == "FileNotFoundError"
    assert "work" not in seen["/"] and "home" not in seen["/"]
    assert seen["/root"] in ([".pyenv"], [])  # only the interpreter prefix path, nothing else of /root
    assert seen["/root/.pyenv"] in (["versions"], [])


@needs_bwrap
def test_cannot_write_outside_its_temp_folder():
    stamp = f"evolforge-sbx-pwned-{os.getpid()}"
    targets = [f"/{stamp}", f"/usr/{stamp}", f"/etc/{stamp}", f"/root/{stamp}", f"{sys.base_prefix}/{stamp}",
               f"/venv/lib/python3.11/site-packages/{stamp}.py", f"{REPO}/{stamp}", f"/tmp/../{stamp}"]
    attack = (
        "import json\nout = {}\n"
        f"for path in {targets!r} + ['/sandbox/ok.txt', '/tmp/ok.txt']:\n"
        "    try:\n        open(path, 'w').write('x')\n        out[path] = 'written'\n"
        "    except OSError as e:\n        out[path] = type(e).__name__\nprint(json.dumps(out))\n"
    )
    r = run_python_tests("", attack, _settings())
    assert r.passed, r.stderr
    out = json.loads(r.stdout)
    assert out.pop("/sandbox/ok.txt") == out.pop("/tmp/ok.txt") == "written"
    assert all(v != "written" for v in out.values()), out
    for path in targets + [f"/tmp/{stamp}"]:
        assert not os.path.exists(path), path


@needs_bwrap
def test_fork_bomb_hits_the_process_limit():
    settings = _settings(max_processes=32)
    marker = "313.7171"
    bomb = (  # bounded: at most 300 children, each sleeping
        "import os, subprocess\n\ndef test_bomb():\n    for _ in range(300):\n"
        f"        if os.fork() == 0:\n            os.execv('/usr/bin/sleep', ['sleep', '{marker}'])\n"
    )
    before = len(os.listdir("/proc"))
    r = run_python_tests("", bomb, settings)
    assert not r.passed and r.killed_reason == "process_limit", (r.killed_reason, r.stdout[-2000:])
    assert "BlockingIOError" in r.stdout
    assert _survivors(settings, marker) == []
    assert len(os.listdir("/proc")) < before + 20  # the host's process table is back to normal
    assert subprocess.run(["true"]).returncode == 0  # and the host can still fork


@needs_bwrap
def test_unbounded_memory_is_stopped():
    hog = "def test_hog():\n    hog = []\n    for _ in range(10_000):\n        hog.append(bytearray(32 * 1024 * 1024))\n"
    r = run_python_tests("", hog, _settings(memory_mb=256))
    assert not r.passed and r.killed_reason == "memory" and "MemoryError" in r.stdout


@needs_bwrap
def test_infinite_loop_hits_the_cpu_limit():
    r = run_python_tests("", "while True:\n    pass\n", _settings(cpu_seconds=1, wall_timeout_seconds=20))
    assert not r.passed and r.killed_reason == "cpu_limit" and not r.timed_out  # before the wall timeout


@needs_bwrap
def test_sleeping_forever_hits_the_wall_timeout():
    r = run_python_tests("import time\ntime.sleep(600)\n", TESTS, _settings(wall_timeout_seconds=2))
    assert not r.passed and r.timed_out and r.killed_reason == "wall_timeout"
    assert 2 <= r.duration_s < 300  # the timeout's kill, not the sleep's end (600 s)


@needs_bwrap
def test_printing_gigabytes_is_cut_off():
    flood = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(5 * 1024):\n    sys.stdout.write(chunk)\n"
    r = run_python_tests("", flood, _settings(max_output_bytes=200_000))
    assert not r.passed and r.killed_reason == "output_cap"
    assert len(r.stdout) + len(r.stderr) <= 200_000 and not r.timed_out  # cut off, not run to the wall timeout


@needs_bwrap
def test_large_file_write_hits_the_file_size_limit():
    big = "open('big.bin', 'wb').write(b'x' * (8 * 1024 * 1024))\n"
    r = run_python_tests("", big, _settings(max_file_size_mb=1))
    assert not r.passed and r.killed_reason == "file_size" and "File too large" in r.stderr


@pytest.mark.parametrize("mode", ["bwrap", "rlimits-only"])
def test_background_processes_do_not_survive(mode):
    if mode == "bwrap" and not HAS_BWRAP:
        pytest.skip("bubblewrap not installed")
    marker = f"4242.{os.getpid()}{len(mode)}"
    spawn = (
        "import os, subprocess, sys\n"
        f"subprocess.Popen(['sleep', '{marker}'])\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/usr/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\n"
        "print('spawned')\n"
    )
    settings = _settings(mode=mode)
    r = run_python_tests("", spawn, settings)
    assert r.passed and "spawned" in r.stdout and not r.timed_out  # the run did not wait for its strays
    time.sleep(0.2)
    assert _survivors(settings, marker) == []


@pytest.mark.parametrize("mode", ["bwrap", "rlimits-only"])
def test_api_key_is_not_visible(mode, monkeypatch):
    if mode == "bwrap" and not HAS_BWRAP:
        pytest.skip("bubblewrap not installed")
    monkeypatch.setenv("EVOLFORGE_API_KEY", "sk-test-secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    snoop = (
        "import glob, os\nprint(sorted(os.environ))\nprint([v for v in os.environ.values() if 'sk-' in v])\n"
        "if os.path.isdir('/sandbox'):\n    for p in glob.glob('/proc/*/environ'):\n"
        "        try:\n            print(p, open(p, 'rb').read())\n        except OSError as e:\n            print(p, type(e).__name__)\n"
    )
    r = run_python_tests("", snoop, _settings(mode=mode))
    assert r.passed, r.stderr
    assert "sk-test-secret" not in r.stdout + r.stderr
    assert "EVOLFORGE_API_KEY" not in r.stdout and "OPENAI_API_KEY" not in r.stdout
