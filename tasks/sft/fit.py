"""Per-turn SFT samples of long agent sessions that fit a token budget (`sft.max_length`), the completion whole.

An agent session's turns are 9k-20k tokens of context each (system prompt, tool schemas, old tool output); a
prompt-completion row longer than the budget would be cut by the trainer from the right, losing the completion,
and a set of such rows trains on nothing. `fit_turn` shortens the prompt from the left instead, in this order,
each step only as far as needed (a binary search over its size):

1. the oldest turns after the leading system message(s) are dropped, whole (the prompt's last message, the one
   the completion answers, always stays);
2. then the texts that remain in the prompt (the system prompt, the last message: an old tool output first in
   practice) are cut to a character budget, keeping each text's head and tail around a `[... N characters cut
   ...]` marker;
3. a turn whose completion, tool schemas and cut prompt still pass the budget is left out (counted, with the
   figures in its reason), never cut.

`fit_rows` does it for the rows of a dataset and counts what it did (`rows_fitting`, `rows_shortened`,
`rows_too_long`); it raises ValueError naming the lengths when no row is left. `count` is the caller's token
count of a (prompt, completion, tools) as the trainer renders it (the policy's chat template).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("evolforge.sft")

Count = Callable[[list[dict], list[dict], list | None], int]
CUT_MARK = "\n[... {n} characters cut ...]\n"


@dataclass
class Fitted:
    prompt: list[dict] | None  # None: the turn cannot fit
    tokens: int  # of the row as returned (or, when it cannot fit, of its shortest form)
    dropped_messages: int = 0
    cut_chars: int = 0


def _cut(text: str, budget: int) -> str:
    if len(text) <= budget:
        return text
    head = budget // 2
    tail = budget - head
    return text[:head] + CUT_MARK.format(n=len(text) - budget) + (text[len(text) - tail:] if tail else "")


def _search(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The smallest x in lo..hi with ok(x), for an ok that stays true once it is (None when ok(hi) is false)."""
    if not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def fit_turn(prompt: list[dict], completion: list[dict], tools: list | None, count: Count,
             max_length: int) -> Fitted:
    """The prompt of one turn shortened from the left until prompt + completion fit `max_length` tokens."""
    n = count(prompt, completion, tools)
    if n <= max_length:
        return Fitted(prompt, n)
    lead = 0
    while lead < len(prompt) - 1 and prompt[lead].get("role") == "system":
        lead += 1
    head, body = prompt[:lead], prompt[lead:]
    sizes: dict[int, int] = {}

    def dropped(k: int) -> list[dict]:
        return head + body[k:]

    def fits_dropping(k: int) -> bool:
        sizes[k] = count(dropped(k), completion, tools)
        return sizes[k] <= max_length

    last = max(len(body) - 1, 0)
    k = _search(0, last, fits_dropping)
    if k is not None:
        return Fitted(dropped(k), sizes[k], dropped_messages=k)
    kept = dropped(last)
    longest = max((len(m["content"]) for m in kept if isinstance(m.get("content"), str)), default=0)
    cuts: dict[int, tuple[list[dict], int]] = {}

    def cut_to(budget: int) -> list[dict]:
        return [{**m, "content": _cut(m["content"], budget)} if isinstance(m.get("content"), str) else m
                for m in kept]

    def fits_cut(excess: int) -> bool:  # `excess`: characters cut from the longest text (monotone in it)
        msgs = cut_to(longest - excess)
        cuts[excess] = (msgs, count(msgs, completion, tools))
        return cuts[excess][1] <= max_length

    excess = _search(0, longest, fits_cut)
    if excess is None:
        return Fitted(None, cuts[longest][1], dropped_messages=last)
    msgs, tokens = cuts[excess]
    chars = sum(len(m["content"]) for m in kept if isinstance(m.get("content"), str)) - \
        sum(len(m["content"]) for m in cut_to(longest - excess) if isinstance(m.get("content"), str))
    return Fitted(msgs, tokens, dropped_messages=last, cut_chars=max(chars, 0))


def fit_rows(samples: list[dict], rows: list[dict], count: Count, max_length: int,
             report: dict | None = None) -> list[dict]:
    """The samples (prompt, completion, tools as JSON text; `rows` the stored rows they came from, for their id and
    source) whose trajectory turns are fitted to `max_length` tokens; other sources pass as they are (the
    trainer truncates them as before). `report` gets the counts and the ids of the turns left out."""
    out, shortened, too_long, fitting, examples = [], 0, 0, 0, []
    for sample, row in zip(samples, rows):
        if row.get("source") != "trajectory":
            out.append(sample)
            continue
        tools = json.loads(sample["tools"]) if sample.get("tools") else None
        f = fit_turn(sample["prompt"], sample["completion"], tools, count, max_length)
        if f.prompt is None:
            too_long += 1
            if len(examples) < 5:
                examples.append(f"{row.get('id')}: {f.tokens} tokens with only its last prompt message left")
            continue
        if f.prompt is sample["prompt"]:
            fitting += 1
        else:
            shortened += 1
        out.append({**sample, "prompt": f.prompt})
    figures = {"max_length": max_length, "trajectory_rows_fitting": fitting,
               "trajectory_rows_shortened": shortened, "trajectory_rows_too_long": too_long}
    if report is not None:
        report.update(figures)
        report["trajectory_rows_too_long_examples"] = examples
    if shortened or too_long:
        log.warning("trajectory turns over sft.max_length = %d tokens: %d shortened from the left (old turns "
                    "dropped, then old texts cut; the completion kept whole), %d left out as too long even so%s",
                    max_length, shortened, too_long, f" (e.g. {examples[0]})" if examples else "")
    if not out:
        raise ValueError(
            f"no row fits sft.max_length = {max_length} tokens: all {too_long} trajectory turns are longer even "
            f"with their context cut to the last message (e.g. {examples[0] if examples else '?'}); raise "
            "sft.max_length (up to the policy's positions) or shorten the tool schemas")
    return out
