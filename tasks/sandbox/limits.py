"""Command lines of the sandbox: rlimits (prlimit), uid drop (setpriv) and the bubblewrap view.

Helpers of tasks/sandbox/run.py and pool.py, kept apart so those files stay small. Nothing here
starts the untrusted code; it only builds argv lists.

Why no user namespace when started as root: the kernel never enforces
RLIMIT_NPROC on a process whose real uid is host uid 0, and a user namespace
created by root maps the sandbox to host uid 0. So as root the sandbox keeps
bwrap's default of no user namespace (PID, network, IPC, UTS and cgroup
namespaces only; no capabilities), and `setpriv` switches to a dedicated
unprivileged uid before exec (bwrap grants only CAP_SETUID, CAP_SETGID and
CAP_SETPCAP for that step; setpriv clears all capabilities, the bounding set and
sets no_new_privs). Started as an ordinary user, bwrap uses a user namespace and
the code keeps that user's uid.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.languages import interpreter_binds

WORKDIR = "/sandbox"  # the private working dir inside the sandbox
VENV = "/venv"  # where a venv's site-packages appear inside the sandbox
_TOOL_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
_PROBE = (
    "import json, os, sys, sysconfig; print(json.dumps({'base_prefix': sys.base_prefix, 'prefix': sys.prefix, "
    "'base_executable': os.path.realpath(getattr(sys, '_base_executable', sys.executable)), "
    "'executable': os.path.realpath(sys.executable), 'version': '%d.%d' % sys.version_info[:2], "
    "'sites': sorted({sysconfig.get_path('purelib'), sysconfig.get_path('platlib')})}))"
)


class SandboxUnavailable(RuntimeError):
    """The configured sandbox cannot run here; the message names the fix."""


def tool(name: str) -> str:
    """Path of a util-linux helper (prlimit, setpriv) under /usr, or SandboxUnavailable."""
    path = shutil.which(name, path=_TOOL_PATH)
    if not path:
        raise SandboxUnavailable(f"`{name}` not found in {_TOOL_PATH}: install util-linux (`apt-get install -y util-linux`)")
    return os.path.realpath(path)


@functools.lru_cache(maxsize=16)
def interpreter_layout(python: str) -> dict:
    """Prefixes and site-packages of `python` (asked once per interpreter)."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise SandboxUnavailable(f"sandbox python {python!r} is not an executable file (setting sandbox.python)")
    out = subprocess.run([python, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60, env={"PATH": _TOOL_PATH})
    if out.returncode != 0:
        raise SandboxUnavailable(f"cannot inspect sandbox python {python!r}: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def limits_argv(s: SandboxSettings, address_space: int | None = None) -> list[str]:
    """prlimit prefix that sets every rlimit on itself, then execs the rest of the command (`address_space`:
    RLIMIT_AS in bytes when not memory_mb, tasks/sandbox/languages.py)."""
    mib = 1024 * 1024
    return [
        tool("prlimit"), f"--cpu={s.cpu_seconds}:{s.cpu_seconds + 1}", f"--as={address_space or s.memory_mb * mib}",
        f"--nproc={s.max_processes}", f"--fsize={s.max_file_size_mb * mib}", f"--nofile={s.max_open_files}",
        "--core=0", "--",
    ]


def drop_argv(uid: int | None) -> list[str]:
    """setpriv prefix: no_new_privs always; as root also a new uid/gid and no capabilities at all."""
    argv = [tool("setpriv"), "--no-new-privs"]
    if uid is not None:
        argv[1:1] = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    return argv + ["--"]


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class _View:
    """Accumulates bwrap mount arguments, creating parent dirs world-traversable (0755)."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self.dirs: set[str] = {"/"}
        self.bound: list[str] = []

    def _parents(self, dest: str) -> None:
        parent = os.path.dirname(dest)
        if parent in self.dirs or _under(parent, self.bound):
            return
        self._parents(parent)
        self.args += ["--perms", "0755", "--dir", parent]
        self.dirs.add(parent)

    def ro(self, src: str, dest: str | None = None) -> None:
        dest = dest or src
        if _under(dest, self.bound):
            return
        self._parents(dest)
        self.args += ["--ro-bind", src, dest]
        self.bound.append(dest)

    def symlink(self, target: str, dest: str) -> None:
        self._parents(dest)
        self.args += ["--symlink", target, dest]


def python_view(view: _View, python: str) -> str:
    """Bind the interpreter prefix (and a venv's site-packages at /venv); return the python to run inside."""
    lay = interpreter_layout(python)
    view.ro(lay["base_prefix"])
    if lay["prefix"] == lay["base_prefix"]:
        view.ro(lay["executable"])  # no-op when it lives under the prefix or /usr
        return lay["executable"]
    # a venv: recreate its skeleton so python finds pyvenv.cfg and the site-packages
    view.ro(os.path.join(lay["prefix"], "pyvenv.cfg"), f"{VENV}/pyvenv.cfg")
    view.ro(lay["base_executable"])
    for site in lay["sites"]:
        rel = os.path.relpath(site, lay["prefix"])
        view.ro(site, site if rel.startswith("..") else f"{VENV}/{rel}")
    view.symlink(lay["base_executable"], f"{VENV}/bin/python")
    return f"{VENV}/bin/python"


def bwrap_argv(s: SandboxSettings, files: dict[str, str], env: dict[str, str], privileged: bool,
               caps: tuple[str, ...] = (), binds: dict[str, str] | None = None) -> tuple[list[str], str]:
    """bwrap options up to the `--` (and the python to run inside); `files` maps name -> host file bound in the
    working dir, `binds` absolute path inside -> host file, `caps` further capabilities for the command."""
    argv = [s.bwrap_path, "--die-with-parent", "--new-session", "--clearenv",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if privileged:
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        argv += ["--unshare-user"]
    for cap in caps:
        argv += ["--cap-add", cap]
    view = _View()
    view.ro("/usr")
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = f"/{name}"
        if os.path.islink(host):
            view.symlink(os.readlink(host), host)
        elif os.path.isdir(host):
            view.ro(host)
    if os.path.exists("/etc/ld.so.cache"):
        view.ro("/etc/ld.so.cache")
    inner_python = python_view(view, s.python)
    for extra in [*interpreter_binds(s), *s.extra_ro_binds]:
        view.ro(extra)
    mb = 1024 * 1024
    argv += ["--dev", "/dev", "--proc", "/proc",
             "--perms", "1777", "--size", str(s.tmpfs_size_mb * mb), "--tmpfs", "/tmp",
             "--perms", "1777", "--size", str(s.tmpfs_size_mb * mb), "--tmpfs", WORKDIR]
    argv += view.args
    for name, host in files.items():
        argv += ["--ro-bind", host, f"{WORKDIR}/{name}"]
    for parent in sorted({os.path.dirname(dest) for dest in binds or {}} - view.dirs):
        argv += ["--perms", "0755", "--dir", parent]  # traversable: a check's interpreter (node) reads its bridge there
    for dest, host in (binds or {}).items():
        argv += ["--ro-bind", host, dest]
    for k, v in env.items():
        argv += ["--setenv", k, v]
    return argv + ["--chdir", WORKDIR], inner_python
