"""One home for the policy's prompts and the split: SFT, PPO and eval ask the policy the same bytes for one record,
and agree on what is held out."""

from __future__ import annotations

from evolforge.config.sections.eval import EvalSettings
from evolforge.config.sections.ppo import PPOSettings
from evolforge.tasks.eval.prompts import prompt_for
from evolforge.tasks.ppo.data import build_prompt_rows
from evolforge.tasks.problems.benchmarks import held_out_seeds, own_problems
from evolforge.tasks.problems.split import split_lineages
from evolforge.tasks.sft import data as sft_data
from evolforge.tasks.sft import rejection

MATH = {"task_id": "m1", "seed_id": "s-math", "kind": "math", "status": "kept", "entry_point": None, "tests": None,
        "statement": "  Ava has 3 apples and buys 4 more. How many apples does she have?\n", "answer": "7",
        "solution": None}
CODE = {"task_id": "c1", "seed_id": "s-code", "kind": "code", "status": "kept", "entry_point": "add",
        "statement": "Write add(a, b) returning a + b. ", "answer": None, "solution": "def add(a, b):\n    return a + b\n",
        "tests": "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"}


def _sft_prompt(task: dict) -> list[dict]:
    built = sft_data.Built()
    rows = sft_data.task_rows([task], set(), built, sampled={task["task_id"]: ["Step 1: x\nThe answer is: 7"]})
    return [{"role": m["role"], "content": m["content"]} for m in rows[0]["prompt"]]


def _ppo_prompt(task: dict) -> list[dict]:
    train, test, _ = build_prompt_rows([], 0.5, 1, tasks=[task])
    (row,) = train + test
    return row["prompt"]


def _eval_prompt(task: dict) -> list[dict]:
    (problem,) = own_problems([task], {task["seed_id"]})
    return prompt_for(problem, EvalSettings(math_template="evolforge_steps"))["chat"]


def test_sft_ppo_and_eval_prompts_of_one_record_are_byte_identical():
    for task in (MATH, CODE):
        sft, ppo, ev, sampled = _sft_prompt(task), _ppo_prompt(task), _eval_prompt(task), rejection.prompt_of(task)
        assert sft == ppo == ev == sampled, (task["kind"], sft, ppo, ev, sampled)
        assert task["statement"].strip() in ev[-1]["content"]
    assert "Step 1" in _eval_prompt(MATH)[0]["content"] and "solution.py" in _eval_prompt(CODE)[0]["content"]


def test_eval_sft_and_ppo_hold_out_the_same_lineages():
    tasks = [{**MATH, "task_id": f"m{i}", "seed_id": f"s{i}", "statement": f"Question {i}: 1 + {i}?",
              "answer": str(1 + i)} for i in range(20)]
    ppo = PPOSettings(test_fraction=0.3, split_seed=5)
    held = held_out_seeds([], tasks, ppo)
    train, test, _ = build_prompt_rows([], ppo.test_fraction, ppo.split_seed, tasks=tasks)
    assert held == {r["extra_info"]["lineage"]["seed_id"] for r in test} == split_lineages(
        [f"s{i}" for i in range(20)], 0.3, 5)
    assert not held & {r["extra_info"]["lineage"]["seed_id"] for r in train}
    assert {t["task_id"] for t in rejection.training_tasks(tasks, held)} == {
        t["task_id"] for t in tasks if t["seed_id"] not in held}
