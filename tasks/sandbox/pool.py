"""Warm sandbox workers: one long-lived bwrap sandbox per worker, one forked child per check.

Host side of tasks/sandbox/worker.py; tasks/sandbox/run.py sends every run but the availability probe here
when `sandbox.reuse_workers` is on (the default, bwrap mode only). Starting bwrap, an interpreter and
pytest per check costs far more than the check; a worker pays that once and forks a pristine child per
check (see worker.py for what the child does: fresh tmpfs /sandbox, /tmp and /dev/shm in its own mount
and IPC namespaces, its own session, rlimits, uid and no capabilities).

Per check the host creates everything the one-sandbox-per-check mode creates (stdout and stderr pipes,
the harness's nonce pipe and result pipe with a fresh nonce, a dedicated uid when root) plus a memfd per
file, and hands the descriptors to the worker over its control socket (SCM_RIGHTS). It reads stdout,
stderr and the result channel itself, under the same wall timeout and output cap, and judges the result
channel exactly as the per-run path does (tasks/sandbox/verdict.py); the worker only reports the exit status.
What the two paths share (SandboxResult, the result channel, uids, kills, exit classification) is in
tasks/sandbox/host.py.

A worker is retired (its whole sandbox killed, a fresh one started on demand) after
`sandbox.worker_max_checks` checks, and after any anomaly: a wall timeout or output cap (the check is
killed by killing the sandbox), a process of a check that survived the sweep, a lost or silent worker,
or anything unexpected on the control socket.
"""

from __future__ import annotations

import array
import atexit
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.host import (
    NS_EXIT_WAIT_S,
    ResultChannel,
    SandboxResult,
    classify_exit,
    drain_result,
    inner_env,
    kill_group,
    release_uid,
    result_of,
    take_uid,
    watch_sandbox_init,
)
from evolforge.tasks.sandbox.languages import BRIDGE_JS, LANGUAGES, Language
from evolforge.tasks.sandbox.limits import SandboxUnavailable, bwrap_argv, drop_argv
from evolforge.tasks.sandbox.verdict import judge, solution_state_ok

_HERE = os.path.dirname(os.path.abspath(__file__))
WORKER_DIR = "/evolforge"  # where worker.py and harness.py appear inside the worker's sandbox
_READY_TIMEOUT_S = 60.0
_DONE_GRACE_S = 1.0  # after the worker reported a check done, how long its pipes may take to reach EOF
_MAX_CONTROL_BYTES = 4096


def _new_spawner() -> ThreadPoolExecutor:
    # bwrap's --die-with-parent follows the THREAD that started it: start workers from one thread that lives on
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")


_SPAWNER = _new_spawner()


class WorkerError(SandboxUnavailable):
    """A worker failed to start or broke its protocol (never caused by a check's own result)."""


