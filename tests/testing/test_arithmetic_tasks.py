"""The learning run's problems (testing/arithmetic_tasks.py): template families, whole families held out, no
evaluation problem sharing its numbers and answer with a training problem, and a second computation of each answer
that reads the text and can disagree with the generator."""

from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest

from evolforge.config.sections.ppo import PPOSettings
from evolforge.storage.synthesis_sets import read_kept_tasks
from evolforge.tasks.problems.benchmarks import held_out_seeds, own_problems
from evolforge.testing import arithmetic_tasks as A


def run(program: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(program, {})  # the generator's own program (no model output)
    return out.getvalue().strip()


def test_families_and_the_held_out_ones():
    assert len(A.FAMILIES) >= 12 and len(set(A.BY_NAME)) == len(A.FAMILIES)
    assert len(A.HELD_OUT) >= 4 and set(A.HELD_OUT) <= set(A.BY_NAME)
    assert any(f.distractor for f in A.FAMILIES if f.name not in A.HELD_OUT)
    assert any(f.distractor for f in A.FAMILIES if f.name in A.HELD_OUT)
    assert {f.steps for f in A.FAMILIES} >= {1, 2}


def test_split_holds_out_whole_families_and_shares_no_numbers_and_answer():
    train, evals = A.split_problems(1200, 400, seed=0)
    assert {r["family"] for r in evals} == set(A.HELD_OUT)
    assert not {r["family"] for r in train} & set(A.HELD_OUT)
    assert {r["family"] for r in train} == set(A.BY_NAME) - set(A.HELD_OUT)
    eval_keys = {A.numbers_key(r) for r in evals}
    assert not [r for r in train if A.numbers_key(r) in eval_keys]
    assert not {r["statement"] for r in train} & {r["statement"] for r in evals}
    # `avoid` keeps two draws apart even within one family, where equal numbers and answers are common
    first = {A.numbers_key(r) for r in A.problems(300, 1, ("add",))}
    assert [r for r in A.problems(300, 0, ("add",)) if A.numbers_key(r) in first]
    assert not [r for r in A.problems(300, 0, ("add",), avoid=first) if A.numbers_key(r) in first]


def test_the_text_program_agrees_with_the_generator_on_every_family():
    for fam in A.FAMILIES:
        for row in A.problems(40, seed=7, families=(fam.name,)):
            assert run(row["program"]) == str(row["generator_answer"]), (fam.name, row["statement"])
            assert row["numbers"] and all(str(n) in row["statement"] for n in row["numbers"])


def test_the_two_computations_are_independent_and_can_disagree():
    row = A.problems(1, seed=1, families=("change",))[0]
    a, b, c = row["numbers"]
    # the checker reads the text: another number in the text changes its answer, not the generator's
    edited = row["statement"].replace(f"pays with {c} dollars", f"pays with {c + 5} dollars")
    assert run(A.text_program(edited)) == str(row["generator_answer"] + 5)
    # a wrong formula (the generator's side) is caught by the text's program
    wrong = dataclasses.replace(A.BY_NAME["change"], formula=lambda a, b, c: c - a - b)
    bad = A._one(wrong, __import__("random").Random(3))
    assert run(A.text_program(bad["statement"])) != str(bad["generator_answer"])
    with pytest.raises(ValueError, match="no rule reads"):
        A.text_program("Ava juggles 3 apples. How many apples does Ava have?")


def test_family_lineages_hold_out_exactly_the_named_families(tmp_path):
    train, evals = A.split_problems(60, 30, seed=2)
    rows = [{**r, "answer": str(r["generator_answer"]), "verified": "test"} for r in train + evals]
    A.write_task_folder(tmp_path / "tasks", rows, lineage="family")
    tasks = read_kept_tasks(tmp_path / "tasks")
    ppo = PPOSettings(held_out_seeds=[f"family/{f}" for f in A.HELD_OUT])
    held = held_out_seeds([], tasks, ppo)
    assert held == {f"family/{f}" for f in A.HELD_OUT}
    assert {p.id for p in own_problems(tasks, held)} == {r["id"] for r in evals}
