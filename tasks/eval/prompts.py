"""Every prompt template of the evaluation, in one file (change a prompt here), and how a completion is checked.

    WIZARDMATH_COT      WizardMath's published chain-of-thought prompt (Alpaca form, "Let's think step by step.")
    evolforge_steps     the step-by-step answer prompt the SFT and PPO data use (tasks/problems/prompts.py)
    HumanEval completion  the problem's own prompt, continued as raw text and cut at Codex's stop sequences
                        (Chen et al. 2021: "\\nclass", "\\ndef", "\\n#", "\\nif", "\\nprint")
    HumanEval instruct  a chat message asking for the whole function in a python block (a chat endpoint)
    own code tasks      the solver prompt of SFT and PPO (tasks/problems/prompts.py SOLVE_CODE)

A prompt is {"raw": text} (a local policy continues it as it is) or {"chat": messages} (the chat template, or an
endpoint's chat API). `stop` sequences cut the completion after generation.

    prompt_for(problem, cfg, chat_only)   the prompt of a problem
    sandbox_job(problem, completion)      (solution code, test code) for the sandbox (code problems)
    math_correct(problem, completion)     the completion's final answer against the ground truth
"""

from __future__ import annotations

from evolforge.config.sections.eval import EvalSettings
from evolforge.tasks.problems.benchmarks import Problem
from evolforge.tasks.problems.prompts import answer_messages, code_messages
from evolforge.tasks.text.answers import answer_correct
from evolforge.tasks.text.checks import extract_code

WIZARDMATH_COT = ("Below is an instruction that describes a task. Write a response that appropriately completes the "
                  "request.\n\n### Instruction:\n{instruction}\n\n### Response: Let's think step by step.")
HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
HUMANEVAL_INSTRUCT = ("Complete the following Python function. Reply with the complete function (its imports included) "
                      "in one ```python code block.\n\n```python\n{prompt}\n```")


def prompt_for(problem: Problem, cfg: EvalSettings, chat_only: bool = False) -> dict:
    """The prompt of `problem` ({"raw": text} or {"chat": messages}, with "stop"); `chat_only`: an endpoint's chat
    API (raw templates go as one user message; HumanEval uses its instruct template)."""
    if problem.benchmark == "humaneval":
        if cfg.humaneval_template == "completion" and not chat_only:
            return {"raw": problem.text, "stop": list(HUMANEVAL_STOP), "template": "humaneval_completion"}
        return {"chat": [{"role": "user", "content": HUMANEVAL_INSTRUCT.format(prompt=problem.text.strip())}],
                "stop": [], "template": "humaneval_instruct"}
    if problem.domain == "code":
        return {"chat": code_messages(problem.check["entry_point"], problem.text.strip()),
                "stop": [], "template": "synthesis_solve_code"}
    if cfg.math_template == "evolforge_steps":
        return {"chat": answer_messages(problem.text.strip(), True), "stop": [], "template": "evolforge_steps"}
    text = WIZARDMATH_COT.format(instruction=problem.text)
    if chat_only:
        return {"chat": [{"role": "user", "content": text}], "stop": [], "template": "wizardmath_cot"}
    return {"raw": text, "stop": ["### Instruction"], "template": "wizardmath_cot"}


def humaneval_test(problem: Problem) -> str:
    """HumanEval's check as a script against solution.py: the entry point from the solution, the prompt's helpers
    from the prompt (a completion cannot rebind what check trusts), its test code, then check(entry_point)."""
    from evolforge.tasks.sandbox.humaneval import check_script

    return check_script(problem.text, problem.check["test"], problem.check["entry_point"])


def sandbox_job(problem: Problem, completion: str, template: str) -> tuple[str, str]:
    """(solution code, test code) of a code problem's completion."""
    if problem.benchmark == "humaneval":
        if template == "humaneval_completion":
            return problem.text + completion, humaneval_test(problem)
        code = extract_code(completion)
        if f"def {problem.check['entry_point']}" not in code:  # only a body: complete the prompt with it
            return problem.text + completion, humaneval_test(problem)
        return problem.text + "    pass\n\n" + code, humaneval_test(problem)  # the prompt's imports and helpers
    return extract_code(completion), problem.check["tests"]


def math_correct(problem: Problem, completion: str) -> bool:
    return bool(answer_correct(completion, problem.check["answer"]))
