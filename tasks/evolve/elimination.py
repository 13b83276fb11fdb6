"""The four published elimination rules of Evol-Instruct (WizardLM, section 3.3).

An evolution fails when
  1. `no_information_gain`: the judge finds it Equal to its parent (same constraints
     and requirements, same depth and breadth) -- see `parse_equal_reply`: the call asks
     for `EqualVerdict` ({"verdict": "Equal" | "Not Equal"}, response_format json_schema)
     and a prompt-only reply is read as text by `parse_equal_verdict`;
  2. `sorry_short_answer`: the answer contains "sorry" and is under 80 words;
  3. `answer_only_punctuation`: the answer is only punctuation and stop words;
  4. `copies_prompt_words`: the instruction copies words of the evolving prompt
     ("given prompt", "rewritten prompt", "#Rewritten Prompt#", ...).
Plus two rules of evolforge's own, for rewriters that do not follow the prompt (small models often don't):
  - `empty_evolution`: the rewriter returned nothing usable;
  - `not_an_instruction`: the rewrite poses no task: it answers its parent (or some task) instead, or is a
    poem, story or statement with no question or request in it (`not_an_instruction`).
A failed instruction's parent goes back into the pool for the next round.
`RULE_WORDS` says what each rule means in plain words; every report a user reads names rules by those words.
The cheap rules run before any further model call is spent.
"""

from __future__ import annotations

import re
import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from evolforge.tasks.core.json_parse import JSONParseFailure, extract_json
from evolforge.tasks.evolve.prompts import FORBIDDEN_COPIES, METHOD_OPENINGS

RULE_EQUAL = "no_information_gain"
RULE_SORRY = "sorry_short_answer"
RULE_PUNCT = "answer_only_punctuation"
RULE_COPY = "copies_prompt_words"
RULE_EMPTY = "empty_evolution"
RULE_NOT_TASK = "not_an_instruction"

# What each rule means, for the terminal, the dataset card, the Prefect artifacts and the plots.
RULE_WORDS = {
    RULE_EQUAL: "no more demanding than its parent (the judge found them equal)",
    RULE_SORRY: "the answer was a short apology",
    RULE_PUNCT: "the answer was only punctuation and stop words",
    RULE_COPY: "copied the rewriting prompt's template words (e.g. '#The Given Prompt#')",
    RULE_EMPTY: "the rewriter returned nothing usable",
    RULE_NOT_TASK: "answered or wrote something else instead of a new instruction",
}


def rule_words(rule: str) -> str:
    """A rule in plain words; a round's dedup step names its drops `duplicate_<method>` (an unknown rule name is
    returned as it is)."""
    if rule.startswith("duplicate_") and rule not in RULE_WORDS:
        return f"duplicated an instruction kept earlier ({rule.removeprefix('duplicate_')} match)"
    return RULE_WORDS.get(rule, rule)

STOP_WORDS = frozenset(
    """a an and are as at be but by for from has have he her his i if in into is it its me my no not of on or our
    she so than that the their them then there these they this to too us was we were what when which who will with
    you your yes ok okay do does did""".split()
)
_WORD = re.compile(r"[A-Za-z0-9']+")


def copies_prompt_words(instruction: str) -> bool:
    """The rewrite contains the rewriting prompt's template words, or repeats one of its method sentences."""
    low = " ".join(instruction.lower().split())
    return any(s in low for s in FORBIDDEN_COPIES) or any(m in low for m in METHOD_OPENINGS)


# A task asks something: a question, or a sentence that starts with a request ("Write ...", "Find ...").
_REQUEST_VERBS = frozenset(
    """write create explain describe list give find calculate compute determine implement design compose summarize
    summarise translate compare identify name suggest provide generate make draw solve show prove estimate classify
    rewrite convert outline discuss evaluate analyze analyse develop propose plan build predict tell imagine suppose
    consider assume given use count sort return print define state recommend choose select decide rank simplify
    express find convert fill complete answer help construct derive approximate check verify format extract
    explore brainstorm argue justify illustrate demonstrate predict reverse merge split parse read calculate fix
    combine synthesize synthesise debug refactor modify introduce""".split()
)
_QUESTION_WORDS = ("how ", "what ", "which ", "why ", "who ", "can you", "could you",
                   "would you", "please ", "your task", "you are given", "imagine ", "suppose ", "the task is to ",
                   "you need to ", "you'll need a ")
# An answer or a reply speaks: it agrees, computes a result, or concludes.
_ANSWER_OPENINGS = re.compile(r"^\W*(sure|certainly|of course|here is|here's|here are|yes\b|no,|i am\b|i'm\b|"
                              r"what an? [\w ,'-]{1,40}!|"  # a reaction: "What a simple task!"
                              r"i will\b|i would\b|as an ai|great question|absolutely|okay|ok\b|you can\b|"
                              r"you could\b|let's\b|let me\b|when i\b|i'd\b|i'll\b|to (find|solve|calculate|determine|answer|"
                              r"do this|optimize|improve)\b|```)", re.I)
