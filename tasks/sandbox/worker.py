"""The long-lived sandbox worker: forks a pristine runner and solution process per check (runs INSIDE bwrap).

Not imported by evolforge: tasks/sandbox/pool.py binds this file, tasks/sandbox/harness.py and
tasks/sandbox/bridge.py read-only at /evolforge/ in a bwrap sandbox and starts

    python /evolforge/worker.py CONTROL_FD

Stdlib (and the pytest it preloads) only. At start the worker makes itself non-dumpable (no process of
the sandbox can read its memory or its /proc/<pid>/fd), becomes the child subreaper (every orphan of a
check is re-parented to it), imports pytest, its built-in plugins, the bridge and the harness, and says
`ready` on the control socket (an AF_UNIX socket pair with the host; nothing else in the sandbox holds it).
For pytest checks it also builds, once per option set, a pytest configured with its session started
(harness.PytestTemplate): each check's runner then only collects and runs the test file.

The worker never imports or runs anything of a check. Per check the host sends one message on the
control socket: a small JSON header (runner, options, file names, limits, uids) plus, as SCM_RIGHTS, the
descriptors of the check: stdin, stdout, stderr, the harness's nonce pipe and result pipe (not for "raw"
runs) and one memfd per file (the file contents). The one file the worker reads is a pytest check's test
file, which it parses, assertion-rewrites and compiles (never runs) before forking the runner, and keeps
by the sha256 of its bytes, so that the runners of later checks of the same tests skip that work
(harness.PytestTemplate.precompile; a file that fails to compile is left to the runner's pytest).

A test check is TWO processes, joined only by two pipes the worker creates (bridge.py):
- the runner (the tests: harness.main, pytest or a script) gets the test file, the nonce and result pipes;
- the solution (bridge.serve: imports solution.py, answers calls) gets solution.py and its ends of the two
  pipes only, forked straight from the worker into a new PID namespace of its own (it is its init: it sees no
  other process, and every process it forks dies with it), in a network namespace that is not the runner's (no
  interface but a down loopback: no abstract, unix-in-netns or TCP socket of the runner is reachable; the
  bridge's pipes are its only link; the worker makes it once for its solutions, which run one at a time, and
  no process of a check outlives it), with its own uid when root.
Each of them, in a child forked from the worker:
1. starts a new session (its own process group);
2. unshares a mount and an IPC namespace and mounts fresh size-capped tmpfs on /sandbox, /tmp and
   /dev/shm (nothing an earlier check wrote is visible, nothing it writes outlives it; the runner and the
   solution do not see each other's), copies its files into /sandbox and binds each one read-only onto itself;
3. moves its descriptors to 0.. and closes every other (the control socket included);
4. sets the check's rlimits (CPU, address space, processes, file size, open files, no core);
5. as root: drops to its own uid/gid (the host hands out uids no other running check has),
   clears the capability bounding set; always: drops every capability and sets no_new_privs;
6. runs its part, then exits with the status `python FILE` would have had; for another language
   (tasks/sandbox/languages.py) it execs the interpreter argv the host put in the job instead (`exec`,
   `runner_exec`, `solution_exec`: node running bridge.js's runner or serve side, or main.js), keeping
   the descriptors, namespaces, rlimits and uid set up above.
A "raw" run (run_python_program) is one such child running `main.py` as __main__.

When the runner is gone the worker looks at the solution process (alive, how many threads, any child
process: a solution that ended, or left threads or processes running, fails the check), SIGKILLs every
other process of the sandbox (`kill(-1)`, atomic against forks; pid 1, bwrap's init, and the worker
itself are exempt), reaps them and reports `{"id", "status", "clean", "solution"}`; clean is false when
anything but pid 1 and itself is still alive, and the host then retires the worker. The host kills the
whole sandbox on a wall timeout or an output cap.
"""

import array
import ctypes
import fcntl
import gc
import importlib
import importlib.util
import json
import os
import signal
import socket
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
WORKDIR = "/sandbox"
FRESH_TMPFS = ("/sandbox", "/tmp", "/dev/shm")
MAX_FDS = 16
CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
SOLUTION_FILE = "solution.py"
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 4, 24, 38, 36
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_libc = ctypes.CDLL(None, use_errno=True)
for _name in ("mount", "unshare", "setns", "prctl", "capset"):  # looked up once here, not in every child
    getattr(_libc, _name)
