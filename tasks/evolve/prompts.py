"""Every prompt template of Evol-Instruct, in one file (change a prompt here).

The operations are the published ones: in-depth and in-breadth from WizardLM, the downward ones from WizardMath,
the code operations from WizardCoder, each with its method sentence; the rewriter rules (10 to 20 added words for
an upward rewrite; never the template's words) are in every request. How they are asked (a system turn, one worked
example, then the request) is evolforge's: see the note above `SYSTEM`.
The answer prompt (what the answer model, and later the policy at SFT, PPO and eval, is asked) lives in
tasks/problems/prompts.py and is re-exported here for the evolution.
"""

from __future__ import annotations

import json

from evolforge.tasks.problems.prompts import answer_messages as answer_messages

# Markers: substrings each kind of prompt contains (the templates below are built from them, so they cannot
# drift apart); the scripted test server (testing/scripted_server.py) recognises a stage's request by them.
MARKER_EVOLVE_REWRITE = "Rewritten task:"  # the in-depth (up) and the `easier` (down) rewrites
MARKER_EVOLVE_CREATE = "Created task:"  # in-breadth and `new_easier_topic` (down): a brand-new task
MARKER_EVOLVE_CODE = "Rewritten question:"  # the code operations (WizardCoder)
MARKER_EVOLVE = (MARKER_EVOLVE_REWRITE, MARKER_EVOLVE_CREATE, MARKER_EVOLVE_CODE)  # one of them: an evolve prompt
MARKER_EQUAL_JUDGE = "Your Judgement (Just answer: Equal or Not Equal. No need to explain the reason.):"

# How a rewrite is asked. The published templates (WizardLM, WizardMath, WizardCoder) put the whole job in one
# long user turn that ends in '#Rewritten Prompt#:'; a small model (the embedded 135M one) then echoes the template,
# answers the task or writes a poem (measured: 19 of 60 rewrites of the sample seeds passed the rules). Here the
# same operations and rules are asked in three parts, which a small model follows far more often (BENCHMARKS.md,
# "The sample run"):
#   1. a system turn: the role and the rules (reply with the new task only; never answer it; no template words);
#   2. one worked example of the same kind of operation on a task of the same domain (math, code, general), as a
#      user turn and the assistant's reply, {"instruction": "..."};
#   3. the real request: the operation's published method sentence and the instruction to evolve.
# The reply is asked for as JSON with one field, the new instruction (response_format json_schema): the grammar
# keeps a small model from trailing talk after the task ("Create the new task.", "Here's how you can implement it:").
# A capable model gets the same information as from the published templates.
SYSTEM = (
    "You rewrite tasks for an AI assistant. Your whole reply is the new task, written as a question or a request "
    "that a person could answer. Never answer or solve the task, never explain what you changed, and never write "
    "the words 'given prompt', 'rewritten prompt' or 'new task'."
)

ASK = "{lead}\nMethod: {method}\n{limit}Reply with the new task only.\n\nTask: {instruction}\n\n{marker}"

# the published method sentences of the in-depth operations (WizardLM)
DEPTH_METHODS = {
    "add_constraints": "Please add one more constraints/requirements into #The Given Prompt#.",
    "deepening": "If #The Given Prompt# contains inquiries about certain issues, the depth and breadth of the inquiry can be increased.",
    "concretizing": "Please replace general concepts with more specific concepts.",
    "increased_reasoning_steps": "If #The Given Prompt# can be solved with just a few simple thinking processes, "
    "you can rewrite it to explicitly request multiple-step reasoning.",
    "complicate_input": "Please add structured input data to #The Given Prompt#, such as a table, a piece of code, "
    "a formula, JSON or XML, and make the task depend on it.",
}
# the in-breadth operation (WizardLM) and the downward ones (WizardMath), in the same sentence form
BREADTH_METHOD = ("Draw inspiration from the task to create a brand new task. It should belong to the same domain "
                  "but be even more rare, with similar length and complexity.")
