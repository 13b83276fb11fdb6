"""The tests of a plain pytest file called directly, with pytest's verdict but without its runner (warm workers).

Not imported by evolforge: tasks/sandbox/worker.py preloads it as `_evolforge_direct`, and the pytest template of
tasks/sandbox/harness.py uses it in a check's runner. Stdlib and pytest only.

Most generated test files are a few module-level `def test_*():` functions. For them pytest's collection tree,
reports, hooks and terminal output cost more CPU than the tests themselves. `Direct.run` imports the test module
as pytest's collection does (the module named after the file, its directory first on sys.path, registered in
sys.modules, inside pytest's output capture and warning filters; a failing import is reported as pytest's
collection error), then looks at every name the module defines as pytest's collector would (`plain_tests`). It
goes on by itself only if pytest would collect nothing but plain functions:

- every name pytest would collect as a test (a `test*` name, or an object whose `__test__` is True) is a plain
  Python function with no parameters, not async, not a generator, with no attributes of its own (so no marks,
  no parametrize, no `__test__`, no wrapper);
- no class pytest would collect (`Test*`, `__test__ = True`, a unittest.TestCase), no fixture (an autouse one
  would run around the tests), no `pytestmark`, `__test__`, `setup_module`/`setUpModule`, `teardown_module`/
  `tearDownModule`, `setup_function`, `teardown_function`, `pytest_generate_tests` or `pytest_plugins`.

Anything else goes to pytest's own run (`fallback`) on the module already imported: pytest finds it in
sys.modules and does not run it again, so nothing of the file or the solution runs twice. The settings that
could change this (ini options, plugins beyond pytest's own, autouse fixtures) are checked once per template
(`usable`), and the worker allows the direct path only for a job of exactly the solution and the test file.

The code comes from the worker (harness.PytestTemplate.precompile), never from the runner's own compile: a file
that looks plain before it runs (`plain_source`) is compiled WITHOUT pytest's assertion rewriting (a tenth of
the cost); any other, as pytest rewrites it. For the asserts such a file may hold (`_plain_assert`: no `and`/`or`,
no comparison chain, no walrus, no tuple, not deeply nested) rewriting changes what a failing assert reports,
never whether it fails: pytest's rewriter asks an `and`/`or` operand for its truth twice, evaluates every link
of a chain, and recurses over the expression (a RecursionError in its import for a very deep one), so asserts
with those keep its rewriting and its behaviour. A test of unrewritten code that fails is run again after the
verdict is written, from the file rewritten as pytest would, for its report only (`_rerun`): nothing that run
does can change the verdict, and a test that passes the second time is reported as such.

Each test is called as pytest's runner calls it: inside pytest's warning filters for the item (a test that
triggers a warning pytest turns into an error fails), with its output captured (`--capture=sys`: stdin reads
fail, nothing printed reaches the output unless the test fails), with pytest's logging plugin's handlers on the
root logger (so `logging.basicConfig()` in a test does nothing, as under pytest), with PYTEST_CURRENT_TEST set,
with pytest's assertion-comparison hooks in place, as many frames deep as under pytest's runner (recursion near
the limit ends the same way), through pytest's own `pytest_pyfunc_call` (a test returning an awaitable fails;
another return value warns). A test passes only if that call returns; anything raised fails it (pytest.skip is
counted as skipped and xfail as failed, as the harness's plugin counts them; neither passes a check). The final
record has the fields and meaning of the pytest plugin's (harness.Verdict). Known differences, none of which
passes a check that pytest's runner fails: a failing assert over values the channel cannot compare (a NaN met
only while pytest builds its failure explanation) fails as a plain failure rather than "not checkable", since the
explanation is built after the verdict; the report is a short one in pytest's format (the failing tests, their
traceback as `--tb=short` shows it, their captured output and log, the warnings summary), not pytest's full
terminal report.
"""

import os
import sys
import types

# names that change what pytest collects or runs around a module's tests (a module-level __getattr__ or __dir__
# answers pytest's getattr of any of them)
_SPECIAL = frozenset({"pytestmark", "__test__", "setup_module", "setUpModule", "teardown_module", "tearDownModule",
                      "setup_function", "teardown_function", "pytest_generate_tests", "pytest_plugins",
                      "__getattr__", "__dir__"})
