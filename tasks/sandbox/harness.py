"""The harness that runs the tests INSIDE the sandbox and reports the result on a private channel.

Not imported by evolforge: tasks/sandbox/run.py writes this file's text into the sandbox's working dir
(as `_evolforge_harness.py`, read-only) and starts

    python _evolforge_harness.py NONCE_FD RESULT_FD pytest|script TEST_FILE [PYTEST_OPTION ...]

Stdlib and pytest only. Before the code under test is imported, the harness
1. reads the run's nonce from NONCE_FD (a pipe the host filled and closed) and closes it, so the nonce
   never appears in argv, the environment, a file or an open descriptor;
2. makes itself non-dumpable (prctl PR_SET_DUMPABLE 0): its /proc/<pid>/mem is then closed to every
   process of the sandbox's uid, this one included;
3. installs an audit hook (audit hooks cannot be removed; pytest: at pytest_sessionstart, after the
   snapshot below and before collection imports the test file; script: before runpy) that refuses
   gc.get_objects / get_referrers / get_referents, everything of ctypes, sys.settrace / sys.setprofile
   and opening a process's `mem`, and that remembers the code object of the test file's module when it
   is first executed;
4. pytest: registers a plugin that counts the collected tests, takes each test's outcome from the real
   exception of each phase (a `pytest_runtest_makereport` hookwrapper, outermost, before any other
   implementation can rewrite the report), checks that every collected test's code belongs to the test
   file as it was executed, and snapshots pytest's, pluggy's, the builtins' and this harness's functions
   and classes to report any that changed while the tests ran;
   script: runs TEST_FILE with runpy.
It writes ONE final record to RESULT_FD, a JSON line with the nonce, at pytest_sessionfinish (pytest), or
after the script returned normally (script; SystemExit of any code writes nothing). The host's judgement
of that record is tasks/sandbox/verdict.py.

What this does not stop: the code under test shares this interpreter. Code that walks frames
(sys._getframe, tracebacks) to pytest's live objects or to this plugin can read the nonce or rewrite the
counts; code that rebinds helper globals of the test module, or pytest's state on live instances, is not
noticed. The channel makes the cheap forgeries fail (printed summaries, early exits, forged lines, flipped
reports, swapped test modules); it is not a proof against an adversary that reverse-engineers the harness.
"""

import os
import sys
import types

_type, _len, _isinstance, _callable, _id, _list, _frozenset = type, len, isinstance, callable, id, list, frozenset
_write, _close, _encode = os.write, os.close, str.encode
_SAFE = _frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:()[]-/, ")
_BLOCKED = _frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile"})
_WATCHED = ("_pytest", "pytest", "pluggy", "builtins", "__main__", __name__)  # __name__: in a sandbox worker
_WATCHED_PACKAGES = tuple(w + "." for w in _WATCHED)
_FUNCTION, _WRAPPERS = types.FunctionType, _frozenset({classmethod, staticmethod, types.MethodType})


def _read_nonce(fd: int) -> str:
    data = b""
    while True:
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    nonce = data.decode("ascii", "replace")
    if not 16 <= _len(nonce) <= 128 or any(c not in "0123456789abcdef" for c in nonce):
        raise SystemExit("evolforge harness: no valid nonce on its descriptor")
    return nonce


def _writer(fd: int, nonce: str):
    """emit(body): write the one final record, `{"nonce": ..., <body>}`, then close the channel."""
    done = [False]

    def emit(body: str) -> None:
        if done[0]:
            return
        done[0] = True
        data = _encode('{"nonce": "%s", %s}\n' % (nonce, body))
        try:
            while data:
                data = data[_write(fd, data):]
            _close(fd)
        except OSError:
            pass

    return emit


def _undumpable() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:  # noqa: BLE001 - best effort; the audit hook still refuses /proc/*/mem
        pass


