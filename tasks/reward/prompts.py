"""Every prompt of the reward-model data stage, in one file (change a reward prompt here).

- RANK:        the IRM judge ranks an instruction's versions on definition, precision and integrity (JSON).
- STEP_LABELS: the PRM judge labels each step of a step-by-step answer correct or incorrect (JSON).
- SCORE:       DeCoRL: the judge scores a whole answer, or the answer with one step removed, 0-10 (JSON).
- CONTINUE:    Math-Shepherd: complete a solution from a step prefix, ending with 'The answer is: ...'.
- STRICT_STEPS: the one re-ask of an answer that was not in 'Step 1: ... Step 2: ...' form.
The versions themselves are written with the Evol-Instruct prompts (tasks/evolve/prompts.py). The fixed
instruction-rating prompt that IRM pairs carry as `prompt` is `reward.irm_prompt` in the config.
"""

from __future__ import annotations

import json

# Markers: a substring each prompt contains (the templates below are built from them, so they cannot drift apart);
# the scripted test server (testing/scripted_server.py) recognises a reward prompt by them.
MARKER_RANK = "Rank these instructions for an AI assistant"  # RANK starts with it
MARKER_STEP_LABELS = "You are checking a step-by-step solution."
MARKER_SCORE = "Score the solution to the problem"
MARKER_CONTINUE = "#Solution so far#"
SOLUTION_HEADING = "#Solution#"  # STEP_LABELS and SCORE: the steps follow it, up to the next blank line

RANK = (
    MARKER_RANK + " from best to worst on definition (a clear task: what to do and "
    "what the result should be), precision (specific and unambiguous, with concrete details and constraints) and "
    "integrity (complete, self-consistent and answerable).\n\n"
    "{versions}\n\n"
    "Answer as JSON with all {n} labels {label_list} in your order, best first{scores_ask}: {example}"
)

STEP_LABELS = (
    MARKER_STEP_LABELS + " For each step decide whether it is correct (right reasoning, "
    "right calculation, and it moves the solution forward) or incorrect.\n\n"
    "#Problem#\n{problem}\n\n" + SOLUTION_HEADING + "\n{solution}\n\n"
    "The solution has {n} steps. Reply with JSON only: {{\"labels\": [true or false for each of the {n} steps, in order]}}.\n"
    "The form for {n} steps (your values will differ): {example}"
)

SCORE = (
    MARKER_SCORE + " from 0 (wrong or useless) to 10 (correct, complete and clear).\n\n"
    "#Problem#\n{problem}\n\n" + SOLUTION_HEADING + "\n{solution}\n\n"
    "Reply with JSON only: {{\"score\": a number from 0 to 10}}"
)

CONTINUE = (
    "Solve the problem. The first steps of the solution are given: continue from them with the next steps in the "
    "same 'Step N: ...' form and end with a line 'The answer is: ...'.\n\n"
    "#Problem#\n{problem}\n\n" + MARKER_CONTINUE + "\n{prefix}\n"
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


def rank_messages(labelled: list[tuple[str, str]], ask_scores: bool = True) -> list[dict]:
    """The example reply has exactly this prompt's labels (rotated): a weak judge that copies the form still
    returns a permutation, and since the presentation order is shuffled per instruction, copying is noise, not
    a bias toward the original or the evolved versions."""
    labels = [label for label, _ in labelled]
    order = labels[1:] + labels[:1]
    example: dict = {"ranking": order}
    if ask_scores:
        example["scores"] = {label: max(1, 8 - 2 * order.index(label)) for label in labels}
    text = RANK.format(versions="\n".join(f"[{label}] {t}" for label, t in labelled), n=len(labels),
                       label_list=", ".join(labels),
                       scores_ask=", and a quality score from 0 to 10 for each" if ask_scores else "",
                       example=json.dumps(example))
    return [{"role": "user", "content": text}]


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