# pytest's rewritten asserts evaluate these differently from plain Python (a BoolOp asks an operand for its truth
# twice, a comparison chain does not stop at a false link, so a walrus in a later link still binds), and its
# rewriter recurses over the expression (a RecursionError in pytest's import for a deep one): an assert with any
# of them, or nested deeper than this, keeps pytest's rewriting
_REWRITE_ONLY = ("BoolOp", "NamedExpr")
_MAX_PLAIN_ASSERT_DEPTH = 100
# the frames pytest's runner has below a test function that the direct path does not (32 against 12 with pytest
# 9.2, counted from the test's own frame; tests/tasks/sandbox/test_sandbox_direct.py checks they are equal): the
# direct path calls the test under as many more, so recursion near the limit ends as it would under pytest
_PYTEST_EXTRA_FRAMES = 20
_RERUN_SECONDS = 2.0  # the run again of failed tests for their report (after the verdict) is given up after this
_FLAGS = 0x04 | 0x08 | 0x20 | 0x80 | 0x100 | 0x200  # varargs, varkeywords, generator, coroutine, async gen, ...
_NO_FIXTURES = types.SimpleNamespace(argnames=())
# ExitCode values (pytest's), bound here so the record does not depend on the test's view of pytest
_OK, _TESTS_FAILED, _INTERRUPTED, _NO_TESTS = 0, 1, 2, 5


def usable(config, session) -> bool:
    """Whether this template's settings leave collection to the defaults `run` reproduces: pytest's own plugins
    only (and the harness's), default name patterns, prepend imports, no autouse fixture, no selection."""
    try:
        import pytest

        for plugin in config.pluginmanager.get_plugins():
            owner = getattr(plugin, "__name__", None) if isinstance(plugin, types.ModuleType) \
                else type(plugin).__module__
            if not (owner or "").startswith(("_pytest.", "pytest", "_evolforge_harness", "evolforge.")) \
                    and not isinstance(plugin, (type(config), type(session))):
                return False
        option = config.option
        return (config.getini("python_functions") == ["test"] and config.getini("python_classes") == ["Test"]
                and config.getini("collect_imported_tests") is True and not config.getini("usefixtures")
                and str(config.getoption("--import-mode")) in ("prepend", "ImportMode.prepend")
                and not getattr(option, "keyword", "") and not getattr(option, "markexpr", "")
                and not getattr(option, "deselect", None) and not getattr(option, "exitfirst", False)
                and not getattr(option, "usepdb", False) and not config.getini("xfail_strict")
                and not list(session._fixturemanager._getautousenames(session))
                and callable(getattr(pytest, "Item", None)) and _logging_ok(config))
    except Exception:  # noqa: BLE001 - another pytest: its own runner
        return False


def _deeper(n: int, fn, arg):
    """fn(arg), called n frames deeper."""
    return fn(arg) if n <= 1 else _deeper(n - 1, fn, arg)


def _logging_ok(config) -> bool:
    """pytest's logging plugin is off, or has what Direct._logging uses of it."""
    logs = config.pluginmanager.get_plugin("logging-plugin")
    return logs is None or (callable(getattr(logs, "_runtest_for", None))
                            and callable(getattr(getattr(logs, "log_cli_handler", None), "set_when", None)))


class _RerunTimeout(BaseException):
    """The run again of failed tests for their report took too long (Direct._rerun)."""


class _Item:
    """What pytest_pyfunc_call, catch_warnings_for_item and the assertion plugin read of a test item."""

    def __init__(self, name: str, obj, nodeid: str, config) -> None:
        self.name = self.originalname = name
        self.obj, self.nodeid, self.config, self.ihook = obj, nodeid, config, config.hook
        self.funcargs: dict = {}
        self._fixtureinfo = _NO_FIXTURES
        from _pytest.stash import Stash

        self.stash = Stash()
        self.sections: list = []  # (title, text) as pytest's report sections: the logging plugin's captured log

    def add_report_section(self, when: str, key: str, content: str) -> None:
        if content:
            self.sections.append((f"Captured {key} {when}", content))

    def iter_markers(self, name=None):
        return iter(())


def _plain_test(obj) -> bool:
    if type(obj) is not types.FunctionType:
        return False
    code = obj.__code__
    return (code.co_argcount == 0 and code.co_kwonlyargcount == 0 and code.co_posonlyargcount == 0
            and not code.co_flags & _FLAGS and not obj.__dict__)


