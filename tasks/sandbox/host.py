"""What the host's two ways of running a check share: run.py (one bwrap sandbox per run) and pool.py (warm workers).

- the file names inside the sandbox's working dir (SOLUTION_FILE, TEST_FILE, HARNESS_FILE, PROGRAM_FILE);
- SandboxResult, what either way returns;
- inner_env: the cleared environment the code under test sees (with the run's fixed hash seed, hash_seed);
- take_uid / release_uid: the dedicated unprivileged uids handed to runs when started as root (one per run at a time,
  machine-wide: a uid held by another process on the machine, another run or test process, is never handed out);
- ResultChannel: the harness's nonce pipe and result pipe (judged by tasks/sandbox/verdict.py);
- result_of: the SandboxResult of a finished run;
- watch_sandbox_init, kill_group, NS_EXIT_WAIT_S: killing a sandbox and waiting for its PID namespace to be gone;
- drain_result: what is left in the result pipe once a run is over, within the output cap;
- classify_exit: the `killed_reason` of a run from its exit status and output.

Both run.py and pool.py import this module; it imports neither.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import signal
import threading
from dataclasses import dataclass

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.limits import WORKDIR

SOLUTION_FILE = "solution.py"
TEST_FILE = "test_solution.py"
HARNESS_FILE = "_evolforge_harness.py"  # tasks/sandbox/harness.py, written beside them (rlimits-only)
BRIDGE_FILE = "_evolforge_bridge.py"  # tasks/sandbox/bridge.py, beside the harness and beside the solution
PROGRAM_FILE = "main.py"  # run_python_program's script
NS_EXIT_WAIT_S = 10.0  # bound on waiting for the kernel to tear the sandbox's PID namespace down
_UID_SPAN = 65_536
_uids_lock = threading.Lock()
_uids_in_use: set[int] = set()


@dataclass
class SandboxResult:
    passed: bool
    exit_code: int | None  # the run's exit status; 128+N when signal N ended it inside bwrap, -N when killed outside
    timed_out: bool
    killed_reason: str | None
    stdout: str  # truncated to max_output_bytes (stdout and stderr together)
    stderr: str
    duration_s: float  # wall seconds from start to reap: the sandbox seconds charged to the task
    runner: str = "pytest"  # "pytest", "script" or "raw" (run_python_program: no result channel)
    tests_passed: int | None = None  # from the result channel's record (None for scripts or without a valid record)
    tests_failed: int | None = None  # failed + errors, from the same record
    verdict_error: str | None = None  # why the result channel does not let the run pass (None when it does)
    not_checkable: str | None = None  # the tests use something the runner/solution channel cannot carry: why
    runs: int = 1  # runs this verdict took: more than one when a reward's pass was confirmed (sandbox.confirm_runs)


def result_of(passed: bool, code: int | None, reason: str | None, stdout: str, stderr: str, duration: float,
              runner: str, verdict) -> SandboxResult:
    """The SandboxResult of a finished run (`verdict`: tasks/sandbox/verdict.py's Verdict, None for raw runs)."""
    return SandboxResult(
        passed=passed, exit_code=code, timed_out=reason == "wall_timeout", killed_reason=reason, stdout=stdout,
        stderr=stderr, duration_s=round(duration, 4), runner=runner,
        tests_passed=verdict.tests_passed if verdict else None, tests_failed=verdict.tests_failed if verdict else None,
        verdict_error=verdict.error if verdict else None, not_checkable=verdict.not_checkable if verdict else None)


def hash_seed(run: int) -> int:
    """PYTHONHASHSEED of the run-th run of a check (0: the first; 1, 2, ...: a reward's confirmation runs). Fixed per
    run, so a verdict does not depend on which worker (whose forked checks share its seed) happened to run it, and
    a solution whose result depends on set or dict order of strings is judged under each seed the same way."""
    return 1 + run


def inner_env(run: int = 0) -> dict[str, str]:
    """The whole environment of the code under test (nothing of the host's, never the gateway's API key)."""
    return {"PATH": "/usr/bin:/bin", "HOME": WORKDIR, "USER": "sandbox", "LANG": "C.UTF-8", "TMPDIR": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONHASHSEED": str(hash_seed(run))}


# Where the processes of a machine hold their sandbox uids: one lock file per uid_base, a byte-range lock on byte
# (uid - base) while the uid is in use. The kernel drops a process's locks when it ends, however it ends, so a
# killed run leaves no uid taken. Root-only (uids are handed out only when running as root): /run is root's.
UID_LOCK_DIR = "/run/evolforge"
_lock_fds: dict[int, int] = {}  # base -> the lock file, open for the life of the process (closing drops its locks)


def _lock_fd(base: int) -> int | None:
    fd = _lock_fds.get(base)
    if fd is None:
        try:
            os.makedirs(UID_LOCK_DIR, mode=0o755, exist_ok=True)
            fd = os.open(os.path.join(UID_LOCK_DIR, f"sandbox-uids-{base}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return None  # not root: no uids are handed out then
        _lock_fds[base] = fd
    return fd


def _claim(fd: int | None, base: int, uid: int) -> bool:
    if fd is None:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, uid - base)
    except OSError:
        return False  # another process on the machine holds it
    return True


def take_uid(base: int, span: int = _UID_SPAN) -> int:
    """A uid in base..base+span-1 that no other run holds, in this process or any other on the machine (two runs
    or test processes at once once drew the same uid: the census of one killed the other's solution); give it
    back with release_uid."""
    with _uids_lock:
        fd = _lock_fd(base)
        start = secrets.randbelow(span)
        for i in range(span):
            uid = base + (start + i) % span
            if uid not in _uids_in_use and _claim(fd, base, uid):
                _uids_in_use.add(uid)
                return uid
    raise RuntimeError("no free sandbox uid")


def release_uid(uid: int) -> None:
    """Hand back a uid from take_uid once its run (and every process of it) is gone."""
    with _uids_lock:
        _uids_in_use.discard(uid)
        for base, fd in _lock_fds.items():
            if base <= uid < base + _UID_SPAN:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, uid - base)
                except OSError:
                    pass


class ResultChannel:
    """The two pipes of the result channel: the nonce in (filled and closed before the start), records out."""

    def __init__(self) -> None:
        self.nonce = secrets.token_hex(16)
        self.fds: dict[str, int | None] = dict.fromkeys(("nonce_r", "result_r", "result_w"))
        self.fds["nonce_r"], nonce_w = os.pipe()
        try:
            os.write(nonce_w, self.nonce.encode())  # 32 bytes: never blocks on an empty pipe
            os.close(nonce_w)
            nonce_w = None
            self.fds["result_r"], self.fds["result_w"] = os.pipe()
        except BaseException:
            if nonce_w is not None:
                os.close(nonce_w)
            self.close()
            raise

    def harness_args(self, runner: str, bridge_in: int, bridge_out: int) -> list[str]:
        return [HARNESS_FILE, str(self.fds["nonce_r"]), str(self.fds["result_w"]), str(bridge_in), str(bridge_out),
                runner, TEST_FILE]

    def child_fds(self) -> tuple[int, ...]:
        return self.fds["nonce_r"], self.fds["result_w"]

    def close(self, *names: str) -> None:
        for name in names or tuple(self.fds):
            if self.fds[name] is not None:
                os.close(self.fds[name])
                self.fds[name] = None


def watch_sandbox_init(state: dict, chunk: bytes) -> None:
    """Feed bwrap's --info-fd output; once it names the sandbox's init, open a pidfd on it in state["ns_pidfd"]
    (readable when the init, and so every process of the sandbox's PID namespace, is gone)."""
    state["info"] += chunk
    found = re.search(rb'"child-pid":\s*(\d+)', state["info"])
    if found and state["ns_pidfd"] is None:
        try:  # opened while the sandbox runs: the pid cannot have been reused yet
            state["ns_pidfd"] = os.pidfd_open(int(found.group(1)))
        except ProcessLookupError:
            pass


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; one that is already gone is no error."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def drain_result(fd: int, buf: bytearray, room: int) -> str | None:
    """Read what is left in the result pipe once the run is over (`room`: bytes left under the output cap);
    "output_cap" when it holds more than that, else None."""
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:  # a writer escaped the kill (rlimits-only): what it has not written does not count
            return None
        if not chunk:
            return None
        buf += chunk[: max(0, room)]
        room -= len(chunk)
        if room < 0:
            return "output_cap"


_NODE_MEMORY = re.compile(r"JavaScript heap out of memory|Fatal process out of memory|Fatal process OOM|"
                          r"RangeError: Array buffer allocation failed")
_NODE_NPROC = re.compile(r"\bspawn\S*(?: \S+)? EAGAIN|uv_thread_create")


def classify_exit(code: int, wall: float, s: SandboxSettings, output: str) -> str | None:
    """The killed_reason a run's exit status (and, for the rlimit errors, its output) points to; None for exit 0."""
    if code == 0:
        return None
    sig = code - 128 if code > 128 else -code if code < 0 else 0
    # SIGKILL we did not send after at least cpu_seconds of wall time: the hard CPU limit (SIGXCPU ignored)
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and wall >= s.cpu_seconds):
        return "cpu_limit"
    if "MemoryError" in output or "[Errno 12] Cannot allocate memory" in output or _NODE_MEMORY.search(output):
        return "memory"
    if "[Errno 11] Resource temporarily unavailable" in output or _NODE_NPROC.search(output):
        return "process_limit"
    if "[Errno 27] File too large" in output or sig == signal.SIGXFSZ or "EFBIG" in output:
        return "file_size"
    return f"signal:{sig}" if sig else None
