"""JavaScript (Node) in the sandbox: the same bubblewrap view, limits and two-process verdict as Python.

Each hostile case runs as untrusted JavaScript inside the sandbox and checks that the attempt failed or was
killed, that the result says why, and that the host is unharmed; each can fail (a right solution that attacks
must still pass where the attack is harmless to the verdict, a wrong one must fail). Warm workers (the default)
in the quick tier; one sandbox per check and rlimits-only in the full tier where they cost more.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.languages import LANGUAGES
from evolforge.tasks.sandbox.run import run_many, run_program, run_tests

REPO = Path(__file__).resolve().parents[3]
HAS_BWRAP = os.access("/usr/bin/bwrap", os.X_OK)
pytestmark = [
    pytest.mark.skipif(shutil.which("node") is None, reason="node (Node.js) is not on PATH: the JavaScript sandbox "
                       "needs it (apt-get install -y nodejs)"),
    pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap not installed (apt-get install -y bubblewrap)"),
]

GOOD = "function add(a, b) {\n  return a + b;\n}\n"
WRONG = "function add(a, b) {\n  return a - b;\n}\n"
TESTS = ("const assert = require('assert');\nconst { add } = require('./solution');\n"
         "assert.strictEqual(add(1, 2), 3);\nassert.strictEqual(add(0, 0), 0);\nassert.strictEqual(add(-2, 2), 0);\n")
FORGED = json.dumps({"nonce": "0" * 32, "kind": "final", "runner": "script", "completed": True, "ended_by": None,
                     "lost": None, "not_checkable": None})
FORGE_EVERY_FD = (  # every descriptor the process has, and the low ones in case /proc is not there
    "const __fs = require('fs');\nconst __fds = new Set([...Array(64).keys()]);\n"
    "try { for (const f of __fs.readdirSync('/proc/self/fd')) __fds.add(Number(f)); } catch (e) {}\n"
    f"for (const fd of __fds) {{ try {{ __fs.writeSync(fd, {json.dumps(FORGED + chr(10))}); }} catch (e) {{}} }}\n"
)


def _settings(**kw) -> SandboxSettings:
    base = dict(cpu_seconds=4, memory_mb=256, max_processes=32, wall_timeout_seconds=20, max_output_bytes=200_000,
                max_parallel=2)
    return SandboxSettings(**(base | kw))


def _run(solution: str, tests: str = TESTS, **kw):
    return run_tests(solution, tests, _settings(**kw), language="nodejs")


def _prog(code: str, stdin: str | None = None, **kw):
    return run_program(code, stdin, _settings(**kw), language="nodejs")


def _survivors(marker: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in ps.splitlines() if marker in line and "ps -eo" not in line]


# ---------------------------------------------------------------- the language table and plain use


def test_the_language_table_has_python_and_nodejs():
    assert {"python", "nodejs"} <= set(LANGUAGES)
    js = LANGUAGES["nodejs"]
    assert (js.solution_file, js.test_file, js.program_file) == ("solution.js", "test_solution.js", "main.js")
    assert LANGUAGES["python"].solution_file == "solution.py"


def test_a_missing_node_is_named_not_run():
    from evolforge.tasks.sandbox.languages import LanguageUnavailable

    with pytest.raises(LanguageUnavailable, match="sandbox.node"):
        run_tests(GOOD, TESTS, _settings(node="/nonexistent/bin/node"), language="nodejs")
    with pytest.raises(ValueError, match="unknown sandbox language"):
        run_program("", None, _settings(), language="cobol")


def test_a_right_solution_passes_and_a_wrong_one_fails():
    right, wrong = _run(GOOD), _run(WRONG)
    assert right.passed, (right.verdict_error, right.stderr[-2000:])
    assert right.runner == "script" and right.verdict_error is None
    assert not wrong.passed and "AssertionError" in wrong.stderr and wrong.verdict_error


def test_exports_data_errors_and_a_script_solution_cross():
    sol = ("class Bad extends Error {}\nfunction boom(x) { if (x < 0) throw new RangeError('negative: ' + x); "
           "return x; }\nfunction custom() { throw new Bad('mine'); }\n"
           "function shape() { return {a: [1, 2.5, 'x', null, true], b: {c: -0}, n: NaN, inf: -Infinity, u: undefined, "
           "big: 10n, s: new Set([1, 2]), m: new Map([['k', [3]]])}; }\nconst LIMIT = 7;\n"
           "module.exports = { boom, custom, shape, LIMIT };\n")
    tests = ("const assert = require('assert');\nconst sol = require('./solution');\n"
             "assert.throws(() => sol.boom(-1), { name: 'RangeError', message: 'negative: -1' });\n"
             "assert.throws(() => sol.boom(-1), RangeError);\n"
             "assert.throws(() => sol.custom(), { name: 'Error', message: 'mine' });\n"
             "assert.strictEqual(sol.LIMIT, 7);\nassert.strictEqual(typeof sol.boom, 'function');\n"
             "assert.deepStrictEqual(sol.shape(), {a: [1, 2.5, 'x', null, true], b: {c: -0}, n: NaN, inf: -Infinity, "
             "u: undefined, big: 10n, s: new Set([1, 2]), m: new Map([['k', [3]]])});\n"
             "assert.strictEqual(sol.missing, undefined);\n")
    r = _run(sol, tests)
    assert r.passed, (r.verdict_error, r.stderr[-2000:])


def test_a_function_the_test_passes_is_not_checkable():
    sol = "function apply(f, x) { return f(x); }\nmodule.exports = { apply };\n"
    tests = "const { apply } = require('./solution');\nrequire('assert').strictEqual(apply((x) => x + 1, 1), 2);\n"
    r = _run(sol, tests)
    assert not r.passed and r.not_checkable and "function" in r.not_checkable


def test_programs_read_stdin_and_are_judged_by_exit_status():
    reverse = ("const s = require('fs').readFileSync(0, 'utf8').trim();\n"
               "console.log(s.split('').reverse().join(''));\n")
    r = _prog(reverse, "abc\n")
    assert r.passed and r.stdout == "cba\n" and r.runner == "raw"
    failing = _prog("console.error('bad'); process.exit(3);\n")
    assert not failing.passed and failing.exit_code == 3 and "bad" in failing.stderr
    assert not _prog("syntax error here(\n").passed


# ---------------------------------------------------------------- hostile code


def test_network_is_unreachable():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    attack = (
        "const net = require('net'), dns = require('dns');\nconst out = {};\nlet left = 3;\n"
        "const done = (k, v) => { out[k] = v; if (--left === 0) console.log(JSON.stringify(out)); };\n"
        f"const a = net.connect({port}, '127.0.0.1', () => {{ a.write('stolen'); done('host', 'connected'); }});\n"
        "a.on('error', (e) => done('host', e.code));\n"
        "const b = net.connect(53, '1.1.1.1', () => done('outside', 'connected'));\n"
        "b.on('error', (e) => done('outside', e.code));\n"
        "dns.lookup('example.com', (e, addr) => done('dns', e ? e.code : addr));\n"
    )
    try:
        r = _prog(attack)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached the host listener
    finally:
        listener.close()
    assert r.passed, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert set(out) == {"host", "outside", "dns"} and "connected" not in out.values(), out


def test_host_files_keys_and_environment_are_not_readable(monkeypatch):
    monkeypatch.setenv("EVOLFORGE_API_KEY", "sk-test-secret")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    secret = REPO / f".evolforge-sbx-js-secret-{os.getpid()}"
    targets = [str(secret), "/proc/1/environ", f"{REPO}/pyproject.toml", "/etc/shadow", "/root/.ssh/id_rsa"]
    attack = (
        "const fs = require('fs');\nconst seen = {};\n"
        f"for (const p of {json.dumps(targets)}) {{ try {{ seen[p] = fs.readFileSync(p, 'utf8'); }} "
        "catch (e) { seen[p] = e.code; } }\n"
        "seen['/'] = fs.readdirSync('/').sort();\nseen.env = process.env;\n"
        "console.log(JSON.stringify(seen));\n"
    )
    try:
        secret.write_text("TOP-SECRET-VALUE")
        r = _prog(attack)
    finally:
        secret.unlink(missing_ok=True)
    assert r.passed, r.stderr[-2000:]
    assert "TOP-SECRET-VALUE" not in r.stdout and "sk-test-secret" not in r.stdout
    seen = json.loads(r.stdout)
    assert seen[str(secret)] == seen[f"{REPO}/pyproject.toml"] == seen["/etc/shadow"] == "ENOENT"
    assert seen["/root/.ssh/id_rsa"] in ("ENOENT", "EACCES")
    assert seen["/proc/1/environ"] == "EACCES"
    assert "work" not in seen["/"] and "home" not in seen["/"]
    assert "EVOLFORGE_API_KEY" not in seen["env"] and "OPENAI_API_KEY" not in seen["env"]


def test_cannot_write_outside_its_temp_folders():
    stamp = f"evolforge-sbx-js-pwned-{os.getpid()}"
    targets = [f"/{stamp}", f"/usr/{stamp}", f"/etc/{stamp}", f"/root/{stamp}", f"{REPO}/{stamp}",
               f"{sys.base_prefix}/{stamp}", f"/tmp/../{stamp}"]
    attack = (
        "const fs = require('fs');\nconst out = {};\n"
        f"for (const p of {json.dumps(targets)}.concat(['/sandbox/ok.txt', '/tmp/ok.txt'])) {{\n"
        "  try { fs.writeFileSync(p, 'x'); out[p] = 'written'; } catch (e) { out[p] = e.code; }\n}\n"
        "console.log(JSON.stringify(out));\n"
    )
    r = _prog(attack)
    assert r.passed, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out.pop("/sandbox/ok.txt") == out.pop("/tmp/ok.txt") == "written"
    assert all(v != "written" for v in out.values()), out
    for path in targets + [f"/tmp/{stamp}"]:
        assert not os.path.exists(path), path


def test_a_fork_bomb_hits_the_process_limit():
    marker = f"313.{os.getpid() % 10_000}"
    bomb = (  # bounded: at most 300 children, each sleeping
        "const { spawn } = require('child_process');\nlet made = 0, failed = '';\n"
        "for (let i = 0; i < 300; i++) {\n"
        f"  try {{ const c = spawn('/usr/bin/sleep', ['{marker}'], {{ detached: true, stdio: 'ignore' }});\n"
        "    c.on('error', (e) => { failed = e.code; }); made++; } catch (e) { failed = e.code; break; }\n}\n"
        "setTimeout(() => { console.log(JSON.stringify({made, failed})); process.exit(0); }, 500);\n"
    )
    before = len(os.listdir("/proc"))
    r = _prog(bomb, max_processes=32)
    assert "EAGAIN" in r.stdout + r.stderr, (r.stdout[-1000:], r.stderr[-1000:])
    time.sleep(0.2)
    assert _survivors(marker) == []
    assert len(os.listdir("/proc")) < before + 20
    assert subprocess.run(["true"]).returncode == 0


def test_an_infinite_loop_hits_the_cpu_limit():
    r = _run("while (true) {}\n", cpu_seconds=1, wall_timeout_seconds=20)
    assert not r.passed and r.killed_reason == "cpu_limit" and not r.timed_out, (r.killed_reason, r.stderr[-500:])


def test_sleeping_forever_hits_the_wall_timeout():
    sleeper = GOOD + "Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0);\n"
    r = _run(sleeper, wall_timeout_seconds=2)
    assert not r.passed and r.timed_out and r.killed_reason == "wall_timeout" and r.duration_s < 60


def test_printing_without_end_is_cut_off():
    # writeSync: the solution process never returns to node's event loop, so process.stdout.write would only queue
    flood = GOOD + "const chunk = 'x'.repeat(1 << 20);\nfor (let i = 0; i < 5 * 1024; i++) require('fs').writeSync(1, chunk);\n"
    r = _run(flood, max_output_bytes=200_000)
    assert not r.passed and r.killed_reason == "output_cap" and not r.timed_out
    assert len(r.stdout) + len(r.stderr) <= 200_000


def test_unbounded_memory_is_stopped():
    hog = "const hog = [];\nfor (let i = 0; i < 100000; i++) hog.push(new Array(1 << 20).fill(i));\n"
    r = _prog(hog, memory_mb=128)
    assert not r.passed and r.killed_reason == "memory", (r.killed_reason, r.stderr[-1000:])


def test_killing_the_parent_and_every_process_leaves_the_verdict_alone():
    attack = ("try { process.kill(process.ppid, 'SIGKILL'); } catch (e) {}\n"
              "try { process.kill(-1, 'SIGKILL'); } catch (e) {}\n")
    right, wrong = _run(GOOD + attack), _run(WRONG + attack)
    assert right.passed, (right.verdict_error, right.stderr[-2000:])
    assert not wrong.passed and "AssertionError" in wrong.stderr


def test_a_forged_record_on_every_fd_and_an_early_exit_fail():
    at_import = _run(WRONG + FORGE_EVERY_FD + "process.exit(0);\n")
    assert not at_import.passed and at_import.verdict_error
    in_call = ("function add(a, b) {\n" + FORGE_EVERY_FD + "  process.exit(0);\n}\n")
    r = _run(in_call)
    assert not r.passed and r.verdict_error, r.verdict_error
    caught = ("const { add } = require('./solution');\nlet got = null;\ntry { got = add(1, 2); } catch (e) { got = 3; }\n"
              "require('assert').strictEqual(got, 3);\n")  # a test that swallows the lost channel still fails
    swallowed = _run(in_call, caught)
    assert swallowed.exit_code == 0 and not swallowed.passed, swallowed.verdict_error  # the runner was content
    assert "solution process" in (swallowed.verdict_error or ""), swallowed.verdict_error
    garbage = _run(GOOD + FORGE_EVERY_FD)  # a right answer that writes into its channel to the runner too
    assert not garbage.passed and "protocol" in (garbage.verdict_error or ""), garbage.verdict_error
    # on its standard descriptors and the channel's read end only (node's own epoll and event descriptors crash it)
    beside = _run(GOOD + f"for (const fd of [0, 1, 2, 3]) {{ try {{ require('fs').writeSync(fd, {json.dumps(FORGED + chr(10))}); }} "
                  "catch (e) {} }\n")
    assert beside.passed, (beside.verdict_error, beside.stderr[-2000:])  # forged records there: never read
    assert FORGED in beside.stdout


def test_patching_assert_and_the_runtime_in_the_solution_changes_nothing():
    patch = ("const assert = require('assert');\n"
             "for (const k of Object.keys(assert)) { try { assert[k] = () => {}; } catch (e) {} }\n"
             "try { require('assert').strict.strictEqual = () => {}; } catch (e) {}\n"
             "Object.prototype.toJSON = function () { return 3; };\n"
             "process.exit = () => {}; process.on('exit', () => { process.exitCode = 0; });\n"
             "Error.prototype.toString = () => 'ok';\nglobalThis.require = () => ({});\n")
    r = _run(WRONG + patch)
    assert not r.passed and "AssertionError" in r.stderr, (r.verdict_error, r.stderr[-1500:])


def test_the_solution_sees_neither_the_tests_nor_the_runner():
    sol = ("const fs = require('fs');\nfunction look() { let procs = [];\n"
           "  try { procs = fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p)); } catch (e) {}\n"
           "  return { files: fs.readdirSync('/sandbox'), pid: process.pid, procs }; }\n")
    tests = ("const { look } = require('./solution');\n"
             "require('assert').deepStrictEqual(look(), { files: ['solution.js'], pid: 1, procs: ['1'] });\n")
    r = _run(sol, tests)
    assert r.passed, (r.verdict_error, r.stderr[-2000:])


def test_a_child_process_left_running_fails_a_right_answer():
    r = _run(GOOD + "require('child_process').spawn('/usr/bin/sleep', ['30'], { detached: true, stdio: 'ignore' });\n")
    assert not r.passed and "child process" in (r.verdict_error or ""), r.verdict_error


def test_the_next_check_on_the_worker_is_judged_right_after_attacks():
    results = run_many([(WRONG + FORGE_EVERY_FD + "process.exit(0);\n", TESTS), (GOOD, TESTS), (WRONG, TESTS)],
                       _settings(), language="nodejs")
    assert [r.passed for r in results] == [False, True, False]


# ---------------------------------------------------------------- the other paths and the service


@pytest.mark.slow("one bwrap sandbox per check and the unisolated rlimits-only mode (~6 s CPU)")
@pytest.mark.parametrize("update", [{"reuse_workers": False}, {"mode": "rlimits-only"}], ids=["per-check", "rlimits"])
def test_per_check_and_rlimits_only_paths_judge_alike(update):
    assert _run(GOOD, **update).passed
    assert not _run(WRONG, **update).passed
    assert not _run(WRONG + FORGE_EVERY_FD + "process.exit(0);\n", **update).passed
    assert _prog("console.log(require('fs').readFileSync(0, 'utf8').length)", "abcd", **update).stdout == "4\n"


def test_the_service_runs_nodejs_as_it_runs_python():
    from evolforge.tasks.sandbox.service import running_service

    with running_service(_settings(cpu_seconds=2, wall_timeout_seconds=5)) as url:
        ok = requests.post(url, json={"code": "console.log(require('fs').readFileSync(0, 'utf8').trim() + '!')",
                                      "stdin": "hi", "language": "nodejs"}, timeout=60).json()
        assert ok["status"] == "Success" and ok["run_result"]["stdout"] == "hi!\n", ok
        assert ok["run_result"]["status"] == "Finished" and ok["run_result"]["return_code"] == 0
        bad = requests.post(url, json={"code": "process.exit(2)", "language": "nodejs"}, timeout=60).json()
        assert bad["status"] == "Failed" and bad["run_result"]["return_code"] == 2
        slow = requests.post(url, json={"code": "while (true) {}", "language": "nodejs", "run_timeout": 1},
                             timeout=60).json()
        assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded", slow
        cpp = requests.post(url, json={"code": "int main(){}", "language": "cpp"}, timeout=60).json()
        assert cpp["status"] == "SandboxError"


# ---------------------------------------------------------------- a HumanEval-style set in JavaScript


def test_js_humaneval_canonical_solutions_pass_and_wrong_ones_fail():
    from evolforge.tasks.sandbox.humaneval import check_script_js
    from evolforge.testing.js_humaneval import PROBLEMS

    assert len(PROBLEMS) >= 10
    jobs = []
    for p in PROBLEMS:
        script = check_script_js(p["test"], p["entry_point"])
        jobs += [(p["prompt"] + p["canonical_solution"], script), (p["prompt"] + p["wrong"], script)]
    results = run_many(jobs, _settings(), language="nodejs")
    for p, right, wrong in zip(PROBLEMS, results[::2], results[1::2]):
        assert right.passed, (p["task_id"], right.verdict_error, right.stderr[-1500:])
        assert not wrong.passed and "AssertionError" in wrong.stderr, (p["task_id"], wrong.verdict_error)