class Worker:
    """One warm sandbox: bwrap, the worker process and its control socket. Used by one thread at a time."""

    def __init__(self, settings: SandboxSettings, run: int = 0) -> None:
        self.checks = 0
        self.buf = b""
        self.ns_pidfd: int | None = None
        privileged = os.geteuid() == 0
        caps = ("CAP_KILL", "CAP_SYS_ADMIN") if privileged else ("CAP_SYS_ADMIN",)
        binds = {f"{WORKER_DIR}/{name}": os.path.join(_HERE, name)
                 for name in ("worker.py", "harness.py", "direct.py", "bridge.py", BRIDGE_JS)}
        opts, python = bwrap_argv(settings, {}, inner_env(run), privileged, caps, binds)  # run: its hash seed
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        info_r, info_w = os.pipe()
        argv = opts + ["--info-fd", str(info_w), "--"] + drop_argv(None) + [python, f"{WORKER_DIR}/worker.py",
                                                                          str(theirs.fileno())]
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the worker's own complaints, read when it fails
        try:
            self.proc = _SPAWNER.submit(
                subprocess.Popen, argv, cwd="/", env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self.stderr, start_new_session=True, close_fds=True,
                pass_fds=(info_w, theirs.fileno())).result()
        except BaseException:
            os.close(info_r)
            self.sock.close()
            raise
        finally:
            os.close(info_w)
            theirs.close()
        try:
            self.pid = self._wait_ready(info_r)
        except BaseException:
            self.kill()
            raise
        finally:
            os.close(info_r)

    def _wait_ready(self, info_r: int) -> int:
        state = {"info": b"", "ns_pidfd": None}
        deadline = time.monotonic() + _READY_TIMEOUT_S
        with selectors.DefaultSelector() as sel:
            sel.register(info_r, selectors.EVENT_READ, "info")
            sel.register(self.sock, selectors.EVENT_READ, "ctl")
            while b"\n" not in self.buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerError("sandbox worker did not start in time")
                for key, _ in sel.select(timeout=left):
                    chunk = os.read(info_r, 4096) if key.data == "info" else self.sock.recv(4096)
                    if not chunk:
                        if key.data == "ctl":
                            raise WorkerError(f"sandbox worker failed to start: {self._stderr_tail()}")
                        sel.unregister(key.fileobj)
                    elif key.data == "info":
                        watch_sandbox_init(state, chunk)
                    else:
                        self.buf += chunk
        self.ns_pidfd = state["ns_pidfd"]
        line, _, self.buf = self.buf.partition(b"\n")
        ready = json.loads(line)
        if ready.get("ready") is not True or self.buf:
            raise WorkerError(f"sandbox worker said {line[:200]!r} instead of ready")
        return int(ready["pid"])

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-2000:].decode("utf-8", "replace").strip()

    def send(self, header: dict, fds: list[int]) -> None:
        payload = (json.dumps(header) + "\n").encode()
        sent = self.sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        if sent < len(payload):
            self.sock.sendall(payload[sent:])

    def read_control(self, check_id: int) -> dict | None:
        """The worker's report once readable; None while incomplete. WorkerError on EOF or anything unexpected."""
        chunk = self.sock.recv(_MAX_CONTROL_BYTES)
        if not chunk:
            raise WorkerError("sandbox worker lost (its control socket closed)")
        self.buf += chunk
        if b"\n" not in self.buf:
            if len(self.buf) > _MAX_CONTROL_BYTES:
                raise WorkerError("oversized message on the sandbox worker's control socket")
            return None
        line, _, rest = self.buf.partition(b"\n")
        try:
            done = json.loads(line)
        except ValueError:
            done = None
        if rest or not isinstance(done, dict) or set(done) != {"id", "status", "clean", "solution"} \
                or done["id"] != check_id or type(done["status"]) is not int or type(done["clean"]) is not bool \
                or not solution_state_ok(done["solution"]):
            raise WorkerError(f"unexpected message on the sandbox worker's control socket: {self.buf[:200]!r}")
        self.buf = b""
        return done

    def alive(self) -> bool:
        """An idle worker's sandbox still runs and its control socket has nothing to say (EOF or stray bytes)."""
        if self.proc.poll() is not None:
            return False
        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_READ)
            return not sel.select(timeout=0)

    def kill(self) -> None:
        """Kill the whole sandbox and wait until its PID namespace is gone."""
        kill_group(self.proc.pid)
        self.proc.wait()
        if self.ns_pidfd is not None:
            select.select([self.ns_pidfd], [], [], NS_EXIT_WAIT_S)
            os.close(self.ns_pidfd)
            self.ns_pidfd = None
        self.sock.close()
        self.stderr.close()


class _Pool:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: dict[tuple, list[Worker]] = {}
        self.spawned = self.retired = 0

    def acquire(self, settings: SandboxSettings, run: int = 0) -> Worker:
        key, dead = _key(settings, run), []
        try:
            with self.lock:
                while self.idle.get(key):
                    worker = self.idle[key].pop()
                    if worker.alive():
                        return worker
                    dead.append(worker)
                    self.retired += 1
                self.spawned += 1
        finally:
            for worker in dead:
                worker.kill()
        return Worker(settings, run)

    def release(self, settings: SandboxSettings, worker: Worker, healthy: bool, run: int = 0) -> None:
        if healthy and worker.checks < settings.worker_max_checks:
            with self.lock:
                idle = self.idle.setdefault(_key(settings, run), [])
                if len(idle) < max(settings.max_parallel, settings.service.max_concurrency):
                    idle.append(worker)
                    return
        with self.lock:
            self.retired += 1
        worker.kill()

    def close(self) -> None:
        with self.lock:
            workers = [w for ws in self.idle.values() for w in ws]
            self.idle = {}
        for w in workers:
            w.kill()


def _key(settings: SandboxSettings, run: int = 0) -> tuple:
    """Workers are interchangeable within a key; `run` (the hash seed's run, host.hash_seed) is part of it."""
    return settings.bwrap_path, settings.python, settings.node, tuple(settings.extra_ro_binds), os.geteuid(), run


_POOL = _Pool()
atexit.register(lambda: _POOL.close())


def _after_fork_in_child() -> None:
    """A forked host (multiprocessing, Ray, ...) starts with no workers, a free lock and a live spawner thread:
    the parent's workers are not its to use or kill, and the parent's threads do not exist in it."""
    global _POOL, _SPAWNER
    _POOL, _SPAWNER = _Pool(), _new_spawner()


