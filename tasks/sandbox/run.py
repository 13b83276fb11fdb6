"""Run untrusted generated code (a solution file plus a test file, or a program) in a sandbox.

    result = run_python_tests(solution_code, test_code, SandboxSettings())
    results = run_many([(solution_code, test_code), ...], settings)
    result = run_python_program(code, stdin, settings)   # a plain script: exit status and output only
    result = run_tests(solution_js, test_js, settings, language="nodejs")   # any row of languages.py
    result = run_program(code_js, stdin, settings, language="nodejs")

Languages (tasks/sandbox/languages.py): Python, described below, and JavaScript (Node). A JavaScript check
has the same shape, in the same children of the same workers (they exec node after their isolation and uid
drop): a runner (tasks/sandbox/bridge.js `runner`) runs test_solution.js, in which `require('./solution')` is a
proxy to a solution process (bridge.js `serve`) over the same two pipes, and writes the same nonce'd script
record on the result channel; only plain data crosses. Its solution process is not held to one thread (node
always has several). See docs/sandbox.md for what crosses and what does not.

`run_python_program` (the SandboxFusion-compatible service, tasks/sandbox/service.py) runs `code` as
`python main.py` in `/sandbox` with `stdin` (a host file opened read-only, never inside the sandbox's
view) on its standard input: same isolation and limits, no harness and no result channel, so `passed`
means only that it exited 0 and nothing killed it (the caller compares the output).

A test check is TWO processes joined only by two pipes (tasks/sandbox/bridge.py):
- the solution process imports `solution.py` and answers calls (bridge.serve); it holds nothing else: no
  test file, no nonce, no result channel, and in bwrap modes its own uid and PID namespace;
- the runner (tasks/sandbox/harness.py) runs the tests, `test_solution.py`, and never imports solution code:
  `import solution` / `from solution import *` there give proxies. Only plain data crosses back (None, bool,
  int, float, complex, str, bytes and lists, tuples, dicts, sets, frozensets of them, rebuilt as builtin
  types); any other object is a handle whose own `__eq__` is never run in the runner (comparing one makes the
  run "not checkable"); exceptions come back as the same builtin type with the same message.
How the tests run is decided from the test file's text: pytest style (a top-level `def test_...`, a
`class Test...`, an import of pytest, or a unittest.TestCase class) runs pytest with the harness's plugin (a file
that collects no test fails); otherwise the file runs as an assert script with runpy (HumanEval's
`check(candidate)` included).

The verdict is judged by the host from the runner alone. The host creates two more pipes that only the
runner gets: one holds a per-run nonce (never in argv, the environment or a file), on the other the runner
writes one final JSON record carrying it: for pytest {collected, passed, failed, errors, skipped, exitstatus}
counted from each test phase's real exception, for a script whether it ran to its end, and for both the
channel's state (`lost`: the solution process ended, hung up or broke the protocol; `not_checkable`: the
tests used something the channel cannot carry). The host (tasks/sandbox/verdict.py) passes a run only if the
runner exited 0, nothing killed it, exactly one well-formed record with the right nonce arrived and no other
line did, the channel was neither lost nor not checkable, for pytest every collected test passed and at
least as many were collected as the file declares (`declared_tests`, from its AST), and the solution process
was still alive at the end, alone (no child process) and with one thread. An early exit of either process,
a crash, a missing, duplicated, malformed or forged record all fail; `verdict_error` says which and
`not_checkable` why the tests could not be judged (synthesis rejects such tasks).

What a process boundary cannot stop, and this module does not claim to: tests that pass whatever the
solution does (synthesis rejects tests a do-nothing stub passes), a solution that special-cases the test
inputs it is given, and an escape from the sandbox itself (a kernel bug). In "rlimits-only" mode both
processes run as the calling user in no namespace: the solution can signal or trace the runner, so that
mode is not a boundary.

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

import ast
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
    BRIDGE_FILE,
    HARNESS_FILE,
    NS_EXIT_WAIT_S,
    SOLUTION_FILE,
    TEST_FILE,
    ResultChannel,
    SandboxResult,
    classify_exit,
    drain_result,
    hash_seed,
    inner_env,
    kill_group,
    release_uid,
    result_of,
    take_uid,
    watch_sandbox_init,
)
from evolforge.tasks.sandbox.languages import LANGUAGES, Language, language
from evolforge.tasks.sandbox.limits import (
    SandboxUnavailable,
    bwrap_argv,
    drop_argv,
    interpreter_layout,
    limits_argv,
    tool,
)
from evolforge.tasks.sandbox.pool import run_in_worker
from evolforge.tasks.sandbox.verdict import declared_tests, judge, unittest_classes

__all__ = ["LANGUAGES", "SandboxResult", "SandboxUnavailable", "check_sandbox_available", "run_many", "run_program",
           "run_python_program", "run_python_tests", "run_tests"]

_UNUSED_PLUGINS = ("cacheprovider", "pastebin", "junitxml", "doctest", "setuponly", "setupplan", "stepwise",
                   "unraisableexception", "threadexception", "faulthandler")  # nothing a check needs; each costs time
# what the harness runs; output captured at the sys level only (the warm workers configure pytest before the fork)
PYTEST_ARGS = ["-m", "pytest", "-q", *(a for p in _UNUSED_PLUGINS for a in ("-p", f"no:{p}")), "--tb=short",
               "--capture=sys", TEST_FILE]
_HERE = os.path.dirname(os.path.abspath(__file__))
_PYTEST_STYLE = re.compile(r"^(?:async\s+)?def\s+test\w*\s*\(|^class\s+Test\w*|^\s*(?:import|from)\s+pytest\b", re.M)
_GRACE_S = 0.25  # after the main process exits, how long to keep draining pipes held by leftovers
_probed: dict[tuple, None] = {}
log = logging.getLogger(__name__)


def uses_pytest(test_code: str) -> bool:
    """pytest style: a test function or Test class, an import of pytest, or a unittest.TestCase class (which, run
    as a script, would only be defined: its tests never ran)."""
    if _PYTEST_STYLE.search(test_code):
        return True
    if "TestCase" not in test_code:
        return False
    try:
        return bool(unittest_classes(ast.parse(test_code)))
    except (SyntaxError, ValueError):
        return False


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
        r = _run(probe, {}, ["-c", "print('ok')"])
        if r.exit_code != 0 or r.stdout.strip() != "ok":
            raise SandboxUnavailable(f"bubblewrap sandbox failed to start (exit {r.exit_code}): {r.stderr.strip()[-800:]}")
        _probed[key] = None


def run_python_tests(solution_code: str, test_code: str, settings: SandboxSettings, *,
                     reward: bool = False) -> SandboxResult:
    """run_tests in Python."""
    return run_tests(solution_code, test_code, settings, reward=reward)


def run_tests(solution_code: str, test_code: str, settings: SandboxSettings, *, language: str = "python",
              reward: bool = False) -> SandboxResult:
    """Run `test_code` against `solution_code` in the sandbox, the tests and the solution in two processes joined
    only by the bridge (Python: tasks/sandbox/bridge.py; nodejs: tasks/sandbox/bridge.js); never raises for
    anything the code does. `language`: a row of tasks/sandbox/languages.py.

    `reward`: the verdict is used as a reward (PPO, rejection sampling): a pass is confirmed by further runs, each
    with another hash seed (sandbox.confirm_runs in all), and the check passes only if every run passes."""
    lang = language_of(language, settings)
    check_sandbox_available(settings)
    if lang.bridge is None:
        runner = "pytest" if uses_pytest(test_code) else "script"
    else:
        runner = lang.runners[0]
    options = PYTEST_ARGS[2:-1] if runner == "pytest" else []
    declared = declared_tests(test_code) if runner == "pytest" else 0
    files = {lang.solution_file: solution_code, lang.test_file: test_code}
    runs = settings.confirm_runs if reward else 1
    spent = 0.0
    for run in range(runs):
        if settings.mode == "bwrap":  # warm workers, or (reuse_workers off) a worker started for this check alone
            result = run_in_worker(settings, files, [lang.test_file, *options], runner, declared, run=run, lang=lang,
                                   report=not reward)
        else:
            result = _run_split(settings, solution_code, test_code, runner, options, declared, run, lang)
        spent += result.duration_s
        result.duration_s, result.runs = round(spent, 4), run + 1
        if not result.passed:
            if run:
                why = result.verdict_error or result.killed_reason or f"exit status {result.exit_code}"
                result.verdict_error = (f"passed run 1 but failed confirmation run {run + 1} of {runs} "
                                        f"(hash seed {hash_seed(run)}): {why}")
            return result
    return result


def run_python_program(code: str, stdin: str | None, settings: SandboxSettings) -> SandboxResult:
    """run_program in Python."""
    return run_program(code, stdin, settings)


def run_program(code: str, stdin: str | None, settings: SandboxSettings, language: str = "python") -> SandboxResult:
    """Run `code` as a program (`python main.py`, `node main.js`, ...: tasks/sandbox/languages.py) with `stdin`
    (None: empty) on its standard input; never raises for what the code does."""
    lang = language_of(language, settings)
    check_sandbox_available(settings)
    return _run(settings, {lang.program_file: code}, [lang.program_file], stdin=stdin, lang=lang)


def language_of(name: str, settings: SandboxSettings) -> Language:
    """The language's row, its interpreter checked (LanguageUnavailable names what to install)."""
    lang = language(name)
    lang.executable(settings)
    return lang