_PID_NS_FD = -1  # the worker's own PID namespace (opened in main): its children's is set back to it
_SOLUTION_NET_FD = -1  # the network namespace the worker made for its solution processes (main)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target: str, fstype, flags: int, data) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _check(_libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _drop_all_capabilities(as_root: bool) -> None:
    if as_root:
        for cap in range(64):  # the bounding set (needs CAP_SETPCAP, so before the uid change)
            if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last
                break
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def _clear_capability_sets() -> None:
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3, all zero
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _preload() -> object:
    """Import pytest, its default plugins and the harness, so a forked child only runs the check."""
    import pytest  # noqa: F401
    from _pytest.config import default_plugins

    for name in default_plugins:
        try:
            importlib.import_module(f"_pytest.{name}")
        except ImportError:
            pass
    for name in ("_pytest.assertion.rewrite", "_pytest.python_api", "_pytest.outcomes", "runpy", "traceback",
                 "unittest", "doctest", "pdb", "argparse", "inspect", "typing", "dataclasses", "collections",
                 "re", "json", "math", "itertools", "functools", "threading", "subprocess", "tempfile", "readline",
                 "resource", "symtable", "pkgutil"):  # every child uses resource (rlimits), every runner symtable
        # (the bridge's star import), every script runner pkgutil (runpy): ~1.5 ms, ~0.5 ms, ... in each child
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    for name in ("bridge", "direct", "harness"):  # the harness imports the bridge as _evolforge_bridge
        spec = importlib.util.spec_from_file_location(f"_evolforge_{name}", os.path.join(_HERE, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"_evolforge_{name}"] = module
        spec.loader.exec_module(module)
    harness = sys.modules["_evolforge_harness"]
    harness._prctl()
    gc.collect()
    gc.freeze()  # children neither scan nor copy (on write) what the worker loaded
    return harness


def _send(sock: socket.socket, record: dict) -> None:
    sock.sendall((json.dumps(record) + "\n").encode())


def _recv_job(sock: socket.socket, buf: bytearray) -> tuple[dict | None, list[int]]:
    """One job: a JSON line; its descriptors arrive with its first bytes. (None, []) at EOF."""
    fds: list[int] = []
    while b"\n" not in buf:
        data, ancdata, _flags, _ = sock.recvmsg(65536, socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                fds += list(got)
        if not data:
            for fd in fds:
                os.close(fd)
            return None, []
        buf += data
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line), fds


def _copy_file(src_fd: int, path: str) -> None:
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.lseek(src_fd, 0, os.SEEK_SET)
        while True:
            chunk = os.read(src_fd, 1 << 20)
            if not chunk:
                break
            while chunk:
                chunk = chunk[os.write(out, chunk):]
    finally:
        os.close(out)
    os.chmod(path, 0o644)
    _mount(path, path, None, MS_BIND, None)  # read-only, as bwrap's --ro-bind of the per-check mode
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def _arrange_fds(fds: list[int]) -> None:
    """fds[i] becomes descriptor i; every other descriptor is closed."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]  # above 0..n-1: no dup2 overwrites a source
    for i, fd in enumerate(high):
        os.dup2(fd, i, inheritable=True)
    os.closerange(len(fds), 1 << 16)


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except Exception:  # noqa: BLE001
        pass
    return 1


def _run_main(path: str) -> int:
    import runpy

    sys.argv = [path]
    runpy.run_path(path, run_name="__main__")
    return 0


def _finish(run) -> None:
    """Run the check's entry point as `python FILE` would and leave with its exit status."""
    try:
        status = _exit_status(run())
    except SystemExit as e:
        status = _exit_status(e.code)
    except BaseException:  # noqa: BLE001 - what python prints for an uncaught exception
        try:
            sys.excepthook(*sys.exc_info())
        except BaseException:  # noqa: BLE001
            pass
        status = 1
    try:
        import threading

        threading._shutdown()  # wait for non-daemon threads, as the interpreter does at exit
    except BaseException:  # noqa: BLE001
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(status)


def _template(job: dict, templates: dict, harness):
    """The pytest template (configured, session started) for the job's options (the host's fixed pytest
    arguments, never anything of a check), built once in the worker. None: the runner runs pytest.main."""
    if job["runner"] != "pytest":
        return None
    key = tuple(job["args"][1:] + job["args"][:1])  # the options, then the test file: pytest.main's argument list
    if key not in templates:
        try:
            templates[key] = harness.PytestTemplate(list(key[:-1]), key[-1])
        except Exception as e:  # noqa: BLE001 - another pytest: the runners use pytest.main
            os.write(2, f"evolforge sandbox worker: no pytest template ({e!r})\n".encode())
            templates[key] = None
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        gc.collect()
        gc.freeze()
    return templates[key]


def _isolate(job: dict, files: dict, proc: bool = False) -> None:
    """In a check's child: own session, mount and IPC namespaces, fresh tmpfs, `files` (name -> memfd) copied
    into /sandbox read-only. `proc`: also a /proc of the child's own PID namespace."""
    os.setsid()
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    size = int(job["tmpfs_bytes"])
    for path in FRESH_TMPFS:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    if proc:
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        except OSError:
            pass  # the PID namespace still keeps its signals in; /proc then shows the other pids' numbers only
    for name, fd in files.items():
        if "/" in name or name.startswith("."):
            raise RuntimeError(f"bad file name {name!r}")
        _copy_file(fd, os.path.join(WORKDIR, name))
    os.chdir(WORKDIR)
    sys.path[0] = WORKDIR
    # the worker's cached finders for the directories a child sees anew (its fresh tmpfs, relative paths); the
    # rest of the view is the worker's own read-only one (clearing the whole cache cost ~1 ms per child)
    fresh = tuple(d + "/" for d in FRESH_TMPFS)
    for key in [k for k in sys.path_importer_cache
                if not (isinstance(k, str) and k.startswith("/")) or k in FRESH_TMPFS or k.startswith(fresh)]:
        del sys.path_importer_cache[key]


def _drop(job: dict, uid) -> None:
    """The check's rlimits, then its uid (as root), no capabilities, no_new_privs, no blocked signals."""
    import resource

    for key, value in job["rlimits"].items():
        resource.setrlimit(getattr(resource, key), (value[0], value[1]))
    as_root = os.geteuid() == 0
    _drop_all_capabilities(as_root)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _clear_capability_sets()
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _exec(argv) -> None:
    """Another language's interpreter (tasks/sandbox/languages.py): replace this child by `argv`, built by the host
    from its language table, once the child is isolated, limited and dropped; None: stay in python."""
    if argv:
        os.execv(argv[0], argv)


def _setup_failed(e: BaseException) -> None:
    try:
        os.write(2, f"evolforge sandbox worker: check setup failed: {e!r}\n".encode())
    finally:
        os._exit(125)


def _raw_child(job: dict, fds: list[int]) -> None:
    """A run_python_program run: main.py as __main__. Never returns."""
    try:
        names = job["files"]
        if len(fds) != 3 + len(names):
            raise RuntimeError("descriptor count does not match the job")
        _isolate(job, dict(zip(names, fds[3:])))
        _arrange_fds(fds[:3])
        _drop(job, job.get("uid"))
        _exec(job.get("exec"))
    except BaseException as e:  # noqa: BLE001 - a setup failure is the worker's, never the check's
        _setup_failed(e)
    _finish(lambda: _run_main(job["args"][0]))


def _runner_child(job: dict, fds: list[int], files: dict, channel: tuple, harness, template) -> None:
    """The tests: fds 0-4 std/nonce/result, 5-6 the bridge (from the solution, to it). Never returns."""
    try:
        _isolate(job, files)
        _arrange_fds(fds[:5] + list(channel))
        _drop(job, job.get("uid"))
        _exec(job.get("runner_exec"))
    except BaseException as e:  # noqa: BLE001
        _setup_failed(e)
    harness_args = ["3", "4", "5", "6", job["runner"], *job["args"]]
    sys.argv = ["_evolforge_harness.py", *harness_args]  # what the per-run modes' harness sees
    _finish(lambda: harness.main(harness_args, template))


def _fork_solution(job: dict, fds: list[int], solution_fd: int, channel: tuple) -> int:
    """Fork the solution process straight from the worker as the init of a new PID namespace: the worker sets its
    namespace for children (unshare CLONE_NEWPID), forks, and sets it back to its own at once (setns), so no
    intermediate process is needed. Returns the solution's pid (in the worker's namespace)."""
    new_pid_ns = _libc.unshare(CLONE_NEWPID) == 0  # else it still has its own uid, tmpfs, session and network
    try:
        pid = os.fork()
    except BaseException:
        _own_pid_ns(new_pid_ns)
        raise
    if pid == 0:
        _solution_child(job, fds, solution_fd, channel, new_pid_ns)
    _own_pid_ns(new_pid_ns)
    return pid


def _own_pid_ns(changed: bool) -> None:
    """The worker's next children (runners, raw runs) in the worker's own PID namespace again (the worker dies,
    and the host replaces it, if that fails)."""
    if changed:
        _check(_libc.setns(_PID_NS_FD, CLONE_NEWPID), "setns back to the worker's PID namespace")


def _solution_child(job: dict, fds: list[int], solution_fd: int, channel: tuple, new_pid_ns: bool) -> None:
    """The solution process (the init of its own PID namespace). Never returns."""
    try:
        # not the runner's network namespace (required: no socket of the runner, abstract, unix or TCP, is reachable
        # from it) but the one the worker made for its solutions: no interface but a down loopback, and no process
        # of an earlier check left in it (a socket dies with its process); made once, not per check (~1 ms each)
        _check(_libc.setns(_SOLUTION_NET_FD, CLONE_NEWNET), "enter the solutions' network namespace")
        _isolate(job, {job.get("solution_file", SOLUTION_FILE): solution_fd}, proc=new_pid_ns)
        _arrange_fds(fds[:3] + list(channel))
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "AssertionRewritingHook"]
        _drop(job, job.get("solution_uid"))
        _exec(job.get("solution_exec"))
    except BaseException as e:  # noqa: BLE001
        _setup_failed(e)
    bridge = sys.modules["_evolforge_bridge"]
    path = os.path.join(WORKDIR, SOLUTION_FILE)
    sys.argv = [path]
    _finish(lambda: bridge.serve(3, 4, path))


