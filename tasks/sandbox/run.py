"""Run untrusted generated Python (a solution file plus a test file) in a sandbox.

    result = run_python_tests(solution_code, test_code, SandboxSettings())
    results = run_many([(solution_code, test_code), ...], settings)
    result = run_python_program(code, stdin, settings)   # a plain script: exit status and output only

`run_python_program` (the SandboxFusion-compatible service, tasks/sandbox/service.py) runs `code` as
`python main.py` in `/sandbox` with `stdin` (a host file opened read-only, never inside the sandbox's
view) on its standard input: same isolation and limits, no harness and no result channel, so `passed`
means only that it exited 0 and nothing killed it (the caller compares the output).

Inside, the solution is `solution.py` and the tests `test_solution.py`, side by
side in the working dir `/sandbox` (the tests `from solution import ...`).

How the tests run (decided from the test file's text): the host writes a harness
(tasks/sandbox/harness.py) beside them as `_evolforge_harness.py` and runs it.
- pytest style (a top-level `def test_...`, a `class Test...` or an import of
  pytest): the harness runs pytest (`-q -p no:cacheprovider --tb=short
  test_solution.py`, PYTEST_DISABLE_PLUGIN_AUTOLOAD=1) with its own plugin.
- otherwise an assert-based script: the harness runs `test_solution.py` with runpy.

The verdict comes from a result channel, not from the output or the exit status
alone. Before the start the host creates two pipes and passes them through
bwrap, prlimit and setpriv: one holds a per-run nonce (secrets.token_hex),
which the harness reads and closes before the solution is imported (never in
argv, the environment or a file, all readable by the code under test); on the
other the harness writes one final JSON record carrying that nonce: for pytest
{collected, passed, failed, errors, skipped, exitstatus, tampered} counted by
its plugin from each test phase's real exception (a makereport hookwrapper),
written at pytest_sessionfinish; for a script, that it returned normally
(SystemExit of any code writes nothing). The host (tasks/sandbox/verdict.py)
passes a run only if the exit status is 0, nothing killed it, exactly one
well-formed final record with the right nonce arrived and no other line did (a
line without the nonce is forged: failure), and for pytest: exitstatus 0,
collected > 0, passed == collected, no failure or error, no tampering reported,
and at least as many tests collected as the test file declares (`declared_tests`,
from its AST: hidden or deselected tests fail the run). `tests_passed` and
`tests_failed` come from that record. An early exit, a crash, a missing,
duplicated, malformed or forged record all fail; `verdict_error` says which.

What the channel does not stop: the code under test runs in the same interpreter
as pytest and the harness. The harness adds defenses that hold against the
obvious tools: it makes itself non-dumpable (its /proc/<pid>/mem is closed to the
sandbox's uid, itself included; in bwrap mode only, as rlimits-only may run as
root), and an audit hook (irremovable) refuses gc.get_objects/get_referrers/
get_referents, all of ctypes, sys.settrace/setprofile and opening a process's
`mem`; it checks that each collected test's code object is code of the test
file as pytest executed it (a swapped test module fails), and it reports
pytest's, pluggy's, the builtins' and its own functions and classes that changed
while the tests ran (monkeypatched pytest internals fail). Code that walks frames
(sys._getframe, tracebacks) to pytest's live objects or to the harness's plugin
can still read the nonce or rewrite the counts, and rebinding the test module's
helper globals or pytest state on live instances is not noticed. It is a strong
filter against reward hacking, not a proof; a verdict that holds against that
needs the solution in another process than the tests (calls marshalled across).

Isolation (mode "bwrap", see tasks/sandbox/limits.py): no network (own network
namespace), own PID namespace (everything dies with the run), read-only view of
/usr, the interpreter prefix and its site-packages only (not /root, /home, /work),
private tmpfs working dir and /tmp, cleared environment (the gateway's API key is
never passed, not even to bwrap), a dedicated unprivileged uid when started as
root, no capabilities, and rlimits on CPU seconds, address space, processes, file
size and open files. The parent enforces a wall-clock timeout and an output cap
(stdout, stderr and the result channel together) by killing the whole process
group, and returns only once the sandbox's PID namespace is empty (it watches
the namespace's init, whose pid bwrap reports on --info-fd), so no process of
the run survives it. Mode "rlimits-only" keeps only the rlimits, the new
session, the clean environment, the temp dir, the kills (plus a best-effort kill
of leftovers that left the session, found by an environment marker) and the
result channel; it is not a security boundary and must be chosen explicitly.

Warm workers (sandbox.reuse_workers, on by default in bwrap mode; tasks/sandbox/pool.py and worker.py): the
same view, namespaces, limits, uid drop and result channel, but the bwrap sandbox, the interpreter and pytest
start once per worker; each check is a child forked from a worker that never ran a check's code, with fresh
tmpfs on /sandbox, /tmp and /dev/shm in its own mount and IPC namespaces, its own session, rlimits and uid and
no capabilities. Every other process of the sandbox is killed before the next check; a timeout, an output cap,
a survivor or a protocol anomaly retires the worker. The availability probe always uses the per-run path.

Limits are per process (RLIMIT_*): a run may use up to max_processes x memory_mb
of address space and each process its own cpu_seconds; the wall timeout bounds
the run as a whole. There is no seccomp filter, so the code may still create user
namespaces (without gaining access to anything outside its view).

`killed_reason` is one of: None, "wall_timeout", "output_cap" (set by the parent,
reliable), "cpu_limit" (SIGXCPU, or a SIGKILL after cpu_seconds), "memory",
"process_limit", "file_size" (read from the run's own output, so informative
only: untrusted code could print them), "signal:N", or "worker_lost" (reuse_workers: the worker's
sandbox ended or broke its protocol during the run; that worker is replaced).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import secrets
import select
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.host import (
    HARNESS_FILE,
    NS_EXIT_WAIT_S,
    PROGRAM_FILE,
    SOLUTION_FILE,
    TEST_FILE,
    ResultChannel,
    SandboxResult,
    classify_exit,
    drain_result,
    inner_env,
    kill_group,
    release_uid,
    take_uid,
    watch_sandbox_init,
)
from evolforge.tasks.sandbox.limits import (
    SandboxUnavailable,
    bwrap_argv,
    drop_argv,
    interpreter_layout,
    limits_argv,
    tool,
)
from evolforge.tasks.sandbox.pool import run_in_worker
from evolforge.tasks.sandbox.verdict import declared_tests, judge

__all__ = ["SandboxResult", "SandboxUnavailable", "check_sandbox_available", "run_many", "run_python_program",
           "run_python_tests"]

_UNUSED_PLUGINS = ("cacheprovider", "pastebin", "junitxml", "doctest", "setuponly", "setupplan", "stepwise",
                   "unraisableexception", "threadexception", "faulthandler")  # nothing a check needs; each costs time
PYTEST_ARGS = ["-m", "pytest", "-q", *(a for p in _UNUSED_PLUGINS for a in ("-p", f"no:{p}")), "--tb=short", TEST_FILE]  # what the harness runs
_HARNESS_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.py")
_PYTEST_STYLE = re.compile(r"^(?:async\s+)?def\s+test\w*\s*\(|^class\s+Test\w*|^\s*(?:import|from)\s+pytest\b", re.M)
_GRACE_S = 0.25  # after the main process exits, how long to keep draining pipes held by leftovers
_probed: dict[tuple, None] = {}
log = logging.getLogger(__name__)


def uses_pytest(test_code: str) -> bool:
    return bool(_PYTEST_STYLE.search(test_code))


def check_sandbox_available(settings: SandboxSettings) -> None:
    """Raise SandboxUnavailable (naming the fix) unless the configured mode can run here."""
    if settings.mode == "bwrap":
        path = settings.bwrap_path
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise SandboxUnavailable(
                f"bubblewrap not found at {path!r}: refusing to run untrusted code without a sandbox. "
                "Install it with `apt-get install -y bubblewrap` (or set sandbox.bwrap_path), or set "
                'sandbox.mode = "rlimits-only" to accept running it WITHOUT isolation (not a security boundary).'
            )
    tool("prlimit")
    if settings.mode == "bwrap":
        tool("setpriv")
    interpreter_layout(settings.python)
    for extra in settings.extra_ro_binds:
        if not os.path.exists(extra):
            raise SandboxUnavailable(f"sandbox.extra_ro_binds: {extra!r} does not exist")
    key = (settings.mode, settings.bwrap_path, settings.python, os.geteuid())
    if settings.mode == "rlimits-only" and key not in _probed:
        log.warning("sandbox mode rlimits-only: untrusted code runs WITHOUT isolation (the calling user's files, "
                    "network and processes are reachable); use mode bwrap for generated code")
        _probed[key] = None
    if settings.mode == "bwrap" and key not in _probed:  # one real start per configuration
        probe = settings.model_copy(update={"wall_timeout_seconds": 30.0})
        r = _run(probe, {}, ["-c", "print('ok')"], "raw")
        if r.exit_code != 0 or r.stdout.strip() != "ok":
            raise SandboxUnavailable(f"bubblewrap sandbox failed to start (exit {r.exit_code}): {r.stderr.strip()[-800:]}")
        _probed[key] = None


def run_python_tests(solution_code: str, test_code: str, settings: SandboxSettings) -> SandboxResult:
    """Run `test_code` against `solution_code` in the sandbox; never raises for anything the code does."""
    check_sandbox_available(settings)
    runner = "pytest" if uses_pytest(test_code) else "script"
    options = PYTEST_ARGS[2:-1] if runner == "pytest" else []
    files = {SOLUTION_FILE: solution_code, TEST_FILE: test_code, HARNESS_FILE: _harness_source()}
    declared = declared_tests(test_code) if runner == "pytest" else 0
    return _run(settings, files, options, runner, declared)


def run_python_program(code: str, stdin: str | None, settings: SandboxSettings) -> SandboxResult:
    """Run `code` as a script with `stdin` (None: empty) on its standard input; never raises for what the code does."""
    check_sandbox_available(settings)
    return _run(settings, {PROGRAM_FILE: code}, [PROGRAM_FILE], "raw", stdin=stdin)


def run_many(jobs: Iterable[tuple[str, str]], settings: SandboxSettings) -> list[SandboxResult]:
    """Run (solution_code, test_code) pairs, at most settings.max_parallel at once; results in input order."""
    jobs = list(jobs)
    check_sandbox_available(settings)
    with ThreadPoolExecutor(max_workers=settings.max_parallel, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: run_python_tests(job[0], job[1], settings), jobs))


@functools.lru_cache(maxsize=1)
def _harness_source() -> str:
    with open(_HARNESS_SOURCE, encoding="utf-8") as f:
        return f.read()


def _run(settings: SandboxSettings, files: dict[str, str], args: list[str], runner: str,
         declared: int = 0, stdin: str | None = None) -> SandboxResult:
    """runner "pytest" / "script": through the harness and its result channel; "raw": `python *args` (the probe,
    run_python_program). `stdin` goes into a host file outside the sandbox's view, opened as its standard input.
    With sandbox.reuse_workers (bwrap mode) every run but the probe goes to a warm worker (tasks/sandbox/pool.py)."""
    if settings.mode == "bwrap" and settings.reuse_workers and (runner != "raw" or args == [PROGRAM_FILE]):
        files = {name: code for name, code in files.items() if name != HARNESS_FILE}  # the worker has it loaded
        return run_in_worker(settings, files, args if runner == "raw" else [TEST_FILE, *args], runner, declared, stdin)
    hostdir = tempfile.mkdtemp(prefix="evolforge-sbx-")
    uid, channel = None, None
    try:
        paths = {}
        for name, code in files.items():
            paths[name] = os.path.join(hostdir, name)
            with open(paths[name], "w", encoding="utf-8") as f:
                f.write(code)
            os.chmod(paths[name], 0o644)
        stdin_path = None
        if stdin is not None:
            stdin_path = os.path.join(hostdir, ".stdin")  # not in `paths`: never bound into the sandbox
            with open(stdin_path, "w", encoding="utf-8") as f:
                f.write(stdin)
        if runner != "raw":
            channel = ResultChannel()
            args = channel.harness_args(runner) + args
        env = inner_env()
        marker, info = "", None
        if settings.mode == "bwrap":
            privileged = os.geteuid() == 0
            uid = take_uid(settings.uid_base) if privileged else None
            opts, python = bwrap_argv(settings, paths, env, privileged)
            inner = limits_argv(settings) + drop_argv(uid) + [python] + args
            info = os.pipe()  # bwrap reports the host pid of the sandbox's init (PID 1) here
            argv, cwd = opts + ["--info-fd", str(info[1]), "--"] + inner, "/"
            popen_env = {"PATH": "/usr/bin:/bin"}  # bwrap itself never sees the host environment
        else:
            marker = secrets.token_hex(8)
            env.update(HOME=hostdir, TMPDIR=hostdir, EVOLFORGE_SANDBOX_RUN=marker)
            argv, cwd, popen_env = limits_argv(settings) + [settings.python] + args, hostdir, env
        return _execute(settings, argv, cwd, popen_env, marker, runner, info, channel, declared, stdin_path)
    finally:
        if channel is not None:
            channel.close()
        if uid is not None:
            release_uid(uid)
        shutil.rmtree(hostdir, ignore_errors=True)


def _execute(settings: SandboxSettings, argv: list[str], cwd: str, env: dict, marker: str, runner: str,
             info: tuple[int, int] | None, channel: ResultChannel | None, declared: int,
             stdin_path: str | None = None) -> SandboxResult:
    started = time.monotonic()
    state: dict = {"info_fd": info[0] if info else None, "info": b"", "ns_pidfd": None,
                   "result_fd": channel.fds["result_r"] if channel else None}
    pass_fds = (info[1:] if info else ()) + (channel.child_fds() if channel else ())
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, close_fds=True, pass_fds=pass_fds)
    except BaseException:
        if info:
            os.close(info[0])
        raise
    finally:
        if stdin_path:
            stdin.close()  # the sandbox holds its own copy of the descriptor
        if info:
            os.close(info[1])  # the write end now lives in bwrap only
        if channel:
            channel.close("nonce_r", "result_w")  # and the harness's ends in the sandbox only
    bufs = {"out": bytearray(), "err": bytearray(), "res": bytearray()}
    reason, total = None, 0
    try:
        reason, total = _pump(proc, settings, started, state, bufs)
    finally:
        if state["info_fd"] is not None and state["ns_pidfd"] is None:  # killed before bwrap's report was read
            os.set_blocking(state["info_fd"], False)
            try:
                watch_sandbox_init(state, os.read(state["info_fd"], 4096))
            except BlockingIOError:
                pass
        kill_group(proc.pid)  # the leader is not reaped yet, so its pid (= pgid) cannot have been reused
        proc.wait()
        if state["ns_pidfd"] is not None:  # the sandbox's init exits only once every process in it is gone
            select.select([state["ns_pidfd"]], [], [], NS_EXIT_WAIT_S)
            os.close(state["ns_pidfd"])
        if state["info_fd"] is not None:
            os.close(state["info_fd"])
        proc.stdout.close()
        proc.stderr.close()
        duration = time.monotonic() - started
        if marker:
            _kill_marked(marker)
        if channel and not reason:  # every writer is gone: take what is left in the pipe, within the cap
            reason = drain_result(state["result_fd"], bufs["res"], settings.max_output_bytes - total)
    stdout, stderr = bufs["out"].decode("utf-8", "replace"), bufs["err"].decode("utf-8", "replace")
    reason = reason or classify_exit(proc.returncode, duration, settings, stdout + stderr)
    passed = proc.returncode == 0 and reason is None
    verdict = judge(bytes(bufs["res"]), channel.nonce, runner, declared) if channel else None
    if verdict is not None:
        passed = passed and verdict.ok
    return SandboxResult(passed=passed, exit_code=proc.returncode, timed_out=reason == "wall_timeout",
                         killed_reason=reason, stdout=stdout, stderr=stderr, duration_s=round(duration, 4),
                         runner=runner, tests_passed=verdict.tests_passed if verdict else None,
                         tests_failed=verdict.tests_failed if verdict else None,
                         verdict_error=verdict.error if verdict else None)


def _pump(proc: subprocess.Popen, settings: SandboxSettings, started: float, state: dict,
          bufs: dict[str, bytearray]) -> tuple[str | None, int]:
    """Read stdout, stderr and the result channel incrementally until the run ends, times out or writes too much."""
    total, cap, reason, exited_at = 0, settings.max_output_bytes, None, None
    deadline = started + settings.wall_timeout_seconds
    pidfd = os.pidfd_open(proc.pid)
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(proc.stderr, selectors.EVENT_READ, "err")
        sel.register(pidfd, selectors.EVENT_READ, "exit")
        if state["info_fd"] is not None:
            sel.register(state["info_fd"], selectors.EVENT_READ, "info")
        if state["result_fd"] is not None:
            sel.register(state["result_fd"], selectors.EVENT_READ, "res")
        try:
            while True:
                now = time.monotonic()
                if exited_at is not None and (not sel.get_map() or now - exited_at > _GRACE_S):
                    break
                if now >= deadline:
                    reason = "wall_timeout"
                    break
                for key, _ in sel.select(timeout=min(deadline - now, _GRACE_S)):
                    if key.data == "exit":
                        exited_at = time.monotonic()
                        sel.unregister(pidfd)
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    if key.data == "info":
                        watch_sandbox_init(state, chunk)
                        continue
                    keep = max(0, cap - total)
                    bufs[key.data] += chunk[:keep]
                    total += len(chunk)
                    if total > cap:
                        reason = "output_cap"
                if reason:
                    break
        finally:
            os.close(pidfd)
    return reason, total


def _kill_marked(marker: str) -> None:
    """rlimits-only: best effort, kill leftovers that left the process group but kept the run's env marker."""
    needle = f"EVOLFORGE_SANDBOX_RUN={marker}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read():
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
