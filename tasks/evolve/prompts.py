"""Every prompt template of Evol-Instruct, in one file (change a prompt here).

The operations are the published ones: in-depth and in-breadth from WizardLM, the downward ones from WizardMath,
the code operations from WizardCoder, each with its method sentence; the rewriter rules (10 to 20 added words for
an upward rewrite; never the template's words) are in every request. How they are asked (a system turn, one worked
example, then the request) is evolforge's: see the note above `SYSTEM`.
The answer prompt (what the answer model, and later the policy at SFT, PPO and eval, is asked) lives in
tasks/problems/prompts.py and is re-exported here for the evolution.
"""

from __future__ import annotations

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
# same operations and rules are asked in three parts, which a small model follows far more often (24 of 60, and
# most of those are instructions; BENCHMARKS.md, "The sample run"):
#   1. a system turn: the role and the rules (reply with the new task only; never answer it; no template words);
#   2. one worked example of the same kind of operation, as a user turn and the assistant's reply;
#   3. the real request: the operation's published method sentence and the instruction to evolve.
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

# One worked example per kind of operation: (lead, limit, marker, example task, example reply).
_UP_LIMIT = "Add only 10 to 20 words to the task.\n"
KINDS = {
    "up": ("Rewrite the task into a more complex version that is still reasonable and answerable.", _UP_LIMIT,
           MARKER_EVOLVE_REWRITE,
           "Tom has 15 marbles. He gives 6 to his sister. How many marbles does he have now?",
           "Tom has 15 marbles. He gives 6 to his sister and then buys twice as many as he gave away. How many "
           "marbles does he have now?"),
    "breadth": ("Create a brand new task.", "", MARKER_EVOLVE_CREATE,
                "Write a haiku about the sea.",
                "Write a haiku about a lighthouse keeper's last night before the light is automated."),
    "easier": ("Rewrite the task into an easier version.", "", MARKER_EVOLVE_REWRITE,
               "A shop sells pens at $1.20 each with 15% off for orders over 50 pens. What do 60 pens cost?",
               "A shop sells pens at $1 each. What do 6 pens cost?"),
    "new_easier_topic": ("Create a brand new, easier task.", "", MARKER_EVOLVE_CREATE,
                         "A shop sells pens at $1.20 each with 15% off for orders over 50 pens. What do 60 pens cost?",
                         "Anna has 3 apples and picks 2 more. How many apples does she have?"),
    "code": ("Increase the difficulty of the programming question a bit.", "", MARKER_EVOLVE_CODE,
             "Write a Python function that returns the largest number in a list.",
             "Write a Python function that returns the second largest distinct number in a list, or None if there "
             "is none, without sorting the list."),
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

# Strings that may never appear in an evolved instruction (elimination rule 4): the template words of the published
# prompts and of these.
FORBIDDEN_COPIES = ("#the given prompt#", "#rewritten prompt#", "given prompt", "rewritten prompt",
                    "#created prompt#", "created prompt", "#given question#", "#rewritten question#",
                    "rewritten task:", "created task:", "rewritten question:", "the new task only",
                    "rewrite the task")


# The first words of every method sentence, lower-case: a rewrite that repeats one copies the template (rule 4).
METHOD_OPENINGS = tuple(" ".join(m.lower().split()[:8]) for m in (*DEPTH_METHODS.values(), BREADTH_METHOD,
                                                                     *DOWN.values(), *CODE_METHODS.values()))


def _kind(operation: str) -> tuple[str, str]:
    """(kind of worked example, the operation's method sentence)."""
    if operation in DEPTH_METHODS:
        return "up", DEPTH_METHODS[operation].replace("#The Given Prompt#", "the task")
    if operation == "in_breadth":
        return "breadth", BREADTH_METHOD
    if operation in DOWN:
        return operation, DOWN[operation]
    if operation in CODE_METHODS:
        return "code", CODE_METHODS[operation]
    raise ValueError(f"unknown evolution operation {operation!r}")


def evolve_messages(operation: str, instruction: str) -> list[dict]:
    """The rewrite request of one operation: the rules, one worked example of its kind, then the instruction."""
    kind, method = _kind(operation)
    lead, limit, marker, example, reply = KINDS[kind]

    def ask(text: str) -> str:
        return ASK.format(lead=lead, method=method, limit=limit, instruction=text, marker=marker)

    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": ask(example)}, {"role": "assistant", "content": reply},
            {"role": "user", "content": ask(instruction)}]


def equal_messages(parent: str, child: str) -> list[dict]:
    return [{"role": "user", "content": EQUAL_JUDGE.format(parent=parent, child=child)}]

