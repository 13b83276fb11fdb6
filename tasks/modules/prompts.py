"""Every prompt of the module-DAG stage, in one file (change a module prompt here).

- MODULE: one module's call. First line `### evolforge module: ID (output: TYPE)` (the marker the scripted server
  answers by), the role, the question, each dependency's output as a trace line, and the JSON form to reply in.
- REASK: DSPy-style re-ask of a reply that failed the schema: the reply stays in the conversation, and the next
  user turn (same marker line) quotes the validation error and the form again.
- JUDGE: the contribution judge scores one answer 0-10 (JSON); first line `### evolforge module-judge`.
- SINGLE_SHOT: the baseline of the comparison (`modules.compare`): the question in one plain call, "answer step
  by step" (judged with JUDGE, the same template as the graph's answer).

A module's output appears to its dependants and in the judge's trace as one line:
  `[ID] (TYPE) CONTENT`, or `[ID] [module ID removed]` (ablated), or `[ID] [module ID failed: REASON]`.
"""

from __future__ import annotations

import json

from evolforge.tasks.modules.schema import CONTENT_FORM

# Markers: substrings the prompts contain (the templates below are built from them, so they cannot drift apart);
# the scripted test server (testing/scripted_server.py) recognises and reads a module-stage prompt by them.
MARKER_MODULE = "### evolforge module:"  # first line of a module call and of its re-ask: `MARKER ID (output: TYPE)`
MARKER_MODULE_JUDGE = "### evolforge module-judge"  # first line of the judge prompt
MARKER_MODULE_TRACE = "Module trace:"  # the integrate aggregation's answer (tasks/modules/run.py) has it, a single-shot one not
MARKER_DEPENDENCIES = "Your dependencies:"  # module and re-ask prompts: `MARKER a, b` or `MARKER none`
MARKER_QUESTION = "#Question#"  # the judge prompt: the question follows it, then MARKER_ANSWER ... MARKER_ANSWER_END
MARKER_ANSWER = "#Answer#"
MARKER_ANSWER_END = "#End of answer#"
MODULE_MARKER, JUDGE_MARKER = MARKER_MODULE, MARKER_MODULE_JUDGE  # the earlier names
REMOVED = "[module {id} removed]"

MODULE = (
    "{marker} {id} (output: {type})\n"
    "You are the \"{id}\" module of a reasoning system in which several modules work on one question. {role}\n\n"
    "#Question#\n{question}\n\n"
    "#Inputs from other modules#\n{inputs}\n\n"
    + MARKER_DEPENDENCIES + " {deps}\n"
    "{form}"
)

FORM = (
    "Reply with one JSON object only, no other text, in this form:\n"
    '{{"type": "{type}", "content": {content}, "confidence": <a number from 0 to 1>, '
    '"dependencies": [<the ids of the inputs you used, from: {deps}>]}}'
)

REASK = (
    "{marker} {id} (output: {type})\n"
    "Your reply was not valid: {error}\n"
    + MARKER_DEPENDENCIES + " {deps}\n"
    "{form}"
)

JUDGE = (
    "{marker}\n"
    "Score the answer to the question from 0 (wrong or useless) to 10 (correct, complete and clear).\n{how}\n\n"
    + MARKER_QUESTION + "\n{question}\n\n"
    + MARKER_ANSWER + "\n{answer}\n" + MARKER_ANSWER_END + "\n\n"
    'Reply with JSON only: {{"score": a number from 0 to 10}}'
)

JUDGE_HOW = {
    "integrate": "The answer is a final answer followed by the module outputs that reasoned toward it, one per line; "
                 "a module shown as [module X removed] was left out. Judge the final answer and its reasoning together.",
    "concat": "The answer is the reasoning modules' outputs in order, the final answer last; a module shown as "
              "[module X removed] was left out. Judge the whole.",
}


SINGLE_SHOT = (
    "Answer the question below. Think step by step, then state the final answer.\n\n"
    "#Question#\n{question}"
)


def content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, float) and content.is_integer():
        return str(int(content))
    return json.dumps(content, ensure_ascii=False)


def trace_line(module_id: str, output_type: str, content: object) -> str:
    return f"[{module_id}] ({output_type}) {content_text(content)}"


def removed_line(module_id: str) -> str:
    return f"[{module_id}] " + REMOVED.format(id=module_id)


def failed_line(module_id: str, reason: str | None) -> str:
    return f"[{module_id}] [module {module_id} failed: {(reason or 'no valid output')[:160]}]"


def _form(output_type: str, deps: list[str]) -> str:
    return FORM.format(type=output_type, content=CONTENT_FORM[output_type], deps=", ".join(deps) or "none")


def module_messages(module_id: str, role: str, output_type: str, question: str, deps: list[str],
                    inputs: dict[str, str]) -> list[dict]:
    """`inputs`: each dependency's trace line (its output, or its removed / failed marker)."""
    text = MODULE.format(marker=MODULE_MARKER, id=module_id, type=output_type, role=role.strip(), question=question,
                         inputs="\n".join(inputs[d] for d in deps) or "(none: this module reads the question only)",
                         deps=", ".join(deps) or "none", form=_form(output_type, deps))
    return [{"role": "user", "content": text}]


def reask_messages(messages: list[dict], reply: str, module_id: str, output_type: str, deps: list[str],
                   error: str) -> list[dict]:
    text = REASK.format(marker=MODULE_MARKER, id=module_id, type=output_type, error=error,
                        deps=", ".join(deps) or "none", form=_form(output_type, deps))
    return [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": text}]


def judge_messages(question: str, answer: str, aggregation: str) -> list[dict]:
    return [{"role": "user", "content": JUDGE.format(marker=JUDGE_MARKER, how=JUDGE_HOW[aggregation],
                                                     question=question, answer=answer)}]


def single_shot_messages(question: str) -> list[dict]:
    return [{"role": "user", "content": SINGLE_SHOT.format(question=question)}]
