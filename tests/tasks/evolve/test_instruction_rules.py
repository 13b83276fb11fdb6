"""The rules that judge a rewrite as an instruction, on rewrites the embedded model really wrote.

tests/fixtures/evolve_rewrites_labelled.jsonl holds 160 rewrites of the sample seeds by the embedded
SmolLM2-135M model: 60 asked with the published templates, 60 with evolforge's (system turn, one worked example),
the 24 rows a two-round sample run with evolforge's prompts accepted before the rules took code answers and
prompt echoes into account, and the 16 rows a fresh clone's `make run` accepted before the rules took talk about
the task ("Here's how it could be rewritten", "The new task is:") and reactions ("What a simple task!") into
account (`source`: "fresh-clone sample run").
Each was labelled by reading it: `instruction` (a task a person could give a model) or `not_instruction` (an
answer, a template echo, a poem, a statement, a plan of how to rewrite).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolforge.tasks.evolve import elimination as rules
from evolforge.tasks.evolve import prompts
from evolforge.tasks.evolve.evolution import clean_evolved

LABELLED = Path(__file__).parents[2] / "fixtures" / "evolve_rewrites_labelled.jsonl"


def _rows(prompts_kind: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in LABELLED.read_text().splitlines() if line.strip()]
    return [r for r in rows if prompts_kind is None or r["prompts"] == prompts_kind]


def test_the_labelled_set_is_what_the_docstring_says():
    rows = _rows()
    assert len(rows) == 160
    assert {r["label"] for r in rows} == {"instruction", "not_instruction"}
    assert {r["prompts"] for r in rows} == {"published", "few-shot"}


def test_most_rows_the_rules_keep_are_instructions():
    kept = [r for r in _rows("few-shot") if rules.instruction_rule(r["text"], r["operation"]) is None]
    share = sum(r["label"] == "instruction" for r in kept) / len(kept)
    assert share >= 0.8, [r["text"][:80] for r in kept if r["label"] != "instruction"]


def test_the_rules_keep_most_instructions_and_drop_most_of_the_rest():
    rows = _rows()
    instructions = [r for r in rows if r["label"] == "instruction"]
    others = [r for r in rows if r["label"] != "instruction"]
    kept = sum(rules.instruction_rule(r["text"], r["operation"]) is None for r in instructions)
    dropped = sum(rules.instruction_rule(r["text"], r["operation"]) is not None for r in others)
    assert kept / len(instructions) >= 0.85
    assert dropped / len(others) >= 0.85


@pytest.mark.parametrize("text", [
    # the two rows a sample run once accepted: answers, not instructions
    "Lena reads 132 pages in a day, so in 132 days she will read 132 * 60 = 720 pages, which is 60 days.",
    "She can make a total of 2 * 4 = 8 boxes.",
    "Sure! Here is a harder version of the task.",
    "What is the area of a rectangle 8 m long and 5 m wide? The area is 40 square metres.",
    "In a quiet park the autumn leaves fall, a gentle breeze carries the scent of earth.",
    "You can use slicing to reverse the string: s[::-1] returns it reversed.",
    "```python\ndef f(x):\n    return x\n```",
    "The task is to flatten a nested list. The solution is: write a function flatten that returns a flat list.",
    "What a simple task!\n\nA rectangle 8m long and 5m wide has an area of 8m x 5m = 40m.",
    "This task is extremely challenging. Here's how it could be rewritten to be more complex: the tank holds 500 l.",
    "It seems we can make it a new task.\n\nThe new task is:\n\nCreate a SQL query that returns the top customers.",
])
def test_answers_poems_and_replies_are_not_instructions(text):
    assert rules.instruction_rule(text) == rules.RULE_NOT_TASK


@pytest.mark.parametrize("text", [
    "A baker makes 24 muffins and sells them in boxes of 4. How many boxes does she fill?",
    "Write a haiku about a lighthouse keeper's last night.",
    "Explain how vaccines train the immune system to fight infections.",
    "Solve for x: 2x + 3 = 11.",
    "If 3 * 4 = 12, what is 3 * 8?",
    "Given a list of integers, return the sum of the even ones.",
    "Implement binary search over a sorted list and return the index of the target or -1.",
    "The task is to implement a function that returns the first non-repeating character of a string.",
    "In this task, you are given a list of words. Return the longest one.",
    "This problem requires you to find the area of a 3 m x 4 m room. What is it?",
    "Write a Python function that creates a new task in a to-do list and returns its id.",
])
def test_tasks_are_instructions(text):
    assert rules.instruction_rule(text) is None


def test_a_method_sentence_repeated_is_a_template_copy():
    text = prompts.CODE_METHODS["code_erroneous_reference"] + " Implement a stack class with push and pop."
    assert rules.instruction_rule(text) == rules.RULE_COPY


def test_every_rule_has_plain_words():
    names = {getattr(rules, n) for n in dir(rules) if n.startswith("RULE_") and isinstance(getattr(rules, n), str)}
    assert names == set(rules.RULE_WORDS)
    assert all(rules.rule_words(n) != n and " " in rules.rule_words(n) for n in names)


@pytest.mark.parametrize(("parent", "child", "equal"), [
    ("Tom has 15 marbles. How many?", "Tom has 15 marbles. How many?", True),
    ("Tom has 15 marbles. How many?", "How many marbles does Tom have? He has 15.", True),
    ("Tom has 15 marbles. How many?", "Tom has 15 marbles and buys 6 more. How many?", False),
    ("Write a haiku about the sea.", "Write a haiku about the sea at night.", False),
])
def test_the_words_judge(parent, child, equal):
    assert rules.adds_no_information(parent, child) is equal


def test_evolve_messages_ask_with_rules_an_example_and_the_method():
    msgs = prompts.evolve_messages("add_constraints", "Tom has 15 marbles. How many?")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    ask = msgs[-1]["content"]
    assert "Tom has 15 marbles. How many?" in ask
    assert "add one more constraints/requirements" in ask
    assert ask.rstrip().endswith(prompts.MARKER_EVOLVE_REWRITE)
    for op in prompts.DIRECTION:  # every operation has a request, with its own marker
        assert any(marker in prompts.evolve_messages(op, "x")[-1]["content"] for marker in prompts.MARKER_EVOLVE)


def test_labels_of_the_new_prompts_are_cleaned():
    assert clean_evolved("New task: Write a haiku.") == "Write a haiku."
    assert clean_evolved("Rewritten task: Write a haiku.") == "Write a haiku."