def plain_tests(module) -> list | None:
    """The (name, function) pairs pytest would collect from `module`, in its order, if they are all plain
    functions and nothing else of the module changes how they run; None otherwise."""
    import inspect

    from _pytest.compat import safe_getattr, safe_isclass
    from _pytest.fixtures import getfixturemarker
    from _pytest.python import IGNORED_ATTRIBUTES

    unittest = sys.modules.get("unittest")
    tests = []
    for name, obj in list(module.__dict__.items()):
        if name in _SPECIAL:
            return None
        if name in IGNORED_ATTRIBUTES:
            continue
        if getfixturemarker(obj) is not None:
            return None
        if safe_isclass(obj):
            if name.startswith("Test") or safe_getattr(obj, "__test__", False) is True:
                return None
            try:
                if unittest is not None and issubclass(obj, unittest.TestCase) and not inspect.isabstract(obj):
                    return None
            except Exception:  # noqa: BLE001 - what pytest's unittest plugin does with such a class: skip it
                pass
        elif name.startswith("test") or safe_getattr(obj, "__test__", False) is True:
            if isinstance(obj, (staticmethod, classmethod)):
                return None
            if not callable(obj):
                continue
            if not _plain_test(obj):
                return None
            tests.append((name, obj))
    return tests


def _defines_test_or_yields(node) -> bool:
    """A function node that takes parameters, or has a yield or await of its own (not in a nested def)."""
    import ast

    a = node.args
    if a.args or a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg:
        return True
    stack = list(node.body)
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)):
            return True
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(n))
    return False


def _plain_assert(node) -> bool:
    """An assert whose rewritten form fails and passes exactly as the plain one does, and that pytest's rewriter
    neither warns about (a non-empty tuple) nor recurses too deep on."""
    import ast

    if isinstance(node.test, ast.Tuple) and node.test.elts:
        return False
    stack = [(node.test, 1)]
    while stack:
        n, depth = stack.pop()
        if depth > _MAX_PLAIN_ASSERT_DEPTH or type(n).__name__ in _REWRITE_ONLY \
                or isinstance(n, ast.Compare) and len(n.ops) > 1:
            return False
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(n))
    return True


def plain_source(tree) -> bool:
    """Whether a parsed test file looks plain before it runs (the worker's guess, so it can compile the file
    without pytest's assertion rewriting; `plain_tests` decides after the import): no decorator, async def,
    `Test*` class or class with bases at the top level, no test function with parameters or a yield, none of
    the names that change pytest's collection bound at the top level, and every assert `_plain_assert`."""
    import ast

    for node in tree.body:
        if isinstance(node, ast.AsyncFunctionDef):
            return False
        if isinstance(node, ast.ClassDef) and (node.decorator_list or node.bases or node.keywords
                                               or node.name.startswith("Test")):
            return False
        if isinstance(node, ast.FunctionDef) and (node.decorator_list or node.name in _SPECIAL or (
                node.name.startswith("test") and _defines_test_or_yields(node))):
            return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and not _plain_assert(node):
            return False
        if isinstance(node, ast.Name) and node.id in _SPECIAL or isinstance(node, ast.alias) and \
                (node.asname or node.name) in _SPECIAL:
            return False
        if isinstance(node, ast.ClassDef) and node.name in _SPECIAL:
            return False
    return True


def compile_plain(source: bytes, path: str):
    """The test file's code without pytest's assertion rewriting (about a tenth of the cost), if `plain_source`
    says it looks plain; else None. Asserts are kept whatever the interpreter's -O (optimize=0). Rewriting
    changes what a failing assert reports, never whether it fails: a file run from this code that fails a test
    gets its report from running that test again, rewritten, after the verdict is written (Direct._rerun)."""
    import ast

    try:
        tree = ast.parse(source, filename=path)
        if not plain_source(tree):
            return None
        return compile(tree, path, "exec", dont_inherit=True, optimize=0)
    except Exception:  # noqa: BLE001 - SyntaxError, RecursionError, ...: pytest's own rewrite reports it
        return None