def run_many(jobs: Iterable[tuple[str, str]], settings: SandboxSettings, *, reward: bool = False,
             language: str = "python") -> list[SandboxResult]:
    """Run (solution_code, test_code) pairs, at most settings.max_parallel at once; results in input order.
    `reward`: as run_tests (passes confirmed by sandbox.confirm_runs runs)."""
    jobs = list(jobs)
    check_sandbox_available(settings)
    with ThreadPoolExecutor(max_workers=settings.max_parallel, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: run_tests(job[0], job[1], settings, reward=reward, language=language), jobs))


@functools.lru_cache(maxsize=4)
def _source(name: str) -> str:
    with open(os.path.join(_HERE, name), encoding="utf-8") as f:
        return f.read()


def _run(settings: SandboxSettings, files: dict[str, str], args: list[str], stdin: str | None = None,
         lang: Language = LANGUAGES["python"]) -> SandboxResult:
    """A "raw" run, `python *args` (the probe, run_python_program): no result channel, judged by its exit status.
    `stdin` goes into a host file outside the sandbox's view, opened as its standard input. With
    sandbox.reuse_workers (bwrap mode) every run but the probe goes to a warm worker (tasks/sandbox/pool.py)."""
    if settings.mode == "bwrap" and settings.reuse_workers and args == [lang.program_file]:
        return run_in_worker(settings, files, args, "raw", 0, stdin, lang=lang)
    hostdir = tempfile.mkdtemp(prefix="evolforge-sbx-")
    uid = None
    try:
        paths = _write_files(hostdir, files)
        stdin_path = None
        if stdin is not None:
            stdin_path = os.path.join(hostdir, ".stdin")  # not in `paths`: never bound into the sandbox
            with open(stdin_path, "w", encoding="utf-8") as f:
                f.write(stdin)
        env = inner_env()
        marker, info = "", None
        if settings.mode == "bwrap":
            privileged = os.geteuid() == 0
            uid = take_uid(settings.uid_base) if privileged else None
            opts, python = bwrap_argv(settings, paths, env, privileged)
            command = [python] + args if lang.bridge is None else lang.command(settings, *args)
            inner = limits_argv(settings, lang.memory_bytes(settings)) + drop_argv(uid) + command
            info = os.pipe()  # bwrap reports the host pid of the sandbox's init (PID 1) here
            argv, cwd = opts + ["--info-fd", str(info[1]), "--"] + inner, "/"
            popen_env = {"PATH": "/usr/bin:/bin"}  # bwrap itself never sees the host environment
        else:
            marker = secrets.token_hex(8)
            env.update(HOME=hostdir, TMPDIR=hostdir, EVOLFORGE_SANDBOX_RUN=marker)
            command = [settings.python] + args if lang.bridge is None else lang.command(settings, *args)
            argv, cwd, popen_env = limits_argv(settings, lang.memory_bytes(settings)) + command, hostdir, env
        return _execute(settings, argv, cwd, popen_env, marker, info, stdin_path)
    finally:
        if uid is not None:
            release_uid(uid)
        shutil.rmtree(hostdir, ignore_errors=True)


