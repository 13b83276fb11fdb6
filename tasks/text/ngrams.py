"""Decontamination by word n-gram overlap (open-r1's scripts/decontaminate.py: 8-grams).

A training text is contaminated when it shares at least one word n-gram with an evaluation text. Words are the
lower-cased runs of letters and digits (punctuation and whitespace do not count), so formatting changes do not
hide an overlap. Stdlib only.

    index = NgramIndex(n=8)
    index.add("humaneval", "HumanEval/0", problem_text)      # every evaluation text, named by its set and id
    hits = index.matches(training_text)                      # {(set, id), ...} it overlaps; empty: clean
    report = check_table("evolved", rows, text_of, index)    # per table: checked, overlapping, by eval set, ids
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str | None) -> list[str]:
    return _WORD.findall((text or "").lower())


def ngrams(text: str | None, n: int) -> set[tuple[str, ...]]:
    """The word n-grams of `text`; a text shorter than n words has none (it cannot overlap)."""
    w = words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


@dataclass
class NgramIndex:
    """Every n-gram of the evaluation texts, each with the (eval set, item id) pairs it occurs in."""

    n: int = 8
    grams: dict[tuple[str, ...], set[tuple[str, str]]] = field(default_factory=dict)
    items: dict[str, int] = field(default_factory=dict)  # eval set -> items indexed

    def add(self, eval_set: str, item_id: str, text: str) -> None:
        self.items[eval_set] = self.items.get(eval_set, 0) + 1
        for g in ngrams(text, self.n):
            self.grams.setdefault(g, set()).add((eval_set, item_id))

    def matches(self, text: str | None) -> set[tuple[str, str]]:
        found: set[tuple[str, str]] = set()
        for g in ngrams(text, self.n):
            found |= self.grams.get(g, set())
        return found

    def __len__(self) -> int:
        return len(self.grams)


def check_table(name: str, rows: Iterable[dict], text_of: Callable[[dict], str], index: NgramIndex,
                id_of: Callable[[dict], str] = lambda r: str(r.get("id"))) -> tuple[list[bool], dict]:
    """(per row: overlaps an evaluation text, the table's report): rows checked, overlapping, overlapping per
    eval set, and up to 20 examples (row id, eval set, eval item)."""
    flags, by_set, examples = [], {}, []
    for row in rows:
        hits = index.matches(text_of(row))
        flags.append(bool(hits))
        for eval_set in {s for s, _ in hits}:
            by_set[eval_set] = by_set.get(eval_set, 0) + 1
        if hits and len(examples) < 20:
            s, item = sorted(hits)[0]
            examples.append({"row": id_of(row), "eval_set": s, "eval_item": item})
    return flags, {"table": name, "ngram": index.n, "checked": len(flags), "overlapping": sum(flags),
                   "by_eval_set": by_set, "examples": examples}
