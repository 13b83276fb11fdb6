"""The runner: runs the tests INSIDE the sandbox, in a process that never loads the solution's code.

Not imported by evolforge: tasks/sandbox/worker.py preloads it (warm workers), and the rlimits-only mode writes
it (as `_evolforge_harness.py`, with tasks/sandbox/bridge.py as `_evolforge_bridge.py`) beside the test file and
starts

    python _evolforge_harness.py NONCE_FD RESULT_FD BRIDGE_IN BRIDGE_OUT pytest|script TEST_FILE [PYTEST_OPTION ...]

Stdlib and pytest only. The solution runs in ANOTHER process (bridge.serve), started beside this one; the only
link is the pair of pipes BRIDGE_IN / BRIDGE_OUT. `import solution` here gives a proxy module
(bridge.install_solution_importer): calls go over the pipes and only plain data (or handles) come back, so no
object of the solution runs code in this process, and nothing of this process (the nonce, the result channel,
pytest, the plugin below, the builtins) is reachable from the solution.

1. reads the run's nonce from NONCE_FD (a pipe the host filled and closed) and closes it;
2. makes itself non-dumpable (prctl PR_SET_DUMPABLE 0: no process of the sandbox can read its memory or its
   /proc/<pid>/fd);
3. pytest: runs the test file with a plugin that counts the collected tests and takes each test's outcome
   from the real exception of each phase (a `pytest_runtest_makereport` hookwrapper, outermost);
   script: runs TEST_FILE with runpy as __main__.
It writes ONE final record to RESULT_FD, a JSON line with the nonce: pytest's counts at pytest_sessionfinish;
for a script whether it returned normally. Both carry the channel's state: `lost` (the solution process ended
or broke the protocol) and `not_checkable` (the test passed or compared something the channel cannot carry),
either of which fails the run. The host's judgement of the record is tasks/sandbox/verdict.py; what the host
also requires of the solution process (alive at the end, one thread, no child) is in worker.py / run.py.

The tests themselves are trusted to define the verdict: a test file that passes whatever the solution does is
out of this module's scope (synthesis rejects such tests with its stub checks).
"""

import json
import os
import sys

try:  # the worker preloads it as a module; the per-run modes write it beside this file
    import _evolforge_bridge as bridge
except ImportError:  # pragma: no cover - imported as evolforge.tasks.sandbox.harness (tests of the host side)
    from evolforge.tasks.sandbox import bridge

PR_SET_DUMPABLE = 4
# bound now, before any test runs: a test that patches json or os (trusted, but careless) cannot break the record
_dumps, _write, _close, _read = json.JSONEncoder(ensure_ascii=True).encode, os.write, os.close, os.read


def _read_nonce(fd: int) -> str:
    data = b""
    while True:
        chunk = _read(fd, 256)
        if not chunk:
            break
        data += chunk
    _close(fd)
    nonce = data.decode("ascii", "replace")
    if not 16 <= len(nonce) <= 128 or any(c not in "0123456789abcdef" for c in nonce):
        raise SystemExit("evolforge harness: no valid nonce on its descriptor")
    return nonce


def _writer(fd: int, nonce: str):
    """emit(record): write the one final record (a dict, the nonce added) and close the channel."""
    done = [False]

    def emit(record: dict) -> None:
        if done[0]:
            return
        done[0] = True
        data = (_dumps({"nonce": nonce, "kind": "final", **record}) + "\n").encode()
        try:
            while data:
                data = data[_write(fd, data):]
            _close(fd)
        except OSError:
            pass

    return emit


def _undumpable() -> None:
    try:
        _prctl()(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort: the solution is another uid and PID namespace in bwrap mode
        pass


def _prctl():
    """libc's prctl, looked up once (a warm worker looks it up before forking its checks: worker._preload)."""
    if not _PRCTL:
        import ctypes

        _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)
    return _PRCTL[0]


_PRCTL: list = []


def channel_state(ep) -> dict:
    """The bridge's sticky state for the final record (and a last look for stray bytes from the solution)."""
    bridge.check_quiet(ep)
    lost, not_checkable = bridge.runner_state(ep)
    return {"lost": lost, "not_checkable": not_checkable}