def _write_files(folder: str, files: dict[str, str]) -> dict[str, str]:
    paths = {}
    for name, code in files.items():
        paths[name] = os.path.join(folder, name)
        with open(paths[name], "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(code)
        os.chmod(paths[name], 0o644)
    return paths


def _execute(settings: SandboxSettings, argv: list[str], cwd: str, env: dict, marker: str,
             info: tuple[int, int] | None, stdin_path: str | None = None) -> SandboxResult:
    started = time.monotonic()
    state: dict = {"info_fd": info[0] if info else None, "info": b"", "ns_pidfd": None, "result_fd": None}
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                                pass_fds=info[1:] if info else ())
    except BaseException:
        if info:
            os.close(info[0])
        raise
    finally:
        if stdin_path:
            stdin.close()  # the sandbox holds its own copy of the descriptor
        if info:
            os.close(info[1])  # the write end now lives in bwrap only
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
    stdout, stderr = bufs["out"].decode("utf-8", "replace"), bufs["err"].decode("utf-8", "replace")
    reason = reason or classify_exit(proc.returncode, duration, settings, stdout + stderr)
    return result_of(proc.returncode == 0 and reason is None, proc.returncode, reason, stdout, stderr, duration,
                     "raw", None)


def _run_split(settings: SandboxSettings, solution_code: str, test_code: str, runner: str, options: list[str],
               declared: int, run: int = 0, lang: Language = LANGUAGES["python"]) -> SandboxResult:
    """rlimits-only: the runner and the solution as two host processes (separate temp dirs, a new session each,
    the same rlimits), joined only by the bridge's pipes. Not a security boundary (same uid, no namespaces)."""
    hostdir = tempfile.mkdtemp(prefix="evolforge-sbx-")
    channel, ours, procs = None, [], []
    try:
        rdir, sdir = os.path.join(hostdir, "tests"), os.path.join(hostdir, "solution")
        os.mkdir(rdir)
        os.mkdir(sdir)
        if lang.bridge is None:
            _write_files(rdir, {TEST_FILE: test_code, HARNESS_FILE: _source("harness.py"), BRIDGE_FILE: _source("bridge.py")})
            _write_files(sdir, {SOLUTION_FILE: solution_code, BRIDGE_FILE: _source("bridge.py")})
        else:
            bridge = "_evolforge_" + lang.bridge
            _write_files(rdir, {lang.test_file: test_code, bridge: _source(lang.bridge)})
            _write_files(sdir, {lang.solution_file: solution_code, bridge: _source(lang.bridge)})
        channel = ResultChannel()
        to_solution, to_runner, out, err = os.pipe(), os.pipe(), os.pipe(), os.pipe()
        ours = [*to_solution, *to_runner, *out, *err]
        marker = secrets.token_hex(8)
        env = inner_env(run) | {"EVOLFORGE_SANDBOX_RUN": marker}
        limits, python = limits_argv(settings, lang.memory_bytes(settings)), settings.python
        if lang.bridge is None:
            runner_argv = [python, *channel.harness_args(runner, to_runner[0], to_solution[1]), *options]
            solution_argv = [python, BRIDGE_FILE, "serve", str(to_solution[0]), str(to_runner[1]), SOLUTION_FILE]
        else:
            nonce_r, result_w = channel.child_fds()
            runner_argv = lang.command(settings, bridge, "runner", str(nonce_r), str(result_w), str(to_runner[0]),
                                       str(to_solution[1]), lang.test_file)
            solution_argv = lang.command(settings, bridge, "serve", str(to_solution[0]), str(to_runner[1]),
                                         lang.solution_file)
        started = time.monotonic()
        common = dict(stdin=subprocess.DEVNULL, stdout=out[1], stderr=err[1], start_new_session=True, close_fds=True)
        procs.append(subprocess.Popen(  # the runner first: the solution's start overlaps the runner's
            limits + runner_argv, cwd=rdir,
            env=env | {"HOME": rdir, "TMPDIR": rdir}, pass_fds=(*channel.child_fds(), to_runner[0], to_solution[1]),
            **common))
        procs.append(subprocess.Popen(
            limits + solution_argv, cwd=sdir,
            env=env | {"HOME": sdir, "TMPDIR": sdir}, pass_fds=(to_solution[0], to_runner[1]), **common))
        for fd in ours[:4] + [out[1], err[1]]:
            os.close(fd)
        ours = [out[0], err[0]]
        channel.close("nonce_r", "result_w")
        bufs = {"out": bytearray(), "err": bytearray(), "res": bytearray()}
        reason, total, solution = _pump_split(procs, settings, started, {"out": out[0], "err": err[0],
                                                                         "res": channel.fds["result_r"]}, bufs)
        for proc in procs:  # the runner has ended (or is killed now: a timeout or the cap), and the solution with it
            kill_group(proc.pid)
            proc.wait()
        duration = time.monotonic() - started
        _kill_marked(marker)
        if not reason:
            reason = drain_result(channel.fds["result_r"], bufs["res"], settings.max_output_bytes - total)
        stdout, stderr = bufs["out"].decode("utf-8", "replace"), bufs["err"].decode("utf-8", "replace")
        code = procs[0].returncode
        reason = reason or classify_exit(code, duration, settings, stdout + stderr)
        if code != 0 and solution and solution["status"] not in (None, 0) and (reason is None or reason.startswith("signal:")):
            reason = classify_exit(solution["status"], duration, settings, "") or reason
        verdict = judge(bytes(bufs["res"]), channel.nonce, runner, declared, solution, one_thread=lang.one_thread)
        return result_of(code == 0 and reason is None and verdict.ok, code, reason, stdout, stderr, duration, runner,
                         verdict)
    finally:
        for proc in procs:
            kill_group(proc.pid)
            proc.wait()
        for fd in ours:
            os.close(fd)
        if channel is not None:
            channel.close()
        shutil.rmtree(hostdir, ignore_errors=True)


