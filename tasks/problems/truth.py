"""The ground truth of a record: what a policy's answer is checked against.

    number_text(value)        a verified number as text: 12.0 -> "12", 0.75 -> "0.75"
    ground_truth_of(answer, domain)  the final answer an evolved math record states (tasks/text/answers.py), else ""
    task_ground_truth(task)   (source, ground truth) of a kept synthesized task: synthesis_math (its verified answer
                              evaluated to a number) or synthesis_code (JSON {entry_point, tests}); None without one
    math_truth(task)          a kept math task's verified answer as number text, or None
"""

from __future__ import annotations

import json

from evolforge.tasks.text.answers import extract_answer
from evolforge.tasks.text.checks import eval_number


def number_text(value: float) -> str:
    """A verified number as a ground-truth string: 12.0 -> "12", 0.75 -> "0.75"."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else format(value, ".12g")


def ground_truth_of(answer: str | None, domain: str | None) -> str:
    """The reference answer of a math record (its final answer, tasks/text/answers.py), else ""."""
    if domain != "math" or not answer:
        return ""
    return extract_answer(answer) or ""


def math_truth(task: dict) -> str | None:
    value = eval_number(str(task.get("answer") or ""))
    return number_text(value) if value is not None else None


def task_ground_truth(task: dict) -> tuple[str, str] | None:
    """(source, ground truth) of a kept synthesized task, or None when it has nothing to check against."""
    if task.get("kind") == "math":
        truth = math_truth(task)
        return ("synthesis_math", truth) if truth is not None else None
    if task.get("kind") == "code" and (task.get("tests") or "").strip() and (task.get("entry_point") or "").strip():
        return "synthesis_code", json.dumps({"entry_point": task["entry_point"], "tests": task["tests"]})
    return None
