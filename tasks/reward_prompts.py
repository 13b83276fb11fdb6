"""Every prompt of the reward-model data stage, in one file (change a reward prompt here).

- RANK:        the IRM judge ranks an instruction's versions on definition, precision and integrity (JSON).
- STEP_LABELS: the PRM judge labels each step of a step-by-step answer correct or incorrect (JSON).
- SCORE:       DeCoRL: the judge scores a whole answer, or the answer with one step removed, 0-10 (JSON).
- CONTINUE:    Math-Shepherd: complete a solution from a step prefix, ending with 'The answer is: ...'.
- STRICT_STEPS: the one re-ask of an answer that was not in 'Step 1: ... Step 2: ...' form.
The versions themselves are written with the Evol-Instruct prompts (tasks/prompts.py). The fixed
instruction-rating prompt that IRM pairs carry as `prompt` is `reward.irm_prompt` in the config.
"""

from __future__ import annotations

import json

RANK = (
    "You are judging instructions written to train an AI assistant. Rank the versions below from best to worst "
    "on three criteria:\n"
    "- definition: the task is clearly defined (what to do, what the result should be);\n"
    "- precision: it is specific and unambiguous, with concrete details and constraints;\n"
    "- integrity: it is complete, self-consistent and can be answered.\n\n"
    "#Versions#\n{versions}\n\n"
    "Reply with JSON only: {{\"ranking\": [every label exactly once, best first], "
    "\"scores\": {{label: quality from 0 to 10}}}}.\n"
    "The form (your order and scores will differ): {example}"
)

STEP_LABELS = (
    "You are checking a step-by-step solution. For each step decide whether it is correct (right reasoning, "
    "right calculation, and it moves the solution forward) or incorrect.\n\n"
    "#Problem#\n{problem}\n\n#Solution#\n{solution}\n\n"
    "The solution has {n} steps. Reply with JSON only: {{\"labels\": [true or false for each of the {n} steps, in order]}}.\n"
    "The form for {n} steps (your values will differ): {example}"
)

SCORE = (
    "Score the solution to the problem from 0 (wrong or useless) to 10 (correct, complete and clear).\n\n"
    "#Problem#\n{problem}\n\n#Solution#\n{solution}\n\n"
    "Reply with JSON only: {{\"score\": a number from 0 to 10}}"
)

CONTINUE = (
    "Solve the problem. The first steps of the solution are given: continue from them with the next steps in the "
    "same 'Step N: ...' form and end with a line 'The answer is: ...'.\n\n"
    "#Problem#\n{problem}\n\n#Solution so far#\n{prefix}\n"
)

STRICT_STEPS = (
    "Answer the problem below as numbered steps. Strict format: every step on its own line starting with "
    "'Step 1:', 'Step 2:', and so on (at least two steps), then a last line 'The answer is: ...'. "
    "Write nothing before 'Step 1:'.\n\n#Problem#\n{problem}"
)


def labels_for(n: int) -> list[str]:
    """Presentation labels of n versions: A, B, C, ..."""
    return [chr(ord("A") + i) for i in range(n)]


def format_steps(steps: list[str]) -> str:
    return "\n".join(f"Step {i}: {s}" for i, s in enumerate(steps, 1))


def rank_messages(labelled: list[tuple[str, str]]) -> list[dict]:
    """The example reply has exactly this prompt's labels (reversed): a weak judge that copies the form still
    returns a permutation, and since the presentation order is shuffled per instruction, copying is noise, not
    a bias toward the original or the evolved versions."""
    versions = "\n".join(f"[{label}] {text}" for label, text in labelled)
    order = [label for label, _ in reversed(labelled)]
    scores = {label: max(1, 8 - 2 * i) for i, label in enumerate(order)}
    example = json.dumps({"ranking": order, "scores": dict(sorted(scores.items()))})
    return [{"role": "user", "content": RANK.format(versions=versions, example=example)}]


def step_label_messages(problem: str, steps: list[str]) -> list[dict]:
    """The example reply has exactly one value per step (alternating), so the count is never in doubt."""
    example = json.dumps({"labels": [i % 2 == 0 for i in range(len(steps))]})
    text = STEP_LABELS.format(problem=problem, solution=format_steps(steps), n=len(steps), example=example)
    return [{"role": "user", "content": text}]


def score_messages(problem: str, steps: list[str]) -> list[dict]:
    return [{"role": "user", "content": SCORE.format(problem=problem, solution=format_steps(steps))}]


def continue_messages(problem: str, prefix_steps: list[str]) -> list[dict]:
    return [{"role": "user", "content": CONTINUE.format(problem=problem, prefix=format_steps(prefix_steps))}]


def strict_steps_messages(problem: str) -> list[dict]:
    return [{"role": "user", "content": STRICT_STEPS.format(problem=problem)}]
