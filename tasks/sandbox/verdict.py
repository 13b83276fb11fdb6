"""The host's judgement of a test run: the runner's result channel and the solution process's state.

Helpers of tasks/sandbox/pool.py and run.py. A check is two processes (tasks/sandbox/bridge.py): the runner
runs the tests and writes ONE final record, a JSON line carrying the run's nonce, to a pipe only it holds
(tasks/sandbox/harness.py); the solution process, which only answers calls over two pipes, holds no
descriptor of it. `judge` reads everything that arrived on that pipe plus what the worker (or the host, in
rlimits-only mode) saw of the solution process when the runner ended. Any deviation fails the run:

- nothing arrived, or more than one record, or a line that is not JSON, or an unterminated line;
- any line without the run's nonce;
- a record of the wrong runner, with a missing, extra or mistyped field;
- the channel's state: `not_checkable` (the test passed or compared something the channel cannot carry:
  reported as such, so synthesis can tell it from a wrong solution) or `lost` (the solution process ended,
  hung up, broke the protocol or wrote outside a call);
- pytest: exit status != 0, no test collected, passed != collected, any failure or error, fewer tests
  collected than the test file declares (`declared_tests`: deselected or hidden tests);
- script: the record does not say the script ran to its end;
- the solution process was not alive when the runner ended (it exited or was killed, whatever its status),
  or had more than one thread, or a child process.

`declared_tests` counts what the host can see in the test file's AST: top-level `def test*` and
`test*` methods of top-level `class Test*` and of unittest.TestCase classes, each name once, fixtures excluded. Parametrized tests
collect more items than that, never fewer.
"""

from __future__ import annotations

import ast
import json
import secrets
from dataclasses import dataclass

PYTEST_FIELDS = {"collected", "passed", "failed", "errors", "skipped", "exitstatus"}
_CHANNEL_KEYS = {"lost", "not_checkable"}
_PYTEST_KEYS = {"nonce", "kind", "runner"} | _CHANNEL_KEYS | PYTEST_FIELDS
_SCRIPT_KEYS = {"nonce", "kind", "runner", "completed", "ended_by"} | _CHANNEL_KEYS
_SOLUTION_KEYS = {"alive", "status", "threads", "children"}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    error: str | None = None  # why the run does not pass, as far as the channel tells
    tests_passed: int | None = None  # pytest: from the record (None for scripts or without a valid record)
    tests_failed: int | None = None  # failed + errors
    not_checkable: str | None = None  # the runner's reason when the tests cannot be checked through the channel