def _report(info, path: str | None, out: str, err: str, log: str = "") -> str:
    """A failure as pytest's --tb=short shows it (from the first frame in the test file at `path`), and the
    test's captured output."""
    text = ""
    try:
        if path is not None:
            from pathlib import Path

            info.traceback = info.traceback.cut(path=Path(path))
        info.traceback = info.traceback.filter(info)
        text = str(info.getrepr(style="short", funcargs=False, chain=True))
    except Exception:  # noqa: BLE001 - a report that cannot be formatted still names the exception
        try:
            text = info.exconly()
        except Exception:  # noqa: BLE001
            text = "(the exception could not be formatted)"
    for title, captured in (("stdout", out), ("stderr", err), ("log", log)):
        if captured:
            text += f"\n{'-' * 30} Captured {title} call {'-' * 30}\n{captured[-4000:]}"
    return text


def _first_line(info) -> str:
    """The failure's line in pytest's short summary (an assert's message without "AssertionError: ")."""
    try:
        return (info.exconly(tryshort=True).splitlines() or [""])[0]
    except Exception:  # noqa: BLE001
        return type(info.value).__name__


def _banner(title: str, fill: str = "=") -> str:
    pad = max(2, 80 - len(title) - 2)
    return f"{fill * (pad // 2)} {title} {fill * (pad - pad // 2)}"