def _solution_state(pid: int, status) -> dict:
    """What the solution process looks like now that the runner is gone (alive, threads, child processes)."""
    if status is None:
        try:
            done, raw = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, raw = pid, 255 << 8
        if done:
            status = _status(raw)
    state = {"alive": status is None, "status": status, "threads": 0, "children": 0}
    if status is not None:
        return state
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        if fields.get("State", "").strip().startswith(("Z", "X")):
            state["alive"] = False
        state["threads"] = int(fields.get("Threads", "1").strip())
        kids = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(f.read().split())
        state["children"] = len(kids)
    except (OSError, ValueError):
        state["alive"] = False
    return state


def _run_check(job: dict, fds: list[int], harness, template) -> tuple[int, dict]:
    """Fork the runner and the solution of a test check; wait for the runner; the solution's state then."""
    names, solution_file = job["files"], job.get("solution_file", SOLUTION_FILE)
    if len(fds) != 5 + len(names) or solution_file not in names:
        for fd in fds:
            os.close(fd)
        return 125, {"alive": False, "status": None, "threads": 0, "children": 0}
    files = dict(zip(names, fds[5:]))
    solution_fd = files.pop(solution_file)
    if template is not None:  # direct calls only for the job's two files: no conftest.py or package beside them
        template.direct = template.direct_usable and job.get("pytest_direct") is True \
            and sorted(job["files"]) == sorted({job["args"][0], solution_file})
        template.report = job.get("pytest_report") is not False
    if template is not None and job["args"][0] in files:
        try:  # parse, rewrite and compile only: nothing of the file runs here
            template.precompile(files[job["args"][0]], plain=template.direct)
        except Exception as e:  # noqa: BLE001 - the runner's pytest then rewrites the file itself
            os.write(2, f"evolforge sandbox worker: test file not precompiled ({e!r})\n".encode())
    to_solution, to_runner = os.pipe(), os.pipe()
    solution = None
    try:
        runner = os.fork()
        if runner == 0:
            _runner_child(job, fds, files, (to_runner[0], to_solution[1]), harness, template)
        solution = _fork_solution(job, fds, solution_fd, (to_solution[0], to_runner[1]))
    finally:
        for fd in [*fds, *to_solution, *to_runner]:
            os.close(fd)
    runner_raw, solution_status = None, None
    while runner_raw is None:
        try:
            pid, raw = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == runner:
            runner_raw = raw
        elif pid == solution:
            solution_status = _status(raw)
    if solution is None:
        state = {"alive": False, "status": None, "threads": 0, "children": 0}
    else:
        state = _solution_state(solution, solution_status)
    return (_status(runner_raw) if runner_raw is not None else 255), state