def _guard(test_path: str, module_code: list) -> None:
    """The audit hook. Everything it uses is bound here, so rebinding builtins or globals cannot blunt it."""
    realpath, basename, isfile, code_type = os.path.realpath, os.path.basename, os.path.isfile, _type(_guard.__code__)
    blocked, typ, string, raw = _BLOCKED, _type, str, bytes
    denied, refused = PermissionError, RuntimeError

    def hook(event, args):
        if event == "open":
            path = args[0] if args else None
            if typ(path) is raw:
                path = raw.decode(path, "utf-8", "replace")
            if typ(path) is string:
                real = realpath(path)
                if basename(real) == "mem" and (real.startswith("/proc/") or not isfile(real)):
                    raise denied(13, "evolforge sandbox: reading a process's memory is not allowed", path)
        elif event == "exec":
            code = args[0] if args else None
            if not module_code and typ(code) is code_type and code.co_name == "<module>" \
                    and basename(code.co_filename) == basename(test_path) and realpath(code.co_filename) == test_path:
                module_code.append(code)
        elif event in blocked or event.startswith("ctypes."):
            raise refused(f"evolforge sandbox: {event} is not allowed")

    sys.addaudithook(hook)


def _nested_codes(code) -> dict:
    found, todo = {}, [code]
    while todo:
        c = todo.pop()
        found[_id(c)] = c
        todo += [k for k in c.co_consts if _type(k) is _type(code)]
    return found


def _code_of(obj):
    kind = _type(obj)
    if kind in _WRAPPERS:  # classmethod / staticmethod / bound method
        obj = obj.__func__
    elif kind is property:
        obj = obj.fget
    return obj.__code__ if _type(obj) is _FUNCTION else None


def _snapshot(extra: list) -> list:
    """(label, namespace, key, value, code) of every function and class of the watched modules, and each
    class's key set (key None), taken before the code under test is imported."""
    out = []
    for name, mod in _list(sys.modules.items()):
        if mod is None or not (name in _WATCHED or name.startswith(_WATCHED_PACKAGES)):
            continue
        ns = getattr(mod, "__dict__", None)
        if not _isinstance(ns, dict):
            continue
        classes = [v for v in _list(ns.values()) if _isinstance(v, type) and getattr(v, "__module__", None) == name]
        for key, value in _list(ns.items()):
            if _callable(value):
                out.append((name, ns, key, value, _code_of(value)))
        for cls in classes + [c for c in extra if getattr(c, "__module__", None) == name]:
            cns, label = cls.__dict__, f"{name}.{cls.__qualname__}"
            out.append((label, cns, None, _frozenset(cns), None))
            for key, value in _list(cns.items()):
                if _callable(value) or _isinstance(value, (classmethod, staticmethod, property)):
                    out.append((label, cns, key, value, _code_of(value)))
    return out


def _changed(snapshot: list) -> list:
    missing, changed = object(), []
    for label, ns, key, value, code in snapshot:
        if key is None:  # new methods or descriptors shadow what the class had (plain data pytest sets is fine)
            added = [k for k in _list(ns) if k not in value and (_callable(ns[k]) or hasattr(_type(ns[k]), "__get__"))]
            if added or not value <= _frozenset(ns):
                changed.append(f"{label}: methods added or attributes removed {added[:3]}")
        elif ns.get(key, missing) is not value:
            changed.append(f"{label}.{key} was replaced")
        elif code is not None and _code_of(value) is not code:
            changed.append(f"{label}.{key} had its code replaced")
    return changed


def _quote(text: str) -> str:
    return '"' + "".join(c if c in _SAFE else "?" for c in text[:200]) + '"'