_ANSWER_MARKS = re.compile(r"the answer is|the solution is|final answer|\bstep 1\s*:|\btherefore\b|\bin conclusion\b|"
                           r"\bthis will (return|print|output|give)\b|\bhere's (a|an|the)\b|"
                           r"\d\s*[-+*/x\u00d7]\s*\d+(?:\.\d+)?\s*=\s*\$?\d|"
                           r"\d+\s*[a-z]{1,3}\s*[x\u00d7*]\s*\d+(?:\.\d+)?\s*[a-z]{0,3}\s*=\s*\$?\d", re.I)  # 8m x 5m = 40m
# talk about the rewriting or about the task instead of the task: "Here's how it could be rewritten ...",
# "The new task is: ...", "This task is extremely challenging and requires ...", "... to the original task."
_META_TALK = re.compile(r"\b(could|can|should|would|will) be rewritten\b|\brewritten to be\b|"
                        r"\b(the|a|my|your|this) new (task|prompt|instruction|question) (is|would be|could be|will be)\b|"
                        r"(^|[.!\n]\s*)this (task|problem|question|prompt) (is|seems) (\w+ ){0,2}"
                        r"(challenging|difficult|simple|easy|hard|complex|tricky)\b|"
                        r"\bthe original (task|prompt|instruction)\b", re.I)
# a question answered right after it: "What is the area ...? The area is 40 m².", "(The answer is ...)", "The
# answer to this question revolves around ..."
_ANSWERED_QUESTION = re.compile(r"\?\s+[^?]*\b(is|are|equals|was|will be)\s+(about\s+)?\$?\d[^?]*$|"
                                r"\?[^?]*\b(the answer is|the solution is|answer:)|"
                                r"\?\W*(the )?(answer|solution)( to (this|the) (question|problem|task))?\s+"
                                r"(is|are|was|lies|revolves|depends|comes)\b", re.I)
# a sum worked out to a quantity or a price, even with a question after it: "he will have 10 - 2 = 7 marbles left",
# "420/35 = 10 students", "the tip, which is 36 - 6 = $24", "180 / 3 ≈ 45 kilometres per hour" (a task states
# its numbers; it does not compute them: "If 3 * 4 = 12, what is 3 * 8?" is a task)
_WORKED_SUM = re.compile(r"\d\s*[-+*/x\u00d7\u00f7]\s*\d+(?:\.\d+)?\s*[=\u2248]\s*(\$\d|\d+(?:\.\d+)?\s*%?\s*[a-z])",
                         re.I)
# an answer under a question as its heading: "Why the sky looks blue during the day: The sky's a canvas ..."
_HEADED_ANSWER = re.compile(r"^\W*(why|how|what|which|who|when)\b[^?:\n]{3,150}:\s*(?P<rest>[^?]*)$", re.I | re.S)
# text caught in a loop: the same one to four words four times or more in a row ("max() max() max() max() ...",
# "A leaf, a leaf, a leaf, a leaf")
_LOOP = re.compile(r"\b(\w+(?:\W+\w+){0,3})(?:\W+\1\b){3,}", re.I)
# a solution written out: a function or class defined in code (a rewrite of a coding task that solves it)
_SOLUTION_CODE = re.compile(r"^\s*(def|class|function|public|int|void)\s+\w+\s*[(:{<]|^\s*(SELECT|CREATE TABLE)\b",
                            re.M | re.I)
# operations whose rewrite may carry code as part of the task (an input, an erroneous reference)
CODE_IN_TASK = frozenset({"complicate_input", "code_erroneous_reference"})
# advice, not a request: "When writing an email, make sure to ..."
_ADVICE = re.compile(r"make sure\b|make certain\b", re.I)
# a how-to, not a task: "To write a clear email, focus on clarity ...", "When comparing X, look at ..." (with no
# question in it)
_HOW_TO = re.compile(r"^\W*(to|when|while|before|after) \w+[^,.?\n]{0,120},\s*(focus|use|avoid|consider|be|keep|"
                     r"remember|try|start|make sure|ensure|include|think|aim|stay|look|always|never|utilize)\b", re.I)
_SENTENCE = re.compile(r"(?:^|[.!:;,\n]\s*|\bso\s+)([A-Za-z][A-Za-z']*)")


def poses_task(instruction: str) -> bool:
    """The text asks something: it has a question mark, a question word, or a sentence opening with a request."""
    low = " ".join(instruction.lower().split())
    if "?" in low or any(low.startswith(w) or f". {w}" in low or f"\n{w}" in low for w in _QUESTION_WORDS):
        return True
    return any(m.group(1).lower() in _REQUEST_VERBS and not _ADVICE.match(instruction, m.start(1))
               for m in _SENTENCE.finditer(instruction))