class Verdict:
    """The pytest plugin: counts collected tests and the real outcome of each phase; writes the final record."""

    def __init__(self) -> None:
        self.emit = None
        self.ep = None
        self.items: list = []
        self.states: dict = {}
        self.collect_errors = 0

    def start(self, emit, ep) -> None:
        self.emit, self.ep = emit, ep

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.collect_errors += 1

    def pytest_collection_finish(self, session) -> None:
        self.items = list(session.items)

    def pytest_runtest_makereport(self, item, call):
        state = self.states.setdefault(item.nodeid, {"ran": False, "bad": None, "skipped": False})
        exc = call.excinfo
        pending = getattr(item, "_excinfo", None)  # unittest.TestCase: the failure its result object caught
        if pending and isinstance(pending, list):
            exc = pending[0]
        unittest = sys.modules.get("unittest")
        from _pytest.outcomes import Skipped

        if exc is None:
            if call.when == "call":
                state["ran"] = True
        elif isinstance(exc.value, Skipped) or (unittest and isinstance(exc.value, unittest.SkipTest)):
            state["skipped"] = True
        elif state["bad"] is None:
            state["bad"] = "failed" if call.when == "call" else "error"
        yield

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        counts = {"passed": 0, "failed": 0, "errors": self.collect_errors, "skipped": 0}
        for item in self.items:
            state = self.states.get(item.nodeid)
            if state is None:
                continue
            if state["bad"] == "failed":
                counts["failed"] += 1
            elif state["bad"] == "error":
                counts["errors"] += 1
            elif state["skipped"]:
                counts["skipped"] += 1
            elif state["ran"]:
                counts["passed"] += 1
        self.emit({"runner": "pytest", "collected": len(self.items), **counts, "exitstatus": int(exitstatus),
                   **channel_state(self.ep)})


def _iter_tree(node):
    """Every node of an AST, `node` first (a list, built without recursion or generators): what pytest's
    assertion rewriter's `traverse_node` yields, in another order, which its one use (filling in missing locations
    node by node) does not depend on."""
    import ast

    AST, nodes, stack = ast.AST, [], [node]
    while stack:
        n = stack.pop()
        nodes.append(n)
        for name in n._fields:
            v = getattr(n, name, None)
            if isinstance(v, AST):
                stack.append(v)
            elif isinstance(v, list):
                stack.extend(x for x in v if isinstance(x, AST))
    return nodes


_LOCATION = ("lineno", "col_offset", "end_lineno", "end_col_offset")
_ASSERTS: list = []  # the assert pytest's rewriter is replacing now, with what ast.copy_location would copy from it


def _copied(assert_) -> list:
    """The (attribute, value) pairs ast.copy_location(node, assert_) sets on a node that has those attributes."""
    return [(a, getattr(assert_, a, None)) for a in _LOCATION if a in assert_._attributes
            and (getattr(assert_, a, None) is not None or (hasattr(assert_, a) and a.startswith("end_")))]


def _locate(node, copied: list) -> None:
    """What visit_Assert's last loop does to the statements of one assert (every node of `node` without a lineno gets
    the assert's location, as ast.copy_location gives it), in one walk, without a call per node."""
    for n in _iter_tree(node):
        if getattr(n, "lineno", None) is None:
            attributes = n._attributes
            if attributes:
                for a, v in copied:
                    if a in attributes:
                        setattr(n, a, v)


def _walk(node):
    """traverse_node for pytest's rewriter: inside visit_Assert (its one use: filling in missing locations) it fills
    them in itself and leaves nothing for the loop to do; anywhere else every node (_iter_tree)."""
    if _ASSERTS:
        _locate(node, _ASSERTS[-1])
        return ()
    return _iter_tree(node)


_SAMPLE = b"""
def test_f(a, b, xs):
    assert a == b
    assert a(1, *xs, k=b) == [x for x in xs if x], "message %d" % a
    assert not (a.b and b[0] or xs), f"{a!r}"
    assert (y := a) in xs and y is not None
    assert all(x < 3 for x in xs) and {1: a}[1] >= b < 4
    assert a
    assert (a, b)
"""