def _is_fixture(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "fixture":
            return True
    return False


def _tests_in(body: list[ast.stmt]) -> set[str]:
    return {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name.startswith("test") and not _is_fixture(n)}


_TESTCASE_BASES = {"TestCase", "IsolatedAsyncioTestCase"}


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def unittest_classes(tree: ast.Module) -> set[str]:
    """Top-level classes deriving from unittest's TestCase (directly, or from such a class of the file)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(_base_name(b) in _TESTCASE_BASES or _base_name(b) in found
                                                  for b in node.bases):
            found.add(node.name)
    return found


def declared_tests(test_code: str) -> int:
    """Lower bound of the tests pytest must collect from `test_code` (0 when it does not parse): top-level test
    functions, test methods of `Test*` classes and of unittest.TestCase classes (whatever their name)."""
    try:
        tree = ast.parse(test_code)
    except (SyntaxError, ValueError):
        return 0
    count = len(_tests_in(tree.body))
    cases = unittest_classes(tree)
    classes: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and (node.name.startswith("Test") or node.name in cases):
            classes[node.name] = len(_tests_in(node.body))  # a redefined class replaces the earlier one
    return count + sum(classes.values())


def _records(raw: bytes, nonce: str) -> tuple[list[dict], str | None]:
    if not raw:
        return [], "no result record: the run ended before the harness reported (early exit, crash or kill)"
    lines = raw.split(b"\n")
    if lines[-1]:
        return [], "incomplete line on the result channel"
    records = []
    for line in lines[:-1]:
        try:
            rec = json.loads(line)
        except ValueError:
            return [], "malformed line on the result channel (not a JSON record with the run's nonce)"
        nonce_seen = rec.get("nonce") if isinstance(rec, dict) else None
        if not isinstance(nonce_seen, str) or not secrets.compare_digest(nonce_seen.encode(), nonce.encode()):
            return [], "a line without the run's nonce on the result channel (forged by the code under test)"
        records.append(rec)
    if len(records) != 1:
        return [], f"{len(records)} records on the result channel, expected exactly one"
    return records, None


def _int_fields(rec: dict, keys: set[str]) -> bool:
    return all(type(rec.get(k)) is int and rec[k] >= 0 for k in keys)


def solution_state_ok(state) -> bool:
    """The shape of the solution process's state as the worker reports it (None for raw runs)."""
    return state is None or (isinstance(state, dict) and set(state) == _SOLUTION_KEYS
                             and type(state["alive"]) is bool and type(state["threads"]) is int
                             and type(state["children"]) is int
                             and (state["status"] is None or type(state["status"]) is int))


def judge_solution(state: dict | None, one_thread: bool = True) -> str | None:
    """Why the solution process's state when the runner ended fails the run (None: it does not). `one_thread`
    False: its thread count is not judged (node always runs V8's and libuv's threads beside the JavaScript one)."""
    if state is None:
        return "the solution process was never seen"
    if not state["alive"]:
        status = state["status"]
        how = f"exit status {status}" if status is not None and status < 128 else \
            f"signal {status - 128}" if status is not None else "unknown status"
        return f"the solution process ended before the tests were done ({how})"
    if one_thread and state["threads"] > 1:
        return f"the solution left {state['threads'] - 1} thread(s) running after its calls returned"
    if state["children"]:
        return f"the solution left {state['children']} child process(es) running"
    return None


def _channel_fields(rec: dict) -> bool:
    return all(rec.get(k) is None or isinstance(rec.get(k), str) for k in _CHANNEL_KEYS)


def judge(raw: bytes, nonce: str, runner: str, declared: int, solution: dict | None = None,
          check_solution: bool = True, one_thread: bool = True) -> Verdict:
    """Read everything the result channel delivered; ok only for exactly one final record that passes, and a
    solution process that was still alive, with one thread and no child, when the runner ended."""
    records, error = _records(raw, nonce)
    if error:
        return Verdict(False, error)
    rec = records[0]
    if rec.get("kind") != "final":
        return Verdict(False, f"the record is not a final record (kind {rec.get('kind')!r})")
    if rec.get("runner") != runner:
        return Verdict(False, f"the record is of runner {rec.get('runner')!r}, expected {runner!r}")
    if runner == "script":
        if set(rec) != _SCRIPT_KEYS or type(rec.get("completed")) is not bool or not _channel_fields(rec) \
                or not (rec["ended_by"] is None or isinstance(rec["ended_by"], str)):
            return Verdict(False, "malformed script record")
        counts = {}
    else:
        if set(rec) != _PYTEST_KEYS or not _int_fields(rec, PYTEST_FIELDS) or not _channel_fields(rec):
            return Verdict(False, "malformed pytest record")
        counts = {"tests_passed": rec["passed"], "tests_failed": rec["failed"] + rec["errors"]}
    if rec["not_checkable"]:
        return Verdict(False, "not checkable: " + rec["not_checkable"], not_checkable=rec["not_checkable"], **counts)
    if rec["lost"]:
        return Verdict(False, rec["lost"], **counts)
    if runner == "script":
        if not rec["completed"]:
            return Verdict(False, f"the test script did not run to its end ({rec['ended_by']})")
    else:
        n, passed, failed, errors = rec["collected"], rec["passed"], rec["failed"], rec["errors"]
        if rec["exitstatus"] != 0:
            return Verdict(False, f"pytest exit status {rec['exitstatus']}", **counts)
        if n == 0:
            return Verdict(False, "no tests collected", **counts)
        if failed or errors:
            return Verdict(False, f"{failed} failed, {errors} errors", **counts)
        if passed != n:
            return Verdict(False, f"passed {passed} of {n} collected tests ({rec['skipped']} skipped)", **counts)
        if n < declared:
            return Verdict(False, f"collected {n} tests but the test file declares {declared}", **counts)
    if check_solution:
        why = judge_solution(solution, one_thread)
        if why:
            return Verdict(False, why, **counts)
    return Verdict(True, None, **counts)