def repeats_itself(text: str) -> bool:
    """The same one to four words come four times or more in a row: a small model's loop, not a task."""
    return bool(_LOOP.search(text))


def not_an_instruction(instruction: str, operation: str | None = None) -> bool:
    """Rule `not_an_instruction`: the rewrite answers (opens like a reply or a reaction, states 'the answer is',
    works a sum out as 'a * b = c' with no question left or to a quantity ('10 - 2 = 7 marbles'), answers its own
    question or writes the answer under the question as a heading ('Why the sky is blue: The sky ...'), or writes
    the solution's code when the operation asks for none), talks about the rewriting or the task instead of posing
    it ('here's how it could be rewritten', 'the new task is', 'this task is challenging'), repeats itself in a
    loop, or asks nothing at all (a poem, a story, a statement, advice: 'make sure to ...' is no request, nor a
    how-to: 'To write a clear email, focus on ...')."""
    text = instruction.strip().lstrip("#* ").strip()
    if _ANSWER_OPENINGS.match(text) or _ANSWERED_QUESTION.search(text) or _META_TALK.search(text):
        return True
    if _WORKED_SUM.search(text) or repeats_itself(text):
        return True
    headed = _HEADED_ANSWER.match(text)
    if headed and not poses_task(headed.group("rest")):
        return True
    if _HOW_TO.match(text) and "?" not in text:
        return True
    if operation not in CODE_IN_TASK and _SOLUTION_CODE.search(text):
        return True
    if not poses_task(text):
        return True
    marks = _ANSWER_MARKS.findall(text)
    return bool(marks) and "?" not in text and not re.match(r"^\W*(solve|compute|calculate|check|verify|simplify|"
                                                            r"evaluate|prove|explain|find)\b", text, re.I)


def adds_no_information(parent: str, child: str) -> bool:
    """Rule 1 without a model (`evol_instruct.equal_judge = 'words'`): the child adds no word, number or name that
    its parent lacks (case and stop words aside), so it cannot ask for more than its parent does."""
    def words(text: str) -> set[str]:
        return {w for w in (m.lower().strip("'") for m in _WORD.findall(text)) if w and w not in STOP_WORDS}

    return not (words(child) - words(parent))


def is_empty(instruction: str) -> bool:
    return len(_WORD.findall(instruction)) < 2


def sorry_and_short(answer: str, max_words: int = 80) -> bool:
    return "sorry" in answer.lower() and len(answer.split()) < max_words


def only_punctuation_and_stop_words(answer: str) -> bool:
    stripped = answer.translate(str.maketrans("", "", string.punctuation)).strip()
    if not stripped:
        return True
    return all(w.lower() in STOP_WORDS for w in _WORD.findall(stripped)) or not _WORD.findall(stripped)


def parse_equal_verdict(text: str) -> str | None:
    """'equal', 'not_equal' or None (unparseable). 'Not Equal' wins over a bare 'Equal'."""
    low = " ".join(text.lower().replace("-", " ").split())
    if re.search(r"\bnot\s+equal\b|\bunequal\b|\bnot\s+the\s+same\b|\bdifferent\b", low):
        return "not_equal"
    if re.search(r"\bequal\b|\bsame\b", low):
        return "equal"
    return None


class EqualVerdict(BaseModel):
    """The schema the Equal judge's call asks for (the published prompt's two answers, as JSON)."""

    model_config = ConfigDict(extra="forbid")
    verdict: Literal["Equal", "Not Equal"]


# {"verdict": "Not Equal"} is about 8 tokens, but a grammar-constrained small model may spell it a character at a
# time with whitespace between the keys (24 tokens measured on the embedded model); a text reply takes 2-3
EQUAL_JUDGE_MAX_TOKENS = 64


def parse_equal_reply(text: str) -> str | None:
    """'equal', 'not_equal' or None: the schema's JSON when the reply is that, else the text reading."""
    try:
        verdict = EqualVerdict.model_validate(extract_json(text, dict)).verdict
        return "equal" if verdict == "Equal" else "not_equal"
    except (JSONParseFailure, ValidationError):
        return parse_equal_verdict(text or "")


def instruction_rule(instruction: str, operation: str | None = None) -> str | None:
    """Rules that need no model call: run them first."""
    if is_empty(instruction):
        return RULE_EMPTY
    if copies_prompt_words(instruction):
        return RULE_COPY
    if not_an_instruction(instruction, operation):
        return RULE_NOT_TASK
    return None


def answer_rule(answer: str, sorry_max_words: int = 80) -> str | None:
    if sorry_and_short(answer, sorry_max_words):
        return RULE_SORRY
    if only_punctuation_and_stop_words(answer):
        return RULE_PUNCT
    return None