DOWN = {
    "easier": "Rewrite the task into an easier version that a student who finds the original too hard could solve: "
              "make the numbers smaller or remove one step or one condition.",
    "new_easier_topic": "Draw inspiration from the task to write a brand new task on a different topic that is "
                        "easier to solve.",
}
# the code operations (WizardCoder)
CODE_METHODS = {
    "code_add_constraints": "Add new constraints and requirements to the original problem, adding approximately 10 additional words.",
    "code_specific_requirement": "Replace a commonly used requirement in the programming task with a less common and more specific one.",
    "code_more_reasoning": "If the original problem can be solved with only a few logical steps, please add more reasoning steps.",
    "code_erroneous_reference": "Provide a piece of erroneous code as a reference to increase misdirection.",
    "code_complexity": "Propose higher time or space complexity requirements, but please refrain from doing so frequently.",
}

# How each kind of operation is asked: (lead, limit, marker).
_UP_LIMIT = "Add only 10 to 20 words to the task.\n"
KINDS = {
    "up": ("Rewrite the task into a more complex version that is still reasonable and answerable.", _UP_LIMIT,
           MARKER_EVOLVE_REWRITE),
    "breadth": ("Create a brand new task.", "", MARKER_EVOLVE_CREATE),
    "easier": ("Rewrite the task into an easier version.", "", MARKER_EVOLVE_REWRITE),
    "new_easier_topic": ("Create a brand new, easier task.", "", MARKER_EVOLVE_CREATE),
    "code": ("Increase the difficulty of the programming question a bit.", "", MARKER_EVOLVE_CODE),
}
# One worked example per kind of operation and domain of the task (math, code, general; any other domain gets the
# general one): (example task, example reply). An example of the task's own domain is what a small model imitates:
# with one math example for every task, the 135M model answered explanation and code tasks instead of rewriting
# them (BENCHMARKS.md, "The sample run"). None of them is one of the sample seeds, so a run on the sample seeds
# shows what the model writes, not a copy of an example.
EXAMPLES = {
    ("up", "math"): ("A library has 120 books and lends out 45. How many books are left?",
                     "A library has 120 books, lends out 45 and gets 18 of them back the next day. How many books "
                     "does it have now?"),
    ("up", "code"): ("Write a Python function that returns the average of a list of numbers.",
                     "Write a Python function that returns the average of a list of numbers, skipping None values, "
                     "and returns 0.0 for an empty list."),
    ("up", "general"): ("Explain how bees make honey.",
                        "Explain how bees make honey, and describe what the worker bees do at each step, in under 150 "
                        "words."),
    ("breadth", "math"): ("A farmer has 12 cows and buys 5 more. How many cows does he have?",
                          "A beekeeper has 8 hives with 3 frames of honey each and sells 5 frames. How many frames are "
                          "left?"),
    ("breadth", "code"): ("Write a Python function that reverses a string.",
                          "Write a Python function that returns the longest word in a sentence."),
    ("breadth", "general"): ("Write a haiku about the sea.",
                             "Write a haiku about a lighthouse keeper's last night before the light is automated."),
    ("easier", "math"): ("A cinema ticket costs $12.50 and children pay 40% less. What do 2 adults and 3 children "
                         "pay?", "A cinema ticket costs $10. What do 2 tickets cost?"),
    ("easier", "code"): ("Write a Python function that parses a date in any of three formats and returns it in ISO "
                         "8601 form.", "Write a Python function that turns a date 'DD/MM/YYYY' into 'YYYY-MM-DD'."),
    ("easier", "general"): ("Compare the healthcare systems of three European countries and their costs.",
                            "Describe how people see a doctor in France."),
    ("new_easier_topic", "math"): ("A cinema ticket costs $12.50 and children pay 40% less. What do 2 adults and 3 "
                                   "children pay?", "Anna has 3 apples and picks 2 more. How many apples does she have?"),
    ("new_easier_topic", "code"): ("Implement a thread-safe cache class in Python that evicts the least recently "
                                   "used item.", "Write a Python function that returns the sum of a list of numbers."),
    ("new_easier_topic", "general"): ("Analyse the causes of the First World War.", "Name the three primary colours."),
    ("code", "code"): ("Write a Python function that checks whether a number is prime.",
                       "Write a Python function that checks whether a number is prime in O(sqrt(n)) time, and returns "
                       "False for numbers below 2."),
}
# The reply's form: one field, the new instruction (response_format json_schema; tasks/evolve/evolution.py sizes it
# to the call's token budget and reads the reply, JSON or not). The worked example's reply is in that form too, so
# a model asked without a schema (an endpoint that takes none) still answers in it.
REPLY_FIELD = "instruction"