os.register_at_fork(after_in_child=_after_fork_in_child)


def pool_stats() -> dict[str, int]:
    """Workers started, retired and idle in this process (for tests and benchmarks)."""
    with _POOL.lock:
        return {"spawned": _POOL.spawned, "retired": _POOL.retired,
                "idle": sum(len(ws) for ws in _POOL.idle.values())}


def close_workers() -> None:
    """Kill every idle worker (they are also killed at exit, and die with this process)."""
    _POOL.close()


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _rlimits(s: SandboxSettings, lang: Language) -> dict[str, list[int]]:
    mib = 1024 * 1024
    return {"RLIMIT_CPU": [s.cpu_seconds, s.cpu_seconds + 1], "RLIMIT_AS": [lang.memory_bytes(s)] * 2,
            "RLIMIT_NPROC": [s.max_processes] * 2, "RLIMIT_FSIZE": [s.max_file_size_mb * mib] * 2,
            "RLIMIT_NOFILE": [s.max_open_files] * 2, "RLIMIT_CORE": [0, 0]}


_ids = iter(range(1, 1 << 62))


def _commands(settings: SandboxSettings, lang: Language, runner: str, args: list[str]) -> dict:
    """What the worker's children exec for a language with a bridge of its own (nothing for Python's rows)."""
    if lang.bridge is None:
        return {}
    if runner == "raw":
        return {"exec": lang.command(settings, *args)}
    bridge = f"{WORKER_DIR}/{lang.bridge}"
    return {"solution_file": lang.solution_file,  # fds as worker.py arranges them: 3-4 nonce/result, 5-6 bridge
            "runner_exec": lang.command(settings, bridge, "runner", "3", "4", "5", "6", lang.test_file),
            "solution_exec": lang.command(settings, bridge, "serve", "3", "4", lang.solution_file)}


def run_in_worker(settings: SandboxSettings, files: dict[str, str], args: list[str], runner: str,
                  declared: int = 0, stdin: str | None = None, run: int = 0,
                  lang: Language = LANGUAGES["python"], report: bool = True) -> SandboxResult:
    """One check in a warm worker (sandbox.reuse_workers; else in a worker started for it alone): runner
    "pytest"/"script" (args: the test file, then pytest options; files: solution.py and the test file) as a
    runner and a solution process joined by the bridge, judged from the runner's result channel and the
    solution's state; or "raw" (args: the script) with `stdin` on its standard input. `run`: which run of the
    check this is (its hash seed: a worker started with host.hash_seed(run)). `lang`: the language's row
    (tasks/sandbox/languages.py); a row with a bridge of its own has its interpreter exec'd by the children.
    `report` False: nobody reads a failure's report (a reward), so a pytest check's failed tests are not run again
    to show their values (tasks/sandbox/direct.py)."""
    root = os.geteuid() == 0
    uid = take_uid(settings.uid_base) if root else None
    solution_uid = take_uid(settings.uid_base) if root and runner != "raw" else None
    ours: list[int] = []  # descriptors to close once sent (the worker's child keeps its own copies)
    keep: list[int] = []  # read ends the host reads from
    channel = None
    try:
        stdin_fd = _memfd("stdin", (stdin or "").encode()) if stdin is not None else os.open(os.devnull, os.O_RDONLY)
        ours.append(stdin_fd)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        keep += [out_r, err_r]
        ours += [out_w, err_w]
        fds = [stdin_fd, out_w, err_w]
        if runner != "raw":
            channel = ResultChannel()
            fds += [channel.fds["nonce_r"], channel.fds["result_w"]]
        for name, code in files.items():
            fd = _memfd(name, code.encode("utf-8", "surrogateescape"))
            ours.append(fd)
            fds.append(fd)
        header = {"id": next(_ids), "runner": runner, "args": args, "files": list(files), "uid": uid,
                  "solution_uid": solution_uid, "rlimits": _rlimits(settings, lang),
                  "tmpfs_bytes": settings.tmpfs_size_mb * 1024 * 1024,
                  "pytest_direct": bool(settings.pytest_direct), "pytest_report": bool(report), **_commands(settings, lang, runner, args)}
        return _check(settings, header, fds, ours, out_r, err_r, channel, runner, declared, run, lang.one_thread)
    finally:
        for fd in ours + keep:
            try:
                os.close(fd)
            except OSError:
                pass
        if channel is not None:
            channel.close()
        for held in (uid, solution_uid):
            if held is not None:
                release_uid(held)


