"""The sandbox's languages, one row each: how a program runs, what the files are called, how tests run.

    LANGUAGES["nodejs"].program_argv(settings)   # ['/usr/bin/node', '--max-old-space-size=1024', 'main.js']

A row names the files inside the sandbox's working dir (the solution, the test file, a plain program), the test
runners it has, the interpreter (None: the sandbox's python, sandbox.python, which the warm workers have loaded)
and the bridge file that runs both sides of a test check in that language (None: Python's own harness.py and
bridge.py, preloaded in the workers). Every language runs in the same bubblewrap view, namespaces, limits, uids
and two-process verdict (tasks/sandbox/run.py, pool.py, worker.py); only what runs inside differs:

| language | program          | tests                                   | test runners   | bridge                  |
|----------|------------------|-----------------------------------------|----------------|-------------------------|
| python   | python main.py   | solution.py + test_solution.py          | pytest, script | harness.py + bridge.py  |
| nodejs   | node main.js     | solution.js + test_solution.js (assert) | script         | bridge.js               |

A language with a bridge is exec'd by the worker's check children after their isolation and uid drop (the
worker only ever execs the argv the host built from this table). Adding a language: a row here (with its
interpreter bound into the sandbox by `interpreter_binds`) and a bridge file speaking the same result record
(tasks/sandbox/verdict.py's script record).

Node needs more address space than it uses: V8 reserves a code range and heap cage of several hundred MiB at
start (it aborts under RLIMIT_AS 700 MiB, measured with node v20). Its RLIMIT_AS is therefore memory_mb +
`address_space_extra_mb` (1024), and its JavaScript heap is capped at memory_mb by `--max-old-space-size`: a
program that allocates more dies with "JavaScript heap out of memory" (killed_reason "memory").
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from evolforge.config.sections.sandbox import SandboxSettings

BRIDGE_JS = "bridge.js"  # tasks/sandbox/bridge.js; /evolforge/bridge.js in a worker, _evolforge_bridge.js per run
_SYSTEM_PREFIXES = ("/usr/", "/bin/", "/lib/", "/lib64/", "/sbin/")


class LanguageUnavailable(RuntimeError):
    """The language's interpreter is not installed here (the message names it)."""


@dataclass(frozen=True)
class Language:
    name: str
    solution_file: str
    test_file: str
    program_file: str
    runners: tuple[str, ...]  # test runners: "pytest" (pytest files), "script" (an assert script)
    interpreter: str | None  # sandbox setting holding its executable (None: sandbox.python)
    bridge: str | None  # the file (in tasks/sandbox/) that runs both sides of a test check; None: Python's own
    flags: tuple[str, ...] = ()  # interpreter options, "{memory_mb}" filled in
    address_space_extra_mb: int = 0  # RLIMIT_AS = memory_mb + this
    one_thread: bool = True  # the solution process must be down to one thread when the tests end

    def executable(self, settings: SandboxSettings) -> str:
        """The interpreter's real path on the host (visible at the same path inside the sandbox)."""
        if self.interpreter is None:
            return settings.python
        configured = getattr(settings, self.interpreter)
        found = shutil.which(configured) if "/" not in configured else configured
        if not found or not os.access(found, os.X_OK):
            raise LanguageUnavailable(f"{self.name}: interpreter {configured!r} not found (setting sandbox."
                                      f"{self.interpreter}; for nodejs: apt-get install -y nodejs)")
        return os.path.realpath(found)

    def command(self, settings: SandboxSettings, *args: str) -> list[str]:
        """The interpreter, its options and `args` (None-interpreter rows: the caller runs python itself)."""
        return [self.executable(settings), *(f.format(memory_mb=settings.memory_mb) for f in self.flags), *args]

    def program_argv(self, settings: SandboxSettings) -> list[str]:
        return self.command(settings, self.program_file)

    def memory_bytes(self, settings: SandboxSettings) -> int:
        return (settings.memory_mb + self.address_space_extra_mb) * 1024 * 1024


LANGUAGES: dict[str, Language] = {
    "python": Language("python", "solution.py", "test_solution.py", "main.py", ("pytest", "script"), None, None),
    "nodejs": Language("nodejs", "solution.js", "test_solution.js", "main.js", ("script",), "node", BRIDGE_JS,
                       flags=("--max-old-space-size={memory_mb}",), address_space_extra_mb=1024, one_thread=False),
}


def language(name: str) -> Language:
    try:
        return LANGUAGES[name]
    except KeyError:
        raise ValueError(f"unknown sandbox language {name!r} (known: {', '.join(LANGUAGES)})") from None


def interpreter_binds(settings: SandboxSettings) -> list[str]:
    """Host folders to bind read-only so every installed language's interpreter runs inside the sandbox: the
    prefix (bin/..) of an interpreter outside the system folders (/usr is always bound)."""
    binds = []
    for lang in LANGUAGES.values():
        if lang.interpreter is None:
            continue
        try:
            exe = lang.executable(settings)
        except LanguageUnavailable:
            continue
        if not exe.startswith(_SYSTEM_PREFIXES):
            binds.append(os.path.dirname(os.path.dirname(exe)))
    return binds
