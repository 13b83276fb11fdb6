"""Prompts of verified task synthesis (propose, repair code and math, solve), in one file.

The code solver's prompt is the policy's code prompt (SOLVE_CODE, tasks/problems/prompts.py), re-exported here.
"""

from __future__ import annotations

from evolforge.tasks.problems.prompts import MARKER_SOLVE_CODE as MARKER_SOLVE_CODE
from evolforge.tasks.problems.prompts import SOLVE_CODE as SOLVE_CODE

# Markers: the sentence each prompt starts with (the templates below are built from them, so they cannot drift
# apart); the scripted test server (testing/scripted_server.py) recognises a synthesis prompt by them.
MARKER_PROPOSE_CODE = "You write verifiable Python programming tasks."
MARKER_REPAIR_CODE = "A synthesized Python task failed its own tests."
MARKER_PROPOSE_MATH = "You write math word problems with a single numeric answer."
MARKER_SOLVE_MATH = "Solve the following problem step by step,"
MARKER_REPAIR_MATH = "A synthesized math word problem failed its solver check."

PROPOSE_CODE = (
    MARKER_PROPOSE_CODE + " Inspired by the instruction below, write ONE self-contained task "
    "whose solution is a single Python function.\n"
    "Reply with a JSON object only, with these keys:\n"
    '  "statement": the task for a programmer (what the function takes and returns, with an example),\n'
    '  "entry_point": the function name,\n'
    '  "solution": a correct reference implementation (complete Python code defining the function),\n'
    '  "tests": pytest tests (complete Python code) that start with `from solution import <entry_point>` and assert '
    "on at least 4 inputs, edge cases included.\n\n"
    "Instruction: {instruction}"
)

REPAIR_CODE = (
    MARKER_REPAIR_CODE + " Fix the reference solution OR the tests (whichever is wrong) so "
    "that a correct implementation of the statement passes.\n\n"
    "Statement:\n{statement}\n\nReference solution (solution.py):\n```python\n{solution}\n```\n\n"
    "Tests (test_solution.py):\n```python\n{tests}\n```\n\nFailing output:\n```\n{failure}\n```\n\n"
    'Reply with a JSON object only: {{"fixed": "solution" or "tests" or "both", "solution": "...", "tests": "...", '
    '"explanation": "one sentence"}}'
)

PROPOSE_MATH = (
    MARKER_PROPOSE_MATH + " Inspired by the instruction below, write ONE "
    "grade-school math word problem and solve it step by step.\n"
    'Reply with a JSON object only: {{"problem": "...", "steps": ["Step 1: ...", "Step 2: ..."], '
    '"answer": "the final answer as a number or an arithmetic expression, e.g. 42 or 3/4"}}\n\n'
    "Instruction: {instruction}"
)

REPAIR_MATH = (
    MARKER_REPAIR_MATH + " Independent solvers did not reach the reference answer. Fix the "
    "problem (if it is ambiguous or missing a fact) OR the reference answer (if it is wrong), so that the problem has "
    "exactly one correct numeric answer and the reference states it.\n\n"
    "Problem:\n{problem}\n\nReference solution steps:\n{steps}\n\nReference answer: {answer}\n\n"
    "Solvers' final answers: {answers}\n\nWhat failed: {failure}\n\n"
    'Reply with a JSON object only: {{"fixed": "problem" or "answer" or "both", "problem": "...", '
    '"answer": "the final answer as a number or an arithmetic expression", "explanation": "one sentence"}}'
)

SOLVE_MATH = (
    MARKER_SOLVE_MATH + " each step on its own line as 'Step 1: ...', 'Step 2: ...', and end "
    "with the line 'The answer is: <number>'.\n\n{problem}"
)


def msg(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]