EQUAL_JUDGE = (
    "Here are two Instructions to ChatGPT AI, do you think they are equal to each other, "
    "which meet the following requirements:\n"
    "1. They have same constraints and requirements.\n"
    "2. They have same depth and breadth of the inquiry.\n"
    "The First Prompt: {parent}\n"
    "The Second Prompt: {child}\n"
    + MARKER_EQUAL_JUDGE
)

# Operation name -> direction, for lineage and survival statistics.
DIRECTION = {
    **{op: "up" for op in DEPTH_METHODS},
    "in_breadth": "breadth",
    **{op: "down" for op in DOWN},
    **{op: "up" for op in CODE_METHODS},
}

# Operations that produce a brand-new prompt (no "same depth" comparison makes sense against the parent
# only in spirit; the Equal judge still runs, as in WizardLM).
UP_OPERATIONS = list(DEPTH_METHODS)
DOWN_OPERATIONS = list(DOWN)
CODE_OPERATIONS = list(CODE_METHODS)

# Strings that may never appear in an evolved instruction (elimination rule 4): the template words of the published
# prompts and of these, and the phrases of the method sentences no task would use ("To maximize the depth of the
# inquiry, ..." copies the deepening method).
FORBIDDEN_COPIES = ("#the given prompt#", "#rewritten prompt#", "given prompt", "rewritten prompt",
                    "#created prompt#", "created prompt", "#given question#", "#rewritten question#",
                    "rewritten task:", "created task:", "rewritten question:", "the new task only",
                    "rewrite the task", "reply with the new task", "add only 10 to 20 words",
                    "depth of the inquiry", "breadth of the inquiry", "depth and breadth of the",
                    "one more constraints", "constraints/requirements", "structured input data",
                    "to increase misdirection", "erroneous code as a reference", "step or one condition",
                    "who finds the original", "make the task depend on it")


def _openings(sentence: str) -> set[str]:
    """A method sentence's first 8 words, as published and as the request shows it ('the task' for '#The Given
    Prompt#'), lower-case."""
    return {" ".join(s.lower().split()[:8]) for s in (sentence, sentence.replace("#The Given Prompt#", "the task"))}


# The first words of every method sentence: a rewrite that repeats one copies the template (rule 4).
METHOD_OPENINGS = tuple(sorted(set().union(*(_openings(m) for m in (*DEPTH_METHODS.values(), BREADTH_METHOD,
                                                                      *DOWN.values(), *CODE_METHODS.values())))))


def _kind(operation: str) -> tuple[str, str]:
    """(kind of worked example, the operation's method sentence as the request shows it)."""
    if operation in DEPTH_METHODS:
        return "up", DEPTH_METHODS[operation].replace("#The Given Prompt#", "the task")
    if operation == "in_breadth":
        return "breadth", BREADTH_METHOD
    if operation in DOWN:
        return operation, DOWN[operation]
    if operation in CODE_METHODS:
        return "code", CODE_METHODS[operation]
    raise ValueError(f"unknown evolution operation {operation!r}")


def example(kind: str, domain: str | None) -> tuple[str, str]:
    """The worked example of a kind of operation for a task of `domain` (the general one for any other domain;
    the code operations have only a code example)."""
    return (EXAMPLES.get((kind, domain or "general")) or EXAMPLES.get((kind, "general"))
            or EXAMPLES[(kind, "code")])


def evolve_messages(operation: str, instruction: str, domain: str | None = "general") -> list[dict]:
    """The rewrite request of one operation: the rules, one worked example of its kind in the task's domain (its
    reply in the reply's JSON form), then the instruction."""
    kind, method = _kind(operation)
    lead, limit, marker = KINDS[kind]
    task, reply = example(kind, domain)

    def ask(text: str) -> str:
        return ASK.format(lead=lead, method=method, limit=limit, instruction=text, marker=marker)

    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": ask(task)},
            {"role": "assistant", "content": json.dumps({REPLY_FIELD: reply})},
            {"role": "user", "content": ask(instruction)}]


def equal_messages(parent: str, child: str) -> list[dict]:
    return [{"role": "user", "content": EQUAL_JUDGE.format(parent=parent, child=child)}]

