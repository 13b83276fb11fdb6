"""The rules that judge a rewrite as an instruction, on rewrites the embedded model really wrote.

tests/fixtures/evolve_rewrites_labelled.jsonl holds 520 rewrites of the sample seeds by the embedded
SmolLM2-135M model (`prompts`: how they were asked):
  - 60 asked with the published templates ("published");
  - 60 with evolforge's first form (system turn, one math worked example: "few-shot"), the 24 rows a two-round
    sample run with it accepted before the rules took code answers and prompt echoes into account, and the 16 rows
    a fresh clone's `make run` accepted before the rules took talk about the task and reactions into account
    (`source`: "fresh-clone sample run");
  - 360 with today's form (a worked example of the task's own domain, the reply asked as {"instruction": ...}
    under response_format json_schema: "few-shot-json"): 120 replies as the model wrote them, JSON and all, asked
    directly with the round-1 operations of 4 operation seeds (`source`: "asked directly"), and every rewrite of
    four two-round sample runs with it (`source`: "sample run 1" to "sample run 4"), each read before the rule
    changes its rows led to: run 1 before the rules for worked sums, answers under a question heading, advice and
    loops, run 2 before 'the answer to this question ...' after a question and the easier method's words, runs 3
    and 4 before how-tos ('To write a clear email, focus on ...'), 'the original task' and the complicate-input
    method's words ('make the task depend on it').
Each was labelled by reading it: `instruction` (a task a person could give a model, however clumsy) or
`not_instruction` (an answer, a worked sum, a template echo, talk about the task, advice, a poem, a statement, a
loop). The rules judge what the pipeline keeps, `clean_evolved(text)` (the reply's JSON field, without an
announcing first line or trailing talk); `label_cleaned`, where given, is the label of that cleaned text when it
reads differently from the text as written.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from evolforge.tasks.evolve import elimination as rules
from evolforge.tasks.evolve import prompts
from evolforge.tasks.evolve.evolution import clean_evolved

LABELLED = Path(__file__).parents[2] / "fixtures" / "evolve_rewrites_labelled.jsonl"


def _rows(prompts_kind: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in LABELLED.read_text().splitlines() if line.strip()]
    return [r for r in rows if prompts_kind is None or r["prompts"] == prompts_kind]


def _label(row: dict) -> str:
    return row.get("label_cleaned", row["label"])


def _verdict(row: dict) -> str | None:
    """What the pipeline decides on the row: the rules on the cleaned reply."""
    return rules.instruction_rule(clean_evolved(row["text"]), row["operation"])


def test_the_labelled_set_is_what_the_docstring_says():
    rows = _rows()
    assert len(rows) == 520
    assert {r["label"] for r in rows} | {_label(r) for r in rows} == {"instruction", "not_instruction"}
    assert Counter(r["prompts"] for r in rows) == {"published": 60, "few-shot": 100, "few-shot-json": 360}
    assert Counter(r.get("source") for r in rows if r.get("source", "").startswith("sample run")) == {
        f"sample run {n} (issue-37 prompts)": 60 for n in (1, 2, 3, 4)}


@pytest.mark.parametrize(("prompts_kind", "least"), [("few-shot", 0.85), ("few-shot-json", 0.95)])
def test_most_rows_the_rules_keep_are_instructions(prompts_kind, least):
    kept = [r for r in _rows(prompts_kind) if _verdict(r) is None]
    share = sum(_label(r) == "instruction" for r in kept) / len(kept)
    assert share >= least, [clean_evolved(r["text"])[:80] for r in kept if _label(r) != "instruction"]


def test_the_rules_keep_most_instructions_and_drop_most_of_the_rest():
    rows = _rows()
    instructions = [r for r in rows if _label(r) == "instruction"]
    others = [r for r in rows if _label(r) != "instruction"]
    kept = sum(_verdict(r) is None for r in instructions)
    dropped = sum(_verdict(r) is not None for r in others)
    assert kept / len(instructions) >= 0.95
    assert dropped / len(others) >= 0.9


# the checks of rule not_an_instruction (and one of rule 4) written for the issue-37 prompts' rewrites: each fires
# on labelled non-instructions and on no labelled instruction
NEW_CHECKS = {
    "worked sum": lambda t: bool(rules._WORKED_SUM.search(t)),
    "loop": rules.repeats_itself,
    "answer under a question heading":
        lambda t: bool((m := rules._HEADED_ANSWER.match(t)) and not rules.poses_task(m.group("rest"))),
    "the method's own words": lambda t: any(p in " ".join(t.lower().split()) for p in (
        "depth of the inquiry", "breadth of the inquiry", "depth and breadth of the", "one more constraints",
        "constraints/requirements", "structured input data", "to increase misdirection",
        "erroneous code as a reference", "step or one condition", "who finds the original",
        "make the task depend on it")),
    "a how-to": lambda t: bool(rules._HOW_TO.match(t)) and "?" not in t,
    "the original task": lambda t: bool(re.search(r"\bthe original (task|prompt|instruction)\b", t, re.I)),
    "an answer right after the question": lambda t: bool(re.search(
        r"\?\W*(the )?(answer|solution)( to (this|the) (question|problem|task))?\s+(is|are|was|lies|revolves|"
        r"depends|comes)\b", t, re.I)),
}


@pytest.mark.parametrize("check", list(NEW_CHECKS))
def test_each_new_check_fires_on_non_instructions_only(check):
    fired = Counter(_label(r) for r in _rows() if NEW_CHECKS[check](clean_evolved(r["text"])))
    assert fired["not_instruction"] >= 2 and fired["instruction"] == 0, fired


def test_advice_is_not_a_request_on_the_labelled_rows():
    advice = [r for r in _rows() if "make sure" in clean_evolved(r["text"]).lower()]
    assert advice and all(_label(r) == "not_instruction" and _verdict(r) for r in advice)


def test_cleaning_keeps_only_rows_that_read_as_instructions():
    """Where cleaning changed a reply written as text (not JSON), the pipeline keeps the cleaned row only if it
    reads as an instruction; and it turns some replies a rule ate for their trailing talk into instructions."""
    changed = [r for r in _rows() if not r["text"].lstrip().startswith("{") and clean_evolved(r["text"]) != r["text"]]
    kept = [r for r in changed if _verdict(r) is None]
    wrongly = [clean_evolved(r["text"]) for r in kept if _label(r) != "instruction"]
    assert len(wrongly) <= 1, wrongly  # 'Rewrite task: A shop offers you three tips ...' (kept before too)
    assert sum(r["label"] == "not_instruction" and _label(r) == "instruction" and _verdict(r) is None
               for r in changed) == 2


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
    # issue 37, on the new prompts: a sum worked to a quantity, an answer under its question, advice, a loop
    "Adam has 10 marbles. If he gives 2 to his sister, he will have 10 - 2 = 7 marbles left. How many does he have?",
    "Each friend pays the tip, which is 36 - 6 = $24. How much does each friend pay?",
    "The train travels 180 kilometres in 3 hours, so its speed is 180 / 3 \u2248 45 kilometres per hour. How fast?",
    "A rectangle is 8m long. What is its area? (The answer is the area of a square multiplied by its side.)",
    "Why the sky looks blue during the day and red at sunset: The sky's a canvas with millions of shades.",
    "When writing a professional email to a colleague, make sure to use clear and respectful language.",
    "Implement a Python class for a stack with push, pop and min() with a max() max() max() max() max() method.",
    "What is the climate of a desert? The answer to this question revolves around a climate that is unique.",
    "To write a clear and polite email, focus on clarity and conciseness, and use proper grammar.",
    "When comparing three critical areas of energy, look at two examples each with each other.",
    "Write a short poem about autumn leaves. This task requires an additional constraint to the original task.",
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
    # issue 37: what the new checks must leave alone
    "Write a function that parses dates; make sure it handles leap years, and return an ISO string.",
    "What to pack for a week of hiking: list ten items and say why each is needed.",
    "A shop sells 3 boxes of 4 pens. If 3 x 4 = 12, how many pens are in 5 boxes?",
    "Fix the bug in this function so that it returns the sum of a list.",
    "Synthesize the main causes of the French Revolution in a short paragraph.",
    "How often does 'the cat' occur in 'the cat the cat the cat sat'?",
    "What is the boiling point of water at 2,000 m? The answer should be in degrees Celsius.",
    "To practise recursion, write a function that flattens a nested list.",
    "When given a list of integers, return the sum of the even ones.",
    "To celebrate her birthday, Anna buys 3 cakes of 8 slices. Use the number of guests, 12: how many slices does "
    "each get?",
])
def test_tasks_are_instructions(text):
    assert rules.instruction_rule(text) is None


def test_a_method_sentence_repeated_is_a_template_copy():
    text = prompts.CODE_METHODS["code_erroneous_reference"] + " Implement a stack class with push and pop."
    assert rules.instruction_rule(text) == rules.RULE_COPY


@pytest.mark.parametrize("text", [
    "To maximize the depth of the inquiry, find how many marbles Tom has after he gives 6 away.",
    "Please add structured input data to the task, such as a table, and make the task depend on it.",
    "If the task can be solved with just a few simple thinking processes, ask how many days Lena needs.",
    "Return the second largest number in a list of integers. Removes the first step or one condition.",
    "Suggest a healthy meal plan for a student, using a piece of code, JSON or XML, and make the task depend on it.",
])
def test_the_methods_own_words_are_a_template_copy(text):
    """The method sentence as the request shows it ('the task' for '#The Given Prompt#') and its phrases."""
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


@pytest.mark.parametrize(("domain", "word"), [("math", "library"), ("code", "average"), ("general", "bees"),
                                            ("poetry", "bees"), (None, "bees")])
def test_the_worked_example_is_of_the_tasks_domain_and_replies_in_json(domain, word):
    msgs = prompts.evolve_messages("add_constraints", "Do something.", domain)
    assert word in msgs[1]["content"]
    assert list(json.loads(msgs[2]["content"])) == [prompts.REPLY_FIELD]
    code = prompts.evolve_messages("code_complexity", "Write a function.", domain)
    assert "prime" in code[1]["content"]  # the code operations have their own example


def test_no_worked_example_is_a_sample_seed():
    """A run on the sample seeds shows what the model writes, not a copy of an example: no example shares a third
    of its content words with a sample seed (the earlier examples did: 'Tom has 15 marbles. He gives 6 to his
    sister ...' shares 75% with a seed, the second largest number 44%)."""
    boilerplate = rules.STOP_WORDS | {"write", "python", "function", "returns", "implement"}

    def words(text: str) -> set[str]:
        return set(text.lower().replace(".", " ").replace("?", " ").replace(",", " ").split()) - boilerplate

    seeds = [words(json.loads(line)["instruction"]) for line in
             (Path(__file__).parents[3] / "config" / "sample_seeds.jsonl").read_text().splitlines() if line.strip()]
    for task, reply in prompts.EXAMPLES.values():
        for text in (task, reply):
            assert max(len(words(text) & seed) / len(words(text) | seed) for seed in seeds) < 1 / 3, text


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
