"""The host's side of the sandbox's result channel: what a run must report to pass.

Helpers of tasks/sandbox/run.py. The harness inside the sandbox (tasks/sandbox/harness.py) writes ONE
final record, a JSON line carrying the run's nonce, to a pipe only it was told about; `judge` reads
everything that arrived on that pipe and decides. Any deviation fails the run:

- nothing arrived, or more than one record, or a line that is not JSON, or an unterminated line;
- any line without the run's nonce (the code under test cannot know it, so such a line is forged);
- a record of the wrong runner, with a missing, extra or non-integer field;
- pytest: exit status != 0, no test collected, passed != collected, any failure or error, fewer tests
  collected than the test file declares (`declared_tests`: deselected or hidden tests), a collected
  test whose code is not the test file's, or pytest internals changed while the tests ran;
- script: the record does not say the script ran to its end.

`declared_tests` counts what the host can see in the test file's AST: top-level `def test*` and
`test*` methods of top-level `class Test*`, each name once, fixtures excluded. Parametrized tests
collect more items than that, never fewer.
"""

from __future__ import annotations

import ast
import json
import secrets
from dataclasses import dataclass

PYTEST_FIELDS = {"collected", "passed", "failed", "errors", "skipped", "exitstatus"}
_PYTEST_KEYS = {"nonce", "kind", "runner", "tampered"} | PYTEST_FIELDS
_SCRIPT_KEYS = {"nonce", "kind", "runner", "completed"}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    error: str | None = None  # why the run does not pass, as far as the channel tells
    tests_passed: int | None = None  # pytest: from the record (None for scripts or without a valid record)
    tests_failed: int | None = None  # failed + errors


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


def declared_tests(test_code: str) -> int:
    """Lower bound of the tests pytest must collect from `test_code` (0 when it does not parse)."""
    try:
        tree = ast.parse(test_code)
    except (SyntaxError, ValueError):
        return 0
    count = len(_tests_in(tree.body))
    classes: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
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


def judge(raw: bytes, nonce: str, runner: str, declared: int) -> Verdict:
    """Read everything the result channel delivered; ok only for exactly one final record that passes."""
    records, error = _records(raw, nonce)
    if error:
        return Verdict(False, error)
    rec = records[0]
    if rec.get("kind") != "final":
        return Verdict(False, f"the record is not a final record (kind {rec.get('kind')!r})")
    if rec.get("runner") != runner:
        return Verdict(False, f"the record is of runner {rec.get('runner')!r}, expected {runner!r}")
    if runner == "script":
        if set(rec) != _SCRIPT_KEYS or rec.get("completed") is not True:
            return Verdict(False, "malformed script record: the test script did not report that it ran to its end")
        return Verdict(True)
    tampered = rec.get("tampered")
    if set(rec) != _PYTEST_KEYS or not _int_fields(rec, PYTEST_FIELDS) or not isinstance(tampered, list) \
            or not all(isinstance(t, str) for t in tampered):
        return Verdict(False, "malformed pytest record")
    n, passed, failed, errors = rec["collected"], rec["passed"], rec["failed"], rec["errors"]
    counts = {"tests_passed": passed, "tests_failed": failed + errors}
    if tampered:
        return Verdict(False, "the tests did not run as written: " + "; ".join(tampered[:5]), **counts)
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
    return Verdict(True, None, **counts)