def _acquire(settings: SandboxSettings, run: int = 0) -> Worker:
    """A warm worker of the pool, or (reuse_workers off: one sandbox per check) a worker for this check alone."""
    return _POOL.acquire(settings, run) if settings.reuse_workers else Worker(settings, run)


def _release(settings: SandboxSettings, worker: Worker, healthy: bool, run: int = 0) -> None:
    if settings.reuse_workers:
        _POOL.release(settings, worker, healthy, run)
    else:
        worker.kill()


def _check(settings: SandboxSettings, header: dict, fds: list[int], ours: list[int], out_r: int, err_r: int,
           channel: ResultChannel | None, runner: str, declared: int, run: int = 0,
           one_thread: bool = True) -> SandboxResult:
    worker = _acquire(settings, run)
    try:
        worker.send(header, fds)
    except OSError:  # an idle worker that died meanwhile (nothing of this check ran): one fresh worker, once
        _release(settings, worker, False, run)
        worker = _acquire(settings, run)
        try:
            worker.send(header, fds)
        except OSError as e:
            _release(settings, worker, False, run)
            raise WorkerError(f"a fresh sandbox worker refused its first check: {e}") from e
    healthy, done, lost = False, None, None
    bufs = {"out": bytearray(), "err": bytearray(), "res": bytearray()}
    started = time.monotonic()
    try:
        worker.checks += 1
        for fd in ours:  # only the worker's child holds the write ends now: EOF once it and its processes are gone
            os.close(fd)
        ours.clear()
        if channel is not None:
            channel.close("nonce_r", "result_w")
        reason, total, done, lost = _pump(worker, settings, started, header["id"], out_r, err_r,
                                          channel.fds["result_r"] if channel else None, bufs)
        healthy = reason is None and lost is None and done is not None and done["clean"]
    finally:
        duration = time.monotonic() - started
        _release(settings, worker, healthy, run)  # an unhealthy worker is killed here, with every process of the check
    if channel is not None and not reason:
        reason = drain_result(channel.fds["result_r"], bufs["res"], settings.max_output_bytes - total)
    stdout, stderr = bufs["out"].decode("utf-8", "replace"), bufs["err"].decode("utf-8", "replace")
    if lost is not None:
        stderr += f"\n[evolforge sandbox: {lost}]"
    code = done["status"] if done is not None else (-signal.SIGKILL if reason else None)
    if code is not None:
        reason = reason or classify_exit(code, duration, settings, stdout + stderr)
    elif not reason:
        reason = "worker_lost"
    solution = done["solution"] if done is not None else None
    if code not in (None, 0) and solution and solution["status"] not in (None, 0) and (
            reason is None or reason.startswith("signal:")):
        reason = classify_exit(solution["status"], duration, settings, "") or reason  # the solution's kill
    passed = code == 0 and reason is None
    verdict = judge(bytes(bufs["res"]), channel.nonce, runner, declared, solution, one_thread=one_thread) \
        if channel else None
    if verdict is not None:
        passed = passed and verdict.ok
    return result_of(passed, code, reason, stdout, stderr, duration, runner, verdict)


def _pump(worker: Worker, settings: SandboxSettings, started: float, check_id: int, out_r: int, err_r: int,
          res_r: int | None, bufs: dict[str, bytearray]) -> tuple[str | None, int, dict | None, str | None]:
    """Read the check's output and the worker's report until it is done, times out or writes too much."""
    total, cap, reason, done, lost, done_at = 0, settings.max_output_bytes, None, None, None, None
    deadline = started + settings.wall_timeout_seconds
    with selectors.DefaultSelector() as sel:
        sel.register(out_r, selectors.EVENT_READ, "out")
        sel.register(err_r, selectors.EVENT_READ, "err")
        if res_r is not None:
            sel.register(res_r, selectors.EVENT_READ, "res")
        sel.register(worker.sock, selectors.EVENT_READ, "ctl")
        while True:
            now = time.monotonic()
            if done is not None and (len(sel.get_map()) == 0 or now - done_at > _DONE_GRACE_S):
                break
            if now >= deadline:
                reason = "wall_timeout"
                break
            for key, _ in sel.select(timeout=min(deadline - now, _DONE_GRACE_S)):
                if key.data == "ctl":
                    try:
                        done = worker.read_control(check_id)
                    except WorkerError as e:
                        lost = str(e)
                    except OSError as e:
                        lost = f"sandbox worker lost ({e})"
                    if done is not None:
                        done_at = time.monotonic()
                        sel.unregister(worker.sock)
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
            if reason or lost:
                break
    return reason, total, done, lost
