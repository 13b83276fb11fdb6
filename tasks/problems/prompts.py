"""What the policy is asked: one prompt per record, byte-identical at SFT, PPO and eval.

    ANSWER_STEPS / ANSWER_PLAIN   the answer prompt around an instruction (the evolve stage's answer model uses it
                                  too, so the SFT data's answers were written to the prompt the policy then sees)
    SOLVE_CODE                    the solver prompt of a code task (the synthesis stage's solver asks the same)
    answer_messages(text, steps)  the chat messages of the answer prompt
    code_messages(entry, text)    the chat messages of the solver prompt
    task_messages(kind, text, entry_point)  the prompt of a record: code -> solver prompt, else the step prompt
"""

from __future__ import annotations

MARKER_SOLVE_CODE = "Solve this Python programming task."

ANSWER_STEPS = (
    "Answer the following instruction. Reason step by step and write every step on its own line as "
    "'Step 1: ...', 'Step 2: ...', and so on; end with 'The answer is: ...' when there is a final answer.\n\n"
    "{instruction}"
)

ANSWER_PLAIN = "{instruction}"

SOLVE_CODE = (
    MARKER_SOLVE_CODE + " Reply with the complete code of solution.py (the function `{entry_point}` "
    "and anything it needs) in one ```python code block.\n\n{statement}"
)


def answer_messages(instruction: str, in_steps: bool) -> list[dict]:
    tpl = ANSWER_STEPS if in_steps else ANSWER_PLAIN
    return [{"role": "user", "content": tpl.format(instruction=instruction)}]


def code_messages(entry_point: str, statement: str) -> list[dict]:
    return [{"role": "user", "content": SOLVE_CODE.format(entry_point=entry_point, statement=statement)}]


def task_messages(kind: str | None, statement: str, entry_point: str | None = None,
                  in_steps: bool = True) -> list[dict]:
    """The policy's prompt for one record: a code task (with an entry point) gets the solver prompt, anything else
    the answer prompt around its statement (stripped)."""
    text = (statement or "").strip()
    if kind == "code" and (entry_point or "").strip():
        return code_messages(entry_point, text)
    return answer_messages(text, in_steps)
