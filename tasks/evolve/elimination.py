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
Plus `empty_evolution`: the rewriter returned nothing usable.
A failed instruction's parent goes back into the pool for the next round.
The cheap rules run before any further model call is spent.
"""

from __future__ import annotations

import re
import string
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from evolforge.tasks.core.json_parse import JSONParseFailure, extract_json
from evolforge.tasks.evolve.prompts import FORBIDDEN_COPIES

RULE_EQUAL = "no_information_gain"
RULE_SORRY = "sorry_short_answer"
RULE_PUNCT = "answer_only_punctuation"
RULE_COPY = "copies_prompt_words"
RULE_EMPTY = "empty_evolution"

STOP_WORDS = frozenset(
    """a an and are as at be but by for from has have he her his i if in into is it its me my no not of on or our
    she so than that the their them then there these they this to too us was we were what when which who will with
    you your yes ok okay""".split()
)
_WORD = re.compile(r"[A-Za-z0-9']+")


def copies_prompt_words(instruction: str) -> bool:
    low = instruction.lower()
    return any(s in low for s in FORBIDDEN_COPIES)


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


def instruction_rule(instruction: str) -> str | None:
    """Rules that need no model call: run them first."""
    if is_empty(instruction):
        return RULE_EMPTY
    if copies_prompt_words(instruction):
        return RULE_COPY
    return None


def answer_rule(answer: str, sorry_max_words: int = 80) -> str | None:
    if sorry_and_short(answer, sorry_max_words):
        return RULE_SORRY
    if only_punctuation_and_stop_words(answer):
        return RULE_PUNCT
    return None