def _pump_split(procs: list, settings: SandboxSettings, started: float, fds: dict[str, int],
                bufs: dict[str, bytearray]) -> tuple[str | None, int, dict | None]:
    """Read the output and the result channel until the runner ends (then look at the solution process and kill
    it), a timeout or the output cap."""
    total, cap, reason, exited_at, solution = 0, settings.max_output_bytes, None, None, None
    deadline = started + settings.wall_timeout_seconds
    pidfd = os.pidfd_open(procs[0].pid)
    with selectors.DefaultSelector() as sel:
        for name, fd in fds.items():
            sel.register(fd, selectors.EVENT_READ, name)
        sel.register(pidfd, selectors.EVENT_READ, "exit")
        try:
            while True:
                now = time.monotonic()
                if exited_at is not None and (len(sel.get_map()) == 0 or now - exited_at > _GRACE_S):
                    break
                if now >= deadline:
                    reason = "wall_timeout"
                    break
                for key, _ in sel.select(timeout=min(deadline - now, _GRACE_S)):
                    if key.data == "exit":
                        exited_at = time.monotonic()
                        sel.unregister(pidfd)
                        solution = _solution_state(procs[1])
                        kill_group(procs[1].pid)  # its pipes close: the draining ends at once
                        continue
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
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
    return reason, total, solution


def _solution_state(proc: subprocess.Popen) -> dict:
    """rlimits-only: the solution process when the runner ended (alive, threads, child processes), as the worker
    reports it in bwrap mode."""
    code = proc.poll()
    if code is not None:
        return {"alive": False, "status": code if code >= 0 else 128 - code, "threads": 0, "children": 0}
    state = {"alive": True, "status": None, "threads": 1, "children": 0}
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        state["threads"] = int(fields.get("Threads", "1").strip())
        kids = set()
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            with open(f"/proc/{proc.pid}/task/{tid}/children") as f:
                kids.update(f.read().split())
        state["children"] = len(kids)
    except (OSError, ValueError):
        pass
    return state


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
