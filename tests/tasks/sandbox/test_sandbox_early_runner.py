"""A runner that ends before the solution process said hello (issue 41).

A test that never uses the solution (a script that only reads files, as in test_host_secrets_are_not_readable) can
end before the solution process has imported solution.py. Its hello then went to a closed pipe, BrokenPipeError
ended the solution process with status 1, and when the worker looked at it after that (and before killing it) a
correct check failed: "the solution process ended before the tests were done (exit status 1)", or "(unknown
status)" when the worker saw it as a zombie. About 1 check in 100 on warm workers at tree 227dd0d and at the
reverted faster worker (3b9a901), quiet machine. The solution process now waits to be killed, as at EOF.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.run import run_python_tests

HAS_BWRAP = os.access("/usr/bin/bwrap", os.X_OK)
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap not installed (apt-get install -y bubblewrap)")

READS_FILES = (  # a correct check that never uses the solution: it can end before the solution's hello
    "import json\nseen = {}\nfor path in ['/proc/1/environ', '/etc/shadow']:\n"
    "    try:\n        seen[path] = open(path).read()\n    except OSError as e:\n        seen[path] = type(e).__name__\n"
    "print(json.dumps(seen))\n"
)


def _outlives_a_runner_gone_before_its_hello(argv: list[str], waits_in: str, settle: float) -> None:
    """Start a solution process (`argv`, its "{rfd}" and "{wfd}" filled with the channel's descriptors) whose runner
    end is already closed, wait until it blocks in `waits_in` (its wait to be killed) and check it is still alive
    `settle` seconds later."""
    to_solution, to_runner = os.pipe(), os.pipe()
    os.close(to_runner[0])  # the runner is gone: the hello hits a closed pipe
    argv = [a.format(rfd=to_solution[0], wfd=to_runner[1]) for a in argv]
    proc = subprocess.Popen(argv, pass_fds=(to_solution[0], to_runner[1]), stderr=subprocess.PIPE)
    os.close(to_solution[0])
    os.close(to_runner[1])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:  # wait until it has loaded and said hello
            try:
                with open(f"/proc/{proc.pid}/wchan") as f:
                    if waits_in in f.read():
                        break
            except OSError:
                pass
            time.sleep(0.02)
        time.sleep(settle)
        assert proc.poll() is None, f"the solution process ended by itself ({proc.returncode}): " \
                                    f"{proc.stderr.read().decode()[-500:]}"
    finally:
        proc.kill()
        proc.wait()
        os.close(to_solution[1])


def test_solution_process_outlives_a_runner_gone_before_its_hello(tmp_path):
    """The cause, without the race: bridge.serve with the runner's end of the channel already closed."""
    (tmp_path / "solution.py").write_text("def add(a, b):\n    return a + b\n")
    code = "import sys\nfrom evolforge.tasks.sandbox import bridge\nbridge.serve({rfd}, {wfd}, sys.argv[1])\n"
    _outlives_a_runner_gone_before_its_hello([sys.executable, "-c", code, str(tmp_path / "solution.py")],
                                             "nanosleep", 0.3)


def _checks(settings, n: int) -> list[str]:
    failed = []
    for _ in range(n):
        r = run_python_tests("", READS_FILES, settings)
        if not r.passed:
            failed.append(r.verdict_error or r.stderr[-200:])
    return failed


@needs_bwrap
@pytest.mark.slow("600 warm-worker checks, half of them under a busy loop per core")
def test_a_check_that_never_uses_the_solution_passes_every_time():
    """The race itself: 300 such checks on warm workers on a quiet machine (where it was most frequent) and 300
    with a busy process per core; every one passes."""
    settings = SandboxSettings(max_output_bytes=200_000, max_parallel=4, reuse_workers=True)
    failed = _checks(settings, 300)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        failed += _checks(settings, 300)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert not failed, f"{len(failed)} of 600 correct checks failed: {failed[:3]}"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_js_solution_process_outlives_a_runner_gone_before_its_hello(tmp_path):
    """The same for JavaScript (tasks/sandbox/bridge.js): node throws EPIPE at the hello to a closed pipe, which ended
    the solution process with status 1; it now waits to be killed, as at EOF."""
    from importlib.resources import files

    bridge = str(files("evolforge.tasks.sandbox") / "bridge.js")
    (tmp_path / "solution.js").write_text("function add(a, b) { return a + b; }\nmodule.exports = { add };\n")
    _outlives_a_runner_gone_before_its_hello(["node", bridge, "serve", "{rfd}", "{wfd}", str(tmp_path / "solution.js")],
                                             "futex", 0.5)