def _pytest_plugin(emit, module_code: list, guard):
    import pytest
    from _pytest.outcomes import Skipped

    class EvolforgeVerdict:
        def __init__(self) -> None:
            self.items: list = []
            self.states: dict = {}
            self.collect_errors = 0
            self.snapshot: list = []
            self.foreign: list = []

        @pytest.hookimpl(tryfirst=True)
        def pytest_sessionstart(self, session) -> None:
            # before collection imports the test file (and so the solution): nothing untrusted has run yet
            self.snapshot = _snapshot([EvolforgeVerdict])
            guard()  # after the snapshot, which is three times slower under the hook

        def pytest_collectreport(self, report) -> None:
            if report.failed:
                self.collect_errors += 1

        @pytest.hookimpl(trylast=True)
        def pytest_collection_finish(self, session) -> None:
            self.items = _list(session.items)
            allowed = _nested_codes(module_code[0]) if module_code else {}
            for item in self.items:
                code = _code_of(getattr(item, "obj", None))
                if code is None or allowed.get(_id(code)) is not code:
                    self.foreign.append(f"collected test {item.nodeid} is not code of the test file")

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_makereport(self, item, call):
            state = self.states.setdefault(item.nodeid, {"ran": False, "bad": None, "skipped": False})
            exc = call.excinfo
            pending = getattr(item, "_excinfo", None)  # unittest.TestCase: the failure its result object caught
            if pending and _isinstance(pending, _list):
                exc = pending[0]
            unittest = sys.modules.get("unittest")
            if exc is None:
                if call.when == "call":
                    state["ran"] = True
            elif _isinstance(exc.value, Skipped) or (unittest and _isinstance(exc.value, unittest.SkipTest)):
                state["skipped"] = True
            elif state["bad"] is None:
                state["bad"] = "failed" if call.when == "call" else "error"
            yield

        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(self, session, exitstatus) -> None:
            passed = failed = errors = skipped = 0
            for item in self.items:
                state = self.states.get(item.nodeid)
                if state is None:
                    continue
                if state["bad"] == "failed":
                    failed += 1
                elif state["bad"] == "error":
                    errors += 1
                elif state["skipped"]:
                    skipped += 1
                elif state["ran"]:
                    passed += 1
            tampered = (self.foreign + _changed(self.snapshot))[:20]
            emit('"kind": "final", "runner": "pytest", "collected": %d, "passed": %d, "failed": %d, "errors": %d, '
                 '"skipped": %d, "exitstatus": %d, "tampered": [%s]'
                 % (_len(self.items), passed, failed, errors + self.collect_errors, skipped, exitstatus,
                    ", ".join(_quote(t) for t in tampered)))

    return pytest, EvolforgeVerdict()


def _run_prepared(initial, plugin, args: list) -> int:
    """pytest.main(args, plugins=[plugin]) on a Config whose plugin manager and default plugins were built from
    the same args before the fork (tasks/sandbox/worker.py): what pytest.main does after its get_config."""
    import pytest

    os.environ["PYTEST_VERSION"] = pytest.__version__
    manager = initial.pluginmanager
    try:
        manager.register(plugin)
        config = manager.hook.pytest_cmdline_parse(pluginmanager=manager, args=args)
    except BaseException:
        initial._ensure_unconfigure()
        raise
    try:
        return int(config.hook.pytest_cmdline_main(config=config))
    finally:
        config._ensure_unconfigure()


def main(argv: list, prepared=None) -> int:
    """`prepared`: the worker's pre-built pytest Config for exactly these options (None: pytest.main)."""
    nonce_fd, result_fd, runner, test_file, *options = argv
    emit = _writer(int(result_fd), _read_nonce(int(nonce_fd)))
    test_path = os.path.realpath(test_file)
    module_code: list = []
    _undumpable()
    if runner == "pytest":
        pytest, plugin = _pytest_plugin(emit, module_code, lambda: _guard(test_path, module_code))
        if prepared is not None:
            return _run_prepared(prepared, plugin, [*options, test_file])
        return int(pytest.main([*options, test_file], plugins=[plugin]))
    import runpy

    _guard(test_path, module_code)
    sys.argv = [test_file]
    runpy.run_path(test_file, run_name="__main__")  # an exception or SystemExit propagates: no record
    emit('"kind": "final", "runner": "script", "completed": true')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