def _rewrite_dump(rewrite, source: bytes) -> str:
    import ast
    import warnings

    tree = ast.parse(source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rewrite.rewrite_asserts(tree, source, "test_sample.py", None)
    compile(tree, "test_sample.py", "exec")
    return ast.dump(tree, include_attributes=True)


def fast_assertion_rewrite() -> None:
    """pytest's assertion rewriting walks each rewritten assert with nested generators and calls ast.copy_location
    per node lacking a location (most of the ~3.5 ms it takes per HumanEval test file): the same walk without
    generators, and while an assert is rewritten the locations filled in during that walk. Installed only if a
    sample of asserts is then rewritten exactly as before (another pytest keeps its own)."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:  # pragma: no cover
        return
    rewriter = getattr(rewrite, "AssertionRewriter", None)
    visit = getattr(rewriter, "visit_Assert", None)
    if not callable(getattr(rewrite, "traverse_node", None)) or not callable(visit) \
            or getattr(visit, "_evolforge", False):
        return
    original_walk = rewrite.traverse_node
    before = _rewrite_dump(rewrite, _SAMPLE)

    def visit_Assert(self, assert_):  # noqa: N802 - pytest's name
        _ASSERTS.append(_copied(assert_))
        try:
            return visit(self, assert_)
        finally:
            _ASSERTS.pop()

    visit_Assert._evolforge, visit_Assert._evolforge_original = True, visit
    rewrite._evolforge_traverse_node = original_walk
    rewrite.traverse_node, rewriter.visit_Assert = _walk, visit_Assert
    try:
        same = _rewrite_dump(rewrite, _SAMPLE) == before
    except Exception:  # noqa: BLE001
        same = False
    if not same:
        rewrite.traverse_node, rewriter.visit_Assert = original_walk, visit


def _hooks(plugin: Verdict):
    """Mark the plugin's hooks for pluggy (done lazily: pytest is imported only when needed)."""
    import pytest

    cls = type(plugin)
    if not getattr(cls, "_marked", False):
        cls.pytest_collectreport = pytest.hookimpl(tryfirst=True)(cls.pytest_collectreport)
        cls.pytest_collection_finish = pytest.hookimpl(trylast=True)(cls.pytest_collection_finish)
        cls.pytest_runtest_makereport = pytest.hookimpl(hookwrapper=True, tryfirst=True)(cls.pytest_runtest_makereport)
        cls.pytest_sessionfinish = pytest.hookimpl(trylast=True)(cls.pytest_sessionfinish)
        cls._marked = True
    return plugin


# The warm worker's cache of rewritten test files (PytestTemplate.precompile). In evolution one task's tests check
# many solutions: their runners then skip pytest's parse, assertion rewrite and compile of the file (3-5 ms each).
MAX_PRECOMPILED_FILE_BYTES = 256 * 1024  # a larger test file is rewritten by its runner, as without the cache
MAX_PRECOMPILED_FILES = 256  # test files kept per template; the least recently checked one is dropped first
MAX_PRECOMPILED_BYTES = 2 * 1024 * 1024  # and at most this much of their source in all (their code is a few times that)
# What the cache did, for tests: the worker counts `compiled` (test files it rewrote) and `reused` (checks whose file
# it had rewritten for an earlier check); a runner inherits those and counts `served` (its pytest took the code from
# the cache) or `rewritten` (its pytest rewrote the file itself).
REWRITE_STATS = {"compiled": 0, "reused": 0, "served": 0, "rewritten": 0}


def _keys(digest: bytes, plain_ok: bool) -> tuple:
    """The cache keys a test file's code may be kept under, in the order to look: (sha256, compiled without
    assertion rewriting), the unrewritten code first when it will do."""
    return ((digest, True), (digest, False)) if plain_ok else ((digest, False),)


def _compile_rewritten(source: bytes, path: str, config):
    """What pytest's `_rewrite_test` makes of `source` at `path` (parse, rewrite the asserts, compile), or None if
    that fails or warns (the runner's pytest then does it again and reports the error or the warnings)."""
    import ast
    import warnings

    from _pytest.assertion.rewrite import rewrite_asserts

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tree = ast.parse(source, filename=path)
            rewrite_asserts(tree, source, path, config)
            code = compile(tree, path, "exec", dont_inherit=True)
    except Exception:  # noqa: BLE001 - SyntaxError, RecursionError, MemoryError, ...
        return None
    return None if caught else code


class PytestTemplate:
    """pytest configured and its session started for one set of options and test file name, with the verdict
    plugin registered, BEFORE any check's file exists (built once in a warm worker; each check's child then
    only collects and runs: `run`). Nothing of a check is involved in building it.

    `precompile` (in the worker, before a check's runner is forked) rewrites and compiles the check's test file as
    pytest's import of it would, WITHOUT running any of it, and keeps the code keyed by the sha256 of the file's
    bytes. The runner's pytest takes that code instead of parsing, rewriting and compiling the file again, but only
    for a file whose bytes it read itself hash to that key; anything else is pytest's own rewrite."""

    def __init__(self, options: list, test_file: str) -> None:
        import collections

        import pytest
        from _pytest.config import get_config
        from _pytest.main import Session

        os.environ["PYTEST_VERSION"] = pytest.__version__
        fast_assertion_rewrite()
        args = [*options, test_file]
        self.plugin = _hooks(Verdict())
        initial = get_config(args)
        manager = initial.pluginmanager
        manager.register(self.plugin)
        self.config = manager.hook.pytest_cmdline_parse(pluginmanager=manager, args=args)
        self.session = Session.from_config(self.config)
        self.session.exitstatus = 0
        self.config._do_configure()
        self.config.hook.pytest_sessionstart(session=self.session)
        # where the runner's pytest finds the test file: the worker's and the runner's cwd is the rootdir
        self.test_path = str(self.config.invocation_params.dir / test_file)
        self.test_file = test_file
        direct = sys.modules.get("_evolforge_direct")  # the worker preloads it
        self.direct_usable = direct is not None and direct.usable(self.config, self.session)
        self.direct = False  # set per check by the worker (worker._run_check): the job allows it
        self.report = True  # set per check by the worker: a failure's report is read (not a reward)
        self.compiled: collections.OrderedDict = collections.OrderedDict()  # sha256 of the file -> (size, code)
        self.compiled_bytes = 0
        self._serve_compiled()

    def precompile(self, fd: int, plain: bool = False) -> None:
        """In the worker: the test file open at `fd` (the host's memfd of it) rewritten and compiled as pytest's
        `_rewrite_test` would, kept in `compiled`; never executed here. A file that is too large, does not parse or
        compile, or whose rewrite warns is left to its runner."""
        import hashlib

        size = os.fstat(fd).st_size
        if size > MAX_PRECOMPILED_FILE_BYTES:
            return
        source = os.pread(fd, size + 1, 0)
        if len(source) != size:
            return
        digest = hashlib.sha256(source).digest()
        for key in _keys(digest, plain):
            if key in self.compiled:
                self.compiled.move_to_end(key)
                REWRITE_STATS["reused"] += 1
                return
        direct = sys.modules.get("_evolforge_direct") if plain else None
        code = direct.compile_plain(source, self.test_path) if direct is not None else None
        key = (digest, code is not None)
        if code is None:
            code = _compile_rewritten(source, self.test_path, self.config)
        if code is None:
            return
        self.compiled[key] = (size, code)
        self.compiled_bytes += size
        REWRITE_STATS["compiled"] += 1
        while len(self.compiled) > MAX_PRECOMPILED_FILES or self.compiled_bytes > MAX_PRECOMPILED_BYTES:
            self.compiled_bytes -= self.compiled.popitem(last=False)[1][0]

    def cached_code(self, source: bytes, plain_ok: bool = False):
        """(code, plain) `precompile` made of exactly these bytes (counted as served), or None. `plain_ok`: code
        compiled without assertion rewriting will do (the direct path's; pytest's own import never gets it)."""
        import hashlib

        if not self.compiled:
            return None
        digest = hashlib.sha256(source).digest()
        for key in _keys(digest, plain_ok):
            hit = self.compiled.get(key)
            if hit is not None:
                REWRITE_STATS["served"] += 1
                return hit[1], key[1]
        return None

    def _serve_compiled(self) -> None:
        """pytest's `_rewrite_test(fn, config) -> (source hash, code)` replaced (in the worker, so in every runner
        forked from it) by one that returns the code kept in `compiled` when `config` is this template's, `fn` its
        test file and the bytes it reads from `fn` hash to a key there; otherwise pytest's own."""
        try:
            from _pytest.assertion import rewrite
        except ImportError:  # pragma: no cover
            return
        original = getattr(rewrite, "_rewrite_test", None)
        if not callable(original):  # another pytest: no cache
            return
        template = self

        def _rewrite_test(fn, config):
            if config is template.config and str(fn) == template.test_path and template.compiled:
                import importlib.util

                source = fn.read_bytes()
                hit = template.cached_code(source)
                if hit is not None:
                    return importlib.util.source_hash(source), hit[0]
            REWRITE_STATS["rewritten"] += 1
            return original(fn, config)

        rewrite._rewrite_test = _rewrite_test

    def run(self, emit, ep) -> int:
        """In the check's child: collect, run, report (what wrap_session does after pytest_sessionstart), or with
        `direct` (a plain test file, the job allows it) the tests called directly (tasks/sandbox/direct.py)."""
        self.plugin.start(emit, ep)
        if self.direct:
            check = sys.modules["_evolforge_direct"].Direct(self.config, self.test_path, self.test_file,
                                                            self.cached_code, rerun=self.report)

            def final(counts: dict) -> None:
                emit({"runner": "pytest", **counts, **channel_state(ep)})
                try:  # check_quiet's last look left the channel non-blocking; a report's rerun still calls over it
                    os.set_blocking(ep.rfd, True)
                except (AttributeError, OSError):
                    pass

            return check.run(final, self._run)
        return self._run()

    def _run(self) -> int:
        """pytest's own collection and run of the check's file."""
        import _pytest._code
        from _pytest import timing
        from _pytest.config import ExitCode, UsageError
        from _pytest.main import _main
        from _pytest.outcomes import Exit, Failed

        config, session = self.config, self.session
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and hasattr(reporter, "_session_start"):
            reporter._session_start = timing.Instant()
        logs = config.pluginmanager.get_plugin("logging-plugin")
        handler = getattr(logs, "log_file_handler", None)
        if handler is not None and getattr(handler, "baseFilename", None) == os.devnull:
            handler.stream = None  # its descriptor was the worker's (closed in this child): reopened when used
        try:
            try:
                session.exitstatus = _main(config, session) or 0
            except UsageError:
                session.exitstatus = ExitCode.USAGE_ERROR
                raise
            except Failed:
                session.exitstatus = ExitCode.TESTS_FAILED
            except (KeyboardInterrupt, Exit):
                excinfo = _pytest._code.ExceptionInfo.from_current()
                session.exitstatus = ExitCode.INTERRUPTED
                if isinstance(excinfo.value, Exit) and excinfo.value.returncode is not None:
                    session.exitstatus = excinfo.value.returncode
                config.hook.pytest_keyboard_interrupt(excinfo=excinfo)
            except BaseException:  # noqa: BLE001 - as pytest's wrap_session
                session.exitstatus = ExitCode.INTERNAL_ERROR
                excinfo = _pytest._code.ExceptionInfo.from_current()
                config.notify_exception(excinfo, config.option)
        finally:
            os.chdir(session.startpath)
            try:
                config.hook.pytest_sessionfinish(session=session, exitstatus=session.exitstatus)
            except Exit as exc:
                if exc.returncode is not None:
                    session.exitstatus = exc.returncode
            config._ensure_unconfigure()
        return int(session.exitstatus)


def main(argv: list, template: PytestTemplate | None = None) -> int:
    """`template`: the worker's prepared pytest for exactly these options (None: pytest.main)."""
    nonce_fd, result_fd, bridge_in, bridge_out, runner, test_file, *options = argv
    emit = _writer(int(result_fd), _read_nonce(int(nonce_fd)))
    _undumpable()
    ep = bridge.runner_endpoint(int(bridge_in), int(bridge_out), test_file)
    bridge.install_solution_importer(ep)
    if runner == "pytest":
        if template is not None:
            return template.run(emit, ep)
        import pytest

        fast_assertion_rewrite()
        plugin = _hooks(Verdict())
        plugin.start(emit, ep)
        return int(pytest.main([*options, test_file], plugins=[plugin]))
    import runpy

    sys.argv = [test_file]
    try:
        runpy.run_path(test_file, run_name="__main__")
    except BaseException as e:  # the script failed or exited: recorded as not completed, then as python would
        emit({"runner": "script", "completed": False, "ended_by": type(e).__name__, **channel_state(ep)})
        raise
    emit({"runner": "script", "completed": True, "ended_by": None, **channel_state(ep)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
