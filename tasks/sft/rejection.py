"""Rejection sampling (RFT, STaR): the policy's own answers to verified training tasks, kept only when verified.

    training_tasks(tasks, held_out)            the kept synthesis tasks outside the held-out seed lineages
    prompt_of(task)                            the prompt a sample answers: the one prompt of SFT, PPO and eval
                                               (tasks/problems/prompts.py task_messages)
    sample(tasks, policy, cfg, sandbox)        sft.rejection_samples answers per task from `policy` (a local
                                               transformers policy: tasks/core/policy.py LocalPolicy), each verified:
                                               math by its final answer against the task's majority-verified answer
                                               (tasks/text/answers.py) and step form (at least sft.min_steps steps,
                                               tasks/text/steps.py); code by the task's own tests in the sandbox
                                               (tasks/sandbox/run.py run_many, one batch). Returns every sample with
                                               its verdict and, per task, up to sft.rejection_keep distinct verified
                                               answers, the shortest first (the SFT rows of source
                                               `rejection_sampled`: concise verified answers).

Nothing is written by hand and nothing unverified is kept: a task none of whose samples passes gives no row (it is
skipped with that reason). The policy sampled is the one being fine-tuned (the base policy), so the rows teach it
the verified subset of its own answers, in the format the PRM scores.
"""

from __future__ import annotations

from evolforge.config.sections.eval import EvalSettings
from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.config.sections.sft import SFTSettings
from evolforge.tasks.problems.prompts import task_messages
from evolforge.tasks.problems.truth import math_truth
from evolforge.tasks.text.answers import answer_correct
from evolforge.tasks.text.checks import eval_number, extract_code
from evolforge.tasks.text.steps import steps_or_reason


def training_tasks(tasks: list[dict], held_out: set[str]) -> list[dict]:
    """Kept tasks with a checkable ground truth whose seed lineage is not held out for evaluation."""
    out = []
    for t in tasks:
        if (t.get("seed_id") or t.get("task_id")) in held_out or not (t.get("statement") or "").strip():
            continue
        if t.get("kind") == "math" and eval_number(str(t.get("answer") or "")) is not None:
            out.append(t)
        elif t.get("kind") == "code" and (t.get("tests") or "").strip() and (t.get("entry_point") or "").strip():
            out.append(t)
    return out


def prompt_of(task: dict) -> list[dict]:
    return task_messages(task["kind"], task["statement"], task.get("entry_point"))


def sampling_settings(cfg: SFTSettings) -> EvalSettings:
    """The generation settings of the sampler (LocalPolicy reads an EvalSettings)."""
    return EvalSettings(samples=max(2, cfg.rejection_samples), temperature=cfg.rejection_temperature,
                        top_p=cfg.rejection_top_p, max_new_tokens=cfg.rejection_max_new_tokens,
                        batch_size=cfg.rejection_batch_size, threads=cfg.threads, seed=cfg.seed)


def _math_verdict(task: dict, completion: str, min_steps: int) -> tuple[bool, str]:
    truth = math_truth(task)
    if not answer_correct(completion, truth):
        return False, f"final answer is not the verified {truth}"
    steps, why = steps_or_reason(completion, min_steps)
    if steps is None:
        return False, f"not step form: {why}"
    return True, "verified"


def sample(tasks: list[dict], policy, cfg: SFTSettings, sandbox: SandboxSettings,
           on_batch=None) -> tuple[list[dict], dict[str, list[str]]]:
    """(every sample with its verdict, task_id -> up to cfg.rejection_keep distinct verified answers)."""
    if not tasks or cfg.rejection_samples < 1:
        return [], {}
    prompts = [{"chat": prompt_of(t), "stop": []} for t in tasks]
    outs = policy.generate(prompts, cfg.rejection_samples, on_batch=on_batch)
    rows, code_jobs = [], []
    for t, completions in zip(tasks, outs):
        for s, text in enumerate(completions):
            row = {"task_id": str(t["task_id"]), "seed_id": t.get("seed_id") or t.get("task_id"), "kind": t["kind"],
                   "sample": s, "completion": text, "verified": False, "reason": None}
            if t["kind"] == "code":
                code_jobs.append((len(rows), (extract_code(text), t["tests"])))
            else:
                row["verified"], row["reason"] = _math_verdict(t, text, cfg.min_steps)
            rows.append(row)
    if code_jobs:
        from evolforge.tasks.sandbox.run import run_many

        for (i, _), res in zip(code_jobs, run_many([job for _, job in code_jobs], sandbox, reward=True)):
            rows[i]["verified"] = bool(res.passed)
            rows[i]["reason"] = "passed its tests in the sandbox" if res.passed else (
                res.killed_reason or res.verdict_error or "failed its tests")
    kept: dict[str, list[str]] = {}
    for r in sorted(rows, key=lambda r: (r["task_id"], len(r["completion"]), r["sample"])):  # shortest first
        answers = kept.setdefault(r["task_id"], [])
        text = r["completion"].strip()
        if r["verified"] and text and text not in answers and len(answers) < cfg.rejection_keep:
            answers.append(text if r["kind"] == "math" else f"```python\n{extract_code(text).strip()}\n```")
    return rows, {k: v for k, v in kept.items() if v}


def counts(rows: list[dict], kept: dict[str, list[str]]) -> dict:
    tasks = {r["task_id"] for r in rows}
    return {"tasks": len(tasks), "samples": len(rows), "verified_samples": sum(r["verified"] for r in rows),
            "tasks_with_a_verified_sample": len(kept), "rows": sum(len(v) for v in kept.values())}
