"""Arithmetic word problems in template families, with answers computed twice, as a synthesis task folder (for the
learning run).

    FAMILIES                       16 template families: one to three operations (+, -, x, /), several steps,
                                   comparisons ("3 times as many", "5 fewer than"), money and change, and distractor
                                   numbers that the answer does not use
    HELD_OUT                       the families evaluated and never trained on (5 of 16)
    problems(n, seed, families)    n distinct seeded problems drawn from `families` (all by default)
    split_problems(n_train, n_eval, seed, held_out)
                                   training problems from the other families and evaluation problems from the held-out
                                   ones; a training problem whose numbers and answer equal an evaluation problem's
                                   (`numbers_key`) is drawn again, so none is shared
    text_program(statement)        a Python program written from the statement's text: each sentence is read by a
                                   sentence rule ("X has N items.", "Each bag holds N items.", "X has N fewer items
                                   than Y.", ...) shared by all families, and the question picks what it prints
    verify(problems, sandbox)      runs every problem's text program in evolforge's sandbox (one batch per chunk) and
                                   keeps the problems whose printed value equals the generator's answer
    write_task_folder(out, rows, lineage)  the kept problems as a synthesis output folder (OUT/data/train-...parquet in
                                   the tasks schema, kind "math", stage.json "synthesize") that `evolforge sft
                                   --tasks`, `evolforge eval --tasks` and the PPO data read; `lineage` "family" makes
                                   each family one seed lineage ("family/<name>", so ppo.held_out_seeds can hold out
                                   whole families), "problem" each problem its own

The two computations of an answer: the generator evaluates its family's formula on the numbers it drew; the checker
parses the rendered text back into a program with its own sentence rules (it never sees the formula nor the drawn
numbers) and runs it in the sandbox. A rendering slip (a number in the wrong slot, a distractor that the formula
uses) or a wrong formula shows as a disagreement. Both were written by one author from the same reading of each
family, so a misreading shared by both would not show.

Why a generator and not `evolforge synthesize` on the embedded model: the synthesis stage keeps a math proposal only
when the majority of its solver attempts agrees with the proposed answer, and the 135M model rarely proposes and
solves the same problem consistently; the learning run needs hundreds of verified tasks in minutes.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

NAMES = ("Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Ivy", "Jack", "Kara", "Leo", "Mia", "Noah",
         "Olga", "Pablo", "Quinn", "Rosa", "Sam", "Tara")
ITEMS = ("apples", "pencils", "marbles", "stickers", "books", "cookies", "coins", "shells", "cards", "flowers",
         "stamps", "balloons")


@dataclass(frozen=True)
class Family:
    name: str
    text: str  # sentences with {P} {Q} (names), {I} {J} (items) and number slots {a} {b} {c} {d}
    draw: Callable[[random.Random], dict[str, int]]  # the number slots
    formula: Callable[..., float]  # the generator's answer from the slots
    steps: int  # operations the answer needs
    distractor: bool = False  # a number in the text that the answer does not use


def _r(lo: int, hi: int):
    return lambda rng: rng.randint(lo, hi)


def _draw(**slots):
    return lambda rng: {k: f(rng) for k, f in slots.items()}


def _sub_draw(rng):  # a > b
    a = rng.randint(12, 90)
    return {"a": a, "b": rng.randint(2, a - 2)}


def _div_draw(rng):  # a = b * q
    b, q = rng.randint(2, 9), rng.randint(2, 15)
    return {"a": b * q, "b": b}


def _add_sub_draw(rng):
    a, b = rng.randint(5, 50), rng.randint(2, 40)
    return {"a": a, "b": b, "c": rng.randint(1, a + b - 1)}


def _sub_sub_draw(rng):
    a = rng.randint(20, 90)
    b = rng.randint(2, a // 2)
    return {"a": a, "b": b, "c": rng.randint(1, a - b - 1)}


def _days_draw(rng):
    a, b = rng.randint(2, 12), rng.randint(2, 9)
    return {"a": a, "b": b, "c": rng.randint(1, a * b - 1)}


def _change_draw(rng):
    a, b = rng.randint(2, 9), rng.randint(2, 12)
    return {"a": a, "b": b, "c": a * b + rng.randint(1, 30)}


def _share_rest_draw(rng):
    c, q = rng.randint(2, 8), rng.randint(2, 12)
    b = rng.randint(1, 30)
    return {"a": c * q + b, "b": b, "c": c}


def _fewer_draw(rng):
    a = rng.randint(10, 80)
    return {"a": a, "b": rng.randint(1, a - 1)}


def _boxes_give_draw(rng):
    a = rng.randint(3, 12)
    return {"a": a, "b": rng.randint(2, 12), "c": rng.randint(1, a - 1)}


FAMILIES = (
    Family("add", "{P} has {a} {I}. {P} gets {b} more {I}. How many {I} does {P} have now?",
           _draw(a=_r(2, 80), b=_r(2, 60)), lambda a, b: a + b, 1),
    Family("sub", "{P} has {a} {I}. {P} gives {b} {I} to a friend. How many {I} does {P} have left?",
           _sub_draw, lambda a, b: a - b, 1),
    Family("mul", "{P} buys {a} bags of {I}. Each bag holds {b} {I}. How many {I} does {P} buy in all?",
           _draw(a=_r(2, 12), b=_r(2, 12)), lambda a, b: a * b, 1),
    Family("div", "{P} has {a} {I}. {P} shares them equally among {b} friends. How many {I} does each friend get?",
           _div_draw, lambda a, b: a / b, 1),
    Family("add_sub", "{P} has {a} {I}. {P} gets {b} more {I}. {P} gives {c} {I} to a friend. How many {I} does {P} "
           "have now?", _add_sub_draw, lambda a, b, c: a + b - c, 2),
    Family("mul_add", "{P} buys {a} bags of {I}. Each bag holds {b} {I}. {P} also has {c} loose {I}. How many {I} "
           "does {P} have in all?", _draw(a=_r(2, 9), b=_r(2, 12), c=_r(1, 30)), lambda a, b, c: a * b + c, 2),
    Family("add_distractor", "{P} has {a} {I} and {d} {J}. {P} gets {b} more {I}. How many {I} does {P} have now?",
           _draw(a=_r(2, 80), b=_r(2, 60), d=_r(2, 60)), lambda a, b, d: a + b, 1, True),
    Family("times", "{P} has {a} {I}. {Q} has {b} times as many {I} as {P}. How many {I} does {Q} have?",
           _draw(a=_r(2, 20), b=_r(2, 9)), lambda a, b: a * b, 1),
    Family("more_total", "{P} has {a} {I}. {Q} has {b} more {I} than {P}. How many {I} do they have together?",
           _draw(a=_r(3, 50), b=_r(2, 30)), lambda a, b: a + (a + b), 2),
    Family("days_give", "{P} collects {a} {I} each day for {b} days. {P} gives {c} {I} to a friend. How many {I} "
           "does {P} have now?", _days_draw, lambda a, b, c: a * b - c, 2),
    Family("sub_sub", "{P} has {a} {I}. {P} gives {b} {I} to a friend. {P} loses {c} {I}. How many {I} does {P} "
           "have left?", _sub_sub_draw, lambda a, b, c: a - b - c, 2),
    # held out by default (HELD_OUT): each recombines operations the others train, in words they never show
    Family("mul_distractor", "{P} buys {a} bags of {I}. Each bag holds {b} {I}. Each bag costs {d} dollars. How many "
           "{I} does {P} buy in all?", _draw(a=_r(2, 12), b=_r(2, 12), d=_r(2, 20)), lambda a, b, d: a * b, 1, True),
    Family("change", "{P} buys {a} {I} at {b} dollars each. {P} pays with {c} dollars. How much change does {P} get in "
           "dollars?", _change_draw, lambda a, b, c: c - a * b, 2),
    Family("share_rest", "{P} has {a} {I}. {P} gives {b} {I} to a friend. {P} shares the rest equally among {c} "
           "friends. How many {I} does each friend get?", _share_rest_draw, lambda a, b, c: (a - b) / c, 2),
    Family("fewer_total", "{P} has {a} {I}. {Q} has {b} fewer {I} than {P}. How many {I} do they have together?",
           _fewer_draw, lambda a, b: a + (a - b), 2),
    Family("boxes_give", "{P} has {a} boxes with {b} {I} in each box. {P} gives {c} boxes to a friend. How many {I} "
           "does {P} have left?", _boxes_give_draw, lambda a, b, c: (a - c) * b, 2),
)
BY_NAME = {f.name: f for f in FAMILIES}
HELD_OUT = ("mul_distractor", "change", "share_rest", "fewer_total", "boxes_give")


def _slots(template: str) -> list[str]:
    return [s for s in re.findall(r"\{([a-d])\}", template)]


def numbers_key(row: dict) -> tuple:
    """What two problems may not share across the split: the numbers in the text (sorted) and the answer."""
    return tuple(sorted(row["numbers"])), row["generator_answer"]


def _one(family: Family, rng: random.Random) -> dict:
    nums = family.draw(rng)
    p, q = rng.sample(NAMES, 2)
    i, j = rng.sample(ITEMS, 2)
    statement = family.text.format(P=p, Q=q, I=i, J=j, **nums)
    value = family.formula(**nums)
    seen, numbers = set(), []
    for s in _slots(family.text):  # each slot once, in the order the text shows them
        if s not in seen:
            seen.add(s)
            numbers.append(nums[s])
    return {"family": family.name, "template": family.name, "statement": statement, "numbers": numbers,
            "generator_answer": int(value) if float(value).is_integer() else value, "steps": family.steps,
            "distractor": family.distractor}


def problems(n: int, seed: int = 0, families: tuple[str, ...] | None = None, avoid: set | None = None,
             prefix: str = "arith") -> list[dict]:
    """n distinct problems from `families` (all by default), in a seeded order; none whose `numbers_key` is in
    `avoid`. Each has id, family (= template), statement, numbers, generator_answer, steps, distractor, program."""
    fams = [BY_NAME[f] for f in (families or [f.name for f in FAMILIES])]
    rng, out, seen = random.Random(seed), [], set()
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 200 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct problems from {[f.name for f in fams]}")
        row = _one(fams[len(out) % len(fams)] if len(fams) > 1 else fams[0], rng)
        if row["statement"] in seen or (avoid and numbers_key(row) in avoid):
            continue
        seen.add(row["statement"])
        out.append({"id": f"{prefix}-{len(out):05d}", **row, "program": text_program(row["statement"])})
    return out


def split_problems(n_train: int, n_eval: int, seed: int = 0,
                   held_out: tuple[str, ...] = HELD_OUT) -> tuple[list[dict], list[dict]]:
    """(training problems of the other families, evaluation problems of the held-out families); no training problem
    shares its numbers and answer with an evaluation problem."""
    if not held_out or set(held_out) - set(BY_NAME):
        raise ValueError(f"held_out must name families of {sorted(BY_NAME)}")
    trained = tuple(f.name for f in FAMILIES if f.name not in held_out)
    evals = problems(n_eval, seed + 1, held_out, prefix="eval")
    train = problems(n_train, seed, trained, avoid={numbers_key(r) for r in evals}, prefix="train")
    return train, evals


# --- the second computation: the statement's text, read sentence by sentence -----------------------------------------

_W = r"([A-Z][a-z]+)"  # a name
_N = r"(\d+)"
_T = r"([a-z]+)"  # an item
SENTENCE_RULES: tuple[tuple[str, str], ...] = (
    (rf"{_W} has {_N} {_T} and {_N} {_T}", "c[({0!r}, {2!r})] = {1}\nc[({0!r}, {4!r})] = {3}"),
    (rf"{_W} has {_N} boxes with {_N} {_T} in each box", "box[{0!r}] = [{1}, {2}, {3!r}]\n"
     "c[({0!r}, {3!r})] = {1} * {2}"),
    (rf"{_W} has {_N} times as many {_T} as {_W}", "c[({0!r}, {2!r})] = {1} * c[({3!r}, {2!r})]"),
    (rf"{_W} has {_N} more {_T} than {_W}", "c[({0!r}, {2!r})] = c[({3!r}, {2!r})] + {1}"),
    (rf"{_W} has {_N} fewer {_T} than {_W}", "c[({0!r}, {2!r})] = c[({3!r}, {2!r})] - {1}"),
    (rf"{_W} has {_N} {_T}", "c[({0!r}, {2!r})] = {1}"),
    (rf"{_W} gets {_N} more {_T}", "c[({0!r}, {2!r})] = c.get(({0!r}, {2!r}), 0) + {1}"),
    (rf"{_W} gives {_N} boxes to a friend", "box[{0!r}][0] -= {1}\n"
     "c[({0!r}, box[{0!r}][2])] = box[{0!r}][0] * box[{0!r}][1]"),
    (rf"{_W} gives {_N} {_T} to a friend", "c[({0!r}, {2!r})] -= {1}"),
    (rf"{_W} loses {_N} {_T}", "c[({0!r}, {2!r})] -= {1}"),
    (rf"{_W} buys {_N} bags of {_T}", "bags = ({0!r}, {1}, {2!r})"),
    (rf"Each bag holds {_N} {_T}", "c[(bags[0], {1!r})] = c.get((bags[0], {1!r}), 0) + bags[1] * {0}"),
    (rf"Each bag costs {_N} dollars", "spent[bags[0]] = spent.get(bags[0], 0) + bags[1] * {0}"),
    (rf"{_W} also has {_N} loose {_T}", "c[({0!r}, {2!r})] = c.get(({0!r}, {2!r}), 0) + {1}"),
    (rf"{_W} shares them equally among {_N} friends", "share = last_count / {1}"),
    (rf"{_W} shares the rest equally among {_N} friends", "share = last_count / {1}"),
    (rf"{_W} collects {_N} {_T} each day for {_N} days", "c[({0!r}, {2!r})] = c.get(({0!r}, {2!r}), 0) + {1} * {3}"),
    (rf"{_W} buys {_N} {_T} at {_N} dollars each", "spent[{0!r}] = spent.get({0!r}, 0) + {1} * {3}\n"
     "c[({0!r}, {2!r})] = c.get(({0!r}, {2!r}), 0) + {1}"),
    (rf"{_W} pays with {_N} dollars", "paid[{0!r}] = {1}"),
)
QUESTION_RULES: tuple[tuple[str, str], ...] = (
    (rf"How many {_T} does each friend get", "answer = share"),
    (rf"How many {_T} do they have together", "answer = sum(v for (who, what), v in c.items() if what == {0!r})"),
    (rf"How much change does {_W} get in dollars", "answer = paid[{0!r}] - spent[{0!r}]"),
    (rf"How many {_T} does {_W} (?:have|buy)(?: now| left| in all)?", "answer = c[({1!r}, {0!r})]"),
)


def text_program(statement: str) -> str:
    """A Python program computing the statement's answer, written from its sentences (ValueError when a sentence
    matches no rule). `last_count` is the count the previous sentence left for its subject."""
    sentences = [s.strip() for s in re.split(r"(?<=[.?])\s+", statement.strip()) if s.strip()]
    lines = ["c, box, spent, paid = {}, {}, {}, {}", "last_count = None"]
    for s in sentences:
        body = s.rstrip(".?")
        rules = QUESTION_RULES if s.endswith("?") else SENTENCE_RULES
        for pattern, code in rules:
            m = re.fullmatch(pattern, body)
            if m:
                lines.append(code.format(*m.groups()))
                if not s.endswith("?") and m.groups() and re.fullmatch(_W, m.group(1) or ""):
                    lines.append(f"last_count = max((v for (who, _), v in c.items() if who == {m.group(1)!r}), "
                                 "default=last_count)")
                break
        else:
            raise ValueError(f"no rule reads the sentence {s!r}")
    lines.append("print(int(answer) if float(answer).is_integer() else answer)")
    return "\n".join(lines) + "\n"


def verify(rows: list[dict], sandbox, chunk: int = 100) -> list[dict]:
    """The rows whose text program, run in the sandbox, prints the generator's answer; each gets `answer` and
    `verified`. `chunk` programs share one sandbox run (each in a function of its own, printing its id and value)."""
    from evolforge.tasks.sandbox.run import run_python_program

    kept = []
    for i in range(0, len(rows), chunk):
        part = rows[i:i + chunk]
        code = "".join(f"def p{j}():\n" + "".join(f"    {line}\n" for line in r["program"].splitlines()) +
                       f"print('{r['id']}', end=' ')\np{j}()\n" for j, r in enumerate(part))
        res = run_python_program(code, None, sandbox)
        printed = dict(line.split(" ", 1) for line in (res.stdout or "").splitlines() if " " in line)
        for r in part:
            if res.exit_code == 0 and printed.get(r["id"], "").strip() == str(r["generator_answer"]):
                kept.append({**r, "answer": printed[r["id"]].strip(),
                             "verified": "the text's program, run in the sandbox, printed the generator's value"})
    return kept


def write_task_folder(out: str | Path, rows: list[dict], lineage: str = "problem") -> Path:
    """The rows as a synthesis stage's output folder (kept math tasks); returns the tasks table's path. `lineage`:
    "family" (seed_id "family/<name>") or "problem" (seed_id = the problem's id)."""
    import pyarrow as pa

    from evolforge.storage.parts import write_table_atomic
    from evolforge.storage.synthesis_sets import TASK_SCHEMA, SynthLayout

    if lineage not in ("family", "problem"):
        raise ValueError(f"lineage must be family or problem, got {lineage!r}")
    lay = SynthLayout(out)
    Path(lay.root).mkdir(parents=True, exist_ok=True)
    table = [{"task_id": r["id"], "seed_id": f"family/{r['family']}" if lineage == "family" else r["id"],
              "kind": "math", "status": "kept", "reject_reason": None,
              "statement": r["statement"], "entry_point": None, "solution": None, "tests": None, "answer": r["answer"],
              "difficulty": "easy" if r["steps"] == 1 else "medium", "pass_rate": None, "solver_passes": None,
              "solver_attempts": None, "repairs": 0, "sandbox_seconds": None, "wall_seconds": None,
              "attempts": json.dumps([{"phase": "generator", "template": r["family"], "numbers": r["numbers"],
                                       "program": r["program"], "verified": r["verified"]}])} for r in rows]
    path = write_table_atomic(pa.Table.from_pylist(table, schema=TASK_SCHEMA), lay.tasks)
    lay.start_marker("synthesize")
    lay.finish_marker("synthesize", {"kept": len(rows)})
    return Path(str(path))
