"""Every prompt template of Evol-Instruct, in one file (change a prompt here).

In-depth operations and the in-breadth template follow WizardLM; the downward
templates follow WizardMath; the code operations follow WizardCoder. The
rewriter rule (10 to 20 added words; never the words 'given prompt' or
'rewritten prompt') is part of every upward template.
The answer prompt (what the answer model, and later the policy at SFT, PPO and eval, is asked) lives in
tasks/problems/prompts.py and is re-exported here for the evolution.
"""

from __future__ import annotations

from evolforge.tasks.problems.prompts import answer_messages as answer_messages

# Markers: substrings each kind of prompt contains (the templates below are built from them, so they cannot
# drift apart); the scripted test server (testing/scripted_server.py) recognises a stage's request by them.
MARKER_EVOLVE_REWRITE = "#Rewritten Prompt#:"  # the in-depth (up) and the `easier` (down) rewrites
MARKER_EVOLVE_CREATE = "#Created Prompt#:"  # in-breadth and `new_easier_topic` (down): a brand-new prompt
MARKER_EVOLVE_CODE = "#Rewritten Question#:"  # the code operations (WizardCoder)
MARKER_EVOLVE = (MARKER_EVOLVE_REWRITE, MARKER_EVOLVE_CREATE, MARKER_EVOLVE_CODE)  # one of them: an evolve prompt
MARKER_EQUAL_JUDGE = "Your Judgement (Just answer: Equal or Not Equal. No need to explain the reason.):"

DEPTH_BASE = (
    "I want you to act as a Prompt Rewriter.\n"
    "Your objective is to rewrite a given prompt into a more complex version to make those famous AI systems "
    "(e.g., chatgpt and GPT4) a bit harder to handle.\n"
    "But the rewritten prompt must be reasonable and must be understood and responded by humans.\n"
    "Your rewriting cannot omit the non-text parts such as the table and code in #The Given Prompt#. "
    "Also, please do not omit the input in #The Given Prompt#.\n"
    "You SHOULD complicate the given prompt using the following method:\n"
    "{method}\n"
    "You should try your best not to make the #Rewritten Prompt# become verbose, "
    "#Rewritten Prompt# can only add 10 to 20 words into #The Given Prompt#.\n"
    "'#The Given Prompt#', '#Rewritten Prompt#', 'given prompt' and 'rewritten prompt' are not allowed to appear "
    "in #Rewritten Prompt#\n"
    "#The Given Prompt#:\n{instruction}\n"
    + MARKER_EVOLVE_REWRITE + "\n"
)

DEPTH_METHODS = {
    "add_constraints": "Please add one more constraints/requirements into #The Given Prompt#.",
    "deepening": "If #The Given Prompt# contains inquiries about certain issues, the depth and breadth of the inquiry can be increased.",
    "concretizing": "Please replace general concepts with more specific concepts.",
    "increased_reasoning_steps": "If #The Given Prompt# can be solved with just a few simple thinking processes, "
    "you can rewrite it to explicitly request multiple-step reasoning.",
    "complicate_input": "Please add structured input data to #The Given Prompt#, such as a table, a piece of code, "
    "a formula, JSON or XML, and make the task depend on it.",
}

BREADTH = (
    "I want you to act as a Prompt Creator.\n"
    "Your goal is to draw inspiration from the #Given Prompt# to create a brand new prompt.\n"
    "This new prompt should belong to the same domain as the #Given Prompt# but be even more rare.\n"
    "The LENGTH and complexity of the #Created Prompt# should be similar to that of the #Given Prompt#.\n"
    "The #Created Prompt# must be reasonable and must be understood and responded by humans.\n"
    "'#Given Prompt#', '#Created Prompt#', 'given prompt' and 'created prompt' are not allowed to appear in #Created Prompt#\n"
    "#Given Prompt#:\n{instruction}\n"
    + MARKER_EVOLVE_CREATE + "\n"
)

DOWN = {
    "easier": (
        "I want you to act as a Prompt Rewriter.\n"
        "Your objective is to rewrite a given question into an easier version that a student who finds the original "
        "too hard could solve, keeping it reasonable and answerable.\n"
        "Make the numbers smaller or remove one step or one condition.\n"
        "'#The Given Prompt#', '#Rewritten Prompt#', 'given prompt' and 'rewritten prompt' are not allowed to appear "
        "in #Rewritten Prompt#\n"
        "#The Given Prompt#:\n{instruction}\n"
        + MARKER_EVOLVE_REWRITE + "\n"
    ),
    "new_easier_topic": (
        "I want you to act as a Prompt Creator.\n"
        "Draw inspiration from the #Given Prompt# to write a brand new question on a different topic that is "
        "easier to solve than the #Given Prompt#.\n"
        "'#Given Prompt#', '#Created Prompt#', 'given prompt' and 'created prompt' are not allowed to appear in #Created Prompt#\n"
        "#Given Prompt#:\n{instruction}\n"
        + MARKER_EVOLVE_CREATE + "\n"
    ),
}

CODE_BASE = (
    "Please increase the difficulty of the given programming test question a bit.\n\n"
    "You can increase the difficulty using, but not limited to, the following methods:\n"
    "{method}\n\n"
    "#Given Question#:\n{instruction}\n\n"
    + MARKER_EVOLVE_CODE + "\n"
)

CODE_METHODS = {
    "code_add_constraints": "Add new constraints and requirements to the original problem, adding approximately 10 additional words.",
    "code_specific_requirement": "Replace a commonly used requirement in the programming task with a less common and more specific one.",
    "code_more_reasoning": "If the original problem can be solved with only a few logical steps, please add more reasoning steps.",
    "code_erroneous_reference": "Provide a piece of erroneous code as a reference to increase misdirection.",
    "code_complexity": "Propose higher time or space complexity requirements, but please refrain from doing so frequently.",
}

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

# Strings that may never appear in an evolved instruction (elimination rule 4).
FORBIDDEN_COPIES = ("#the given prompt#", "#rewritten prompt#", "given prompt", "rewritten prompt",
                    "#created prompt#", "created prompt", "#given question#", "#rewritten question#")


def evolve_messages(operation: str, instruction: str) -> list[dict]:
    if operation in DEPTH_METHODS:
        text = DEPTH_BASE.format(method=DEPTH_METHODS[operation], instruction=instruction)
    elif operation == "in_breadth":
        text = BREADTH.format(instruction=instruction)
    elif operation in DOWN:
        text = DOWN[operation].format(instruction=instruction)
    elif operation in CODE_METHODS:
        text = CODE_BASE.format(method=CODE_METHODS[operation], instruction=instruction)
    else:
        raise ValueError(f"unknown evolution operation {operation!r}")
    return [{"role": "user", "content": text}]


def equal_messages(parent: str, child: str) -> list[dict]:
    return [{"role": "user", "content": EQUAL_JUDGE.format(parent=parent, child=child)}]