class Direct:
    """One check's run: `run(config, path, relpath, emit_final, fallback)`; see the module's docstring."""

    def __init__(self, config, path: str, relpath: str, cached_code=None, rerun: bool = True) -> None:
        self.config, self.path, self.relpath = config, path, relpath
        self.capman = config.pluginmanager.getplugin("capturemanager")
        self.cached_code = cached_code  # source bytes -> (code, plain) the worker compiled of them, or None
        self.plain = False  # the module runs code compiled without pytest's assertion rewriting
        self.rerun = rerun  # a failed test of unrewritten code is run again for its report (False: a reward's check)
        self.source = b""

    def _load(self):
        """What pytest's importtestmodule does for a module file in the rootdir (prepend mode: the directory
        first on sys.path, the module named after the file, registered in sys.modules), with the code the worker
        compiled of exactly these bytes; None if there is none (pytest's import then). Exceptions are
        importtestmodule's: an ImportError or a skip without allow_module_level becomes its CollectError."""
        import importlib.util

        from _pytest._code import ExceptionInfo
        from _pytest.assertion.rewrite import assertstate_key
        from _pytest.nodes import Collector
        from _pytest.outcomes import skip
        from _pytest.pathlib import ImportMode
        from _pytest.python import filter_traceback

        config = self.config
        name, ext = os.path.splitext(os.path.basename(self.path))
        root = os.path.dirname(self.path)
        if self.cached_code is None or ext != ".py" or name in sys.modules or not name.isidentifier() \
                or os.path.exists(os.path.join(root, "__init__.py")) \
                or config.getoption("--import-mode") not in (ImportMode.prepend, "prepend"):
            return None
        with open(self.path, "rb") as f:
            self.source = f.read()
        found = self.cached_code(self.source, True)
        if found is None:
            return None
        code, self.plain = found
        if sys.path[0] != root:
            sys.path.insert(0, root)
        hook = config.stash[assertstate_key].hook
        spec = importlib.util.spec_from_file_location(name, self.path, loader=hook)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            exec(code, module.__dict__)
        except skip.Exception as e:
            sys.modules.pop(name, None)
            if e.allow_module_level:
                raise
            raise Collector.CollectError(
                "Using pytest.skip outside of a test will skip the entire module. If that's your intention, pass "
                "`allow_module_level=True`. If you want to skip a specific test or an entire class, use the "
                "@pytest.mark.skip or @pytest.mark.skipif decorators.") from e
        except ImportError as e:
            sys.modules.pop(name, None)
            info = ExceptionInfo.from_current()
            if config.get_verbosity() < 2:
                info.traceback = info.traceback.filter(filter_traceback)
            shown = str(info.getrepr(style="short")) if info.traceback else info.exconly()
            raise Collector.CollectError(
                f"ImportError while importing test module '{self.path}'.\n"
                "Hint: make sure your test modules/packages have valid Python names.\n"
                f"Traceback:\n{shown}") from e
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module

    def _import(self):
        """The test module as pytest's collection imports it: (module, None) or (None, (kind, report))."""
        from pathlib import Path

        from _pytest._code import ExceptionInfo
        from _pytest.nodes import Collector
        from _pytest.outcomes import Skipped
        from _pytest.python import importtestmodule
        from _pytest.warnings import catch_warnings_for_item

        capman, config = self.capman, self.config
        capman.resume_global_capture()
        failure = None
        try:
            with catch_warnings_for_item(config=config, ihook=config.hook, when="collect", item=None):
                module = self._load()
                if module is None:
                    module = importtestmodule(Path(self.path), config)
        except BaseException as e:  # noqa: BLE001 - a collection error, as pytest reports it
            module = None
            if isinstance(e, Skipped):
                failure = ("skipped", f"module skipped: {e.msg}")
            elif isinstance(e, Collector.CollectError):
                failure = ("error", str(e.args[0]) if e.args else repr(e))
            else:
                info = ExceptionInfo.from_exception(e)
                failure = ("interrupted" if isinstance(e, KeyboardInterrupt) else "error", _report(info, None, "", ""))
        finally:
            capman.suspend_global_capture()
            out, err = capman.read_global_capture()
        if failure is not None and (out or err):
            failure = (failure[0], failure[1] + "".join(f"\n{'-' * 30} Captured {t} {'-' * 30}\n{c[-4000:]}"
                                                        for t, c in (("stdout", out), ("stderr", err)) if c))
        return module, failure

    def _call(self, item) -> tuple:
        """One test as pytest's runner calls it: (None, out, err) if it returned, else (exception, out, err)."""
        from _pytest.assertion import pytest_runtest_protocol as assertion_hooks
        from _pytest.python import pytest_pyfunc_call
        from _pytest.runner import _update_current_test_var
        from _pytest.warnings import catch_warnings_for_item

        capman, config, exc = self.capman, self.config, None
        with catch_warnings_for_item(config=config, ihook=config.hook, when="runtest", item=item):
            hooks = assertion_hooks(item)
            next(hooks)
            try:
                _update_current_test_var(item, "setup")
                _update_current_test_var(item, "call")
                capman.resume_global_capture()
                try:
                    with self._logging(item):
                        _deeper(_PYTEST_EXTRA_FRAMES, pytest_pyfunc_call, item)
                except BaseException as e:  # noqa: BLE001 - the test's outcome
                    exc = e
                finally:
                    capman.suspend_global_capture(in_=False)
                    out, err = capman.read_global_capture()
                _update_current_test_var(item, "teardown")
            finally:
                hooks.close()
                os.environ.pop("PYTEST_CURRENT_TEST", None)
        return exc, out, err

    def _logging(self, item):
        """pytest's logging plugin around the call: its handlers on the root logger while the test runs (so
        `logging.basicConfig()` in a test does nothing, as under pytest), what the test logs kept for the report."""
        import contextlib

        from _pytest.logging import caplog_records_key

        logs = self.config.pluginmanager.get_plugin("logging-plugin")
        if logs is None:
            return contextlib.nullcontext()
        item.stash[caplog_records_key] = {}
        logs.log_cli_handler.set_when("call")
        return logs._runtest_for(item, "call")

    def _warnings_summary(self) -> None:
        """The warnings recorded in collection and in the tests, as pytest's terminal summary lists them."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        try:
            reporter.summary_warnings()
        except Exception:  # noqa: BLE001 - another pytest: no summary
            pass
        sys.stdout.flush()

    def run(self, emit_final, fallback) -> int:
        """`emit_final(counts)`: the record (the harness adds the channel's state); `fallback()`: pytest's own run."""
        import time

        from _pytest._code import ExceptionInfo
        from _pytest.outcomes import Exit, Skipped, XFailed

        start = time.perf_counter()
        module, failure = self._import()
        if failure is not None:
            kind, text = failure
            print(f"{_banner('ERRORS')}\n{_banner('ERROR collecting ' + self.relpath, '_')}\n{text}" if kind != "skipped"
                  else text, flush=True)
            errors = 0 if kind == "skipped" else 1
            status = _NO_TESTS if kind == "skipped" else _INTERRUPTED
            emit_final({"collected": 0, "passed": 0, "failed": 0, "errors": errors, "skipped": 0, "exitstatus": status})
            return status
        tests = plain_tests(module)
        if tests is None:
            return fallback()
        unittest = sys.modules.get("unittest")
        counts = {"collected": len(tests), "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
        failures, interrupted, marks, xfailed = [], False, [], 0
        for name, obj in tests:
            item = _Item(name, obj, f"{self.relpath}::{name}", self.config)
            exc, out, err = self._call(item)
            log = "\n".join(text for _, text in item.sections)
            if exc is None:
                counts["passed"] += 1
                marks.append(".")
                continue
            if isinstance(exc, Skipped) or (unittest is not None and isinstance(exc, unittest.SkipTest)):
                counts["skipped"] += 1
                marks.append("s")
            elif isinstance(exc, XFailed):  # the harness's plugin counts it failed; pytest's exit status stays 0
                counts["failed"] += 1
                xfailed += 1
                marks.append("x")
            else:
                counts["failed"] += 1
                marks.append("F")
                failures.append((name, ExceptionInfo.from_exception(exc), out, err, log))
            if isinstance(exc, (KeyboardInterrupt, Exit)):
                interrupted = True
                break
        status = _INTERRUPTED if interrupted else _TESTS_FAILED if counts["failed"] > xfailed else \
            _NO_TESTS if not tests else _OK
        emit_final({**counts, "exitstatus": status})  # the verdict is written before any report is made
        if failures and self.plain and self.rerun:
            try:
                failures = self._rerun(failures)
            except _RerunTimeout:  # the alarm between the rerun's end and its cancel
                pass
        lines = ["".join(marks)]
        if failures:
            lines.append(_banner("FAILURES"))
            for name, info, out, err, log in failures:
                lines += [_banner(name, "_"), _report(info, self.path, out, err, log)]
            lines.append(_banner("short test summary info"))
            lines += [f"FAILED {self.relpath}::{name} - {_first_line(info)}" for name, info, *_ in failures]
        shown = {"failed": counts["failed"] - xfailed, "passed": counts["passed"], "skipped": counts["skipped"],
                 "xfailed": xfailed}
        summary = ", ".join(f"{n} {k}" for k, n in shown.items() if n) or "no tests ran"
        print("\n".join(lines), flush=True)
        self._warnings_summary()
        print(f"{summary} in {time.perf_counter() - start:.2f}s", flush=True)
        return status

    def _rerun(self, failures: list) -> list:
        """The module ran without pytest's assertion rewriting: after the verdict, for the report only, the file
        rewritten as pytest would and run again (in a module of its own), and each failed test called again, so
        its report shows the values as pytest's would. A test that passes when run again keeps its first report,
        with a line saying so. Anything that goes wrong here, or a rerun longer than _RERUN_SECONDS (SIGALRM),
        keeps the first reports."""
        import signal

        def too_long(signum, frame):
            raise _RerunTimeout

        note = f"\n(running the failed tests again for their values took over {_RERUN_SECONDS:g} s: first reports)"
        first = [(name, info, out, err + note, log) for name, info, out, err, log in failures]
        try:
            previous = signal.signal(signal.SIGALRM, too_long)
        except (ValueError, OSError):  # not the main thread: no time limit, so no rerun
            return failures
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, _RERUN_SECONDS)
                return self._rerun_reports(failures)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
        except _RerunTimeout:
            return first

    def _rerun_reports(self, failures: list) -> list:
        import ast
        import types

        from _pytest._code import ExceptionInfo
        from _pytest.assertion.rewrite import rewrite_asserts

        try:
            tree = ast.parse(self.source, filename=self.path)
            rewrite_asserts(tree, self.source, self.path, self.config)
            code = compile(tree, self.path, "exec", dont_inherit=True)
            module = types.ModuleType(os.path.splitext(os.path.basename(self.path))[0])
            module.__file__ = self.path
            self.capman.resume_global_capture()
            try:
                exec(code, module.__dict__)
            finally:
                self.capman.suspend_global_capture()
                self.capman.read_global_capture()
        except _RerunTimeout:
            raise
        except BaseException:  # noqa: BLE001 - the first reports stand
            return failures
        again = []
        for name, info, out, err, log in failures:
            obj = module.__dict__.get(name)
            if type(obj) is not types.FunctionType:
                again.append((name, info, out, err, log))
                continue
            item = _Item(name, obj, f"{self.relpath}::{name}", self.config)
            exc, out2, err2 = self._call(item)
            if isinstance(exc, _RerunTimeout):
                raise exc
            if exc is None:
                note = ("\n(this test failed, then passed when run again to show the values in this report: the "
                        "code under test did not give the same answers twice)")
                again.append((name, info, out, err + note, log))
            else:
                again.append((name, ExceptionInfo.from_exception(exc), out2, err2,
                              "\n".join(text for _, text in item.sections)))
        return again