def _solution_network() -> int:
    """A new network namespace for the solution processes (they join it with setns); the worker stays in its own."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.unshare(CLONE_NEWNET), "unshare network")
        made = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        _check(_libc.setns(own, CLONE_NEWNET), "setns back to the worker's network namespace")
    finally:
        os.close(own)
    if os.stat("/proc/self/ns/net").st_ino == os.fstat(made).st_ino:
        raise RuntimeError("the solutions' network namespace is the worker's")
    return made


def _sweep(me: int) -> bool:
    """Kill and reap every process of the sandbox but pid 1 and this one; True when none is left."""
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not others:
            return True
        time.sleep(0.002)
    return False


def _status(raw: int) -> int:
    if os.WIFSIGNALED(raw):
        return 128 + os.WTERMSIG(raw)  # as bwrap reports a command that a signal ended
    return os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else 255


def main(argv: list) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")
    harness = _preload()
    me = os.getpid()
    global _PID_NS_FD, _SOLUTION_NET_FD
    _PID_NS_FD = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    _SOLUTION_NET_FD = _solution_network()
    _send(sock, {"ready": True, "pid": me})
    buf, templates = bytearray(), {}
    while True:
        job, fds = _recv_job(sock, buf)
        if job is None:
            return 0
        if job["runner"] == "raw":
            pid = os.fork()
            if pid == 0:
                sock.close()
                _raw_child(job, fds)
            for fd in fds:
                os.close(fd)
            _, raw = os.waitpid(pid, 0)
            status, solution = _status(raw), None
        else:
            template = _template(job, templates, harness)
            status, solution = _run_check(job, fds, harness, template)
        clean = _sweep(me)
        _send(sock, {"id": job["id"], "status": status, "clean": clean, "solution": solution})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
