"""Arithmetic word problems with program-checked answers, as a synthesis stage's task folder (for the learning run).

    problems(n, seed)              n seeded word problems of one or two operations (+, -, x, /) over small whole
                                   numbers; each carries the Python expression that defines it
    verify(problems, sandbox)      runs every problem's expression as a program in evolforge's sandbox (one batch)
                                   and keeps the problems whose printed value equals the generator's own evaluation:
                                   two independent computations of the answer, neither written by hand
    write_task_folder(out, rows)   the kept problems as a synthesis output folder (OUT/data/train-...parquet in the
                                   tasks schema, kind "math", each problem its own seed lineage, stage.json
                                   "synthesize")
                                   that `evolforge sft --tasks`, `evolforge eval --tasks` and the PPO data read

Why a generator and not `evolforge synthesize` on the embedded model: the synthesis stage keeps a math proposal only
when the majority of its solver attempts agrees with the proposed answer, and the 135M model rarely proposes and
solves the same problem consistently; the learning run needs hundreds of verified tasks in minutes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ("Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Ivy", "Jack", "Kara", "Leo", "Mia", "Noah",
         "Olga", "Pablo", "Quinn", "Rosa", "Sam", "Tara")
ITEMS = ("apples", "pencils", "marbles", "stickers", "books", "cookies", "coins", "shells", "cards", "flowers",
         "stamps", "balloons")

# (template, expression over a, b, c, how the numbers are drawn)
TEMPLATES = (
    ("{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?", "a + b", "add"),
    ("{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?", "a - b", "sub"),
    ("{name} buys {a} bags of {item}. Each bag holds {b} {item}. How many {item} does {name} buy in all?", "a * b",
     "mul"),
    ("{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?", "a // b", "div"),
    ("{name} has {a} {item}, buys {b} more, then gives away {c}. How many {item} does {name} have now?",
     "a + b - c", "add_sub"),
    ("{name} has {a} boxes with {b} {item} in each box, and {c} loose {item}. How many {item} does {name} have?",
     "a * b + c", "mul_add"),
)


def _numbers(kind: str, rng: random.Random) -> dict[str, int]:
    if kind == "add":
        return {"a": rng.randint(2, 60), "b": rng.randint(2, 40)}
    if kind == "sub":
        a = rng.randint(10, 80)
        return {"a": a, "b": rng.randint(1, a - 1)}
    if kind == "mul":
        return {"a": rng.randint(2, 9), "b": rng.randint(2, 12)}
    if kind == "div":
        b, q = rng.randint(2, 9), rng.randint(2, 12)
        return {"a": b * q, "b": b}
    if kind == "add_sub":
        a, b = rng.randint(5, 40), rng.randint(2, 30)
        return {"a": a, "b": b, "c": rng.randint(1, a + b - 1)}
    return {"a": rng.randint(2, 9), "b": rng.randint(2, 9), "c": rng.randint(1, 20)}  # mul_add


def problems(n: int, seed: int = 0) -> list[dict]:
    """n distinct problems (statement, expression, numbers, generator answer, kind of template)."""
    rng, out, seen = random.Random(seed), [], set()
    while len(out) < n:
        template, expr, kind = TEMPLATES[rng.randrange(len(TEMPLATES))]
        nums = _numbers(kind, rng)
        statement = template.format(name=rng.choice(NAMES), item=rng.choice(ITEMS), **nums)
        if statement in seen:
            continue
        seen.add(statement)
        program = "".join(f"{k} = {v}\n" for k, v in nums.items()) + f"print({expr})\n"
        value = eval(expr, {"__builtins__": {}}, dict(nums))  # the generator's own numbers, not model output
        out.append({"id": f"arith-{len(out):05d}", "statement": statement, "program": program, "template": kind,
                    "steps": 1 if kind in ("add", "sub", "mul", "div") else 2, "generator_answer": int(value)})
    return out


def verify(rows: list[dict], sandbox, chunk: int = 100) -> list[dict]:
    """The rows whose program, run in the sandbox, prints the generator's answer; each gets `answer` and `verified`.
    `chunk` programs share one sandbox run (each in a function of its own, printing its id and value)."""
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
                             "verified": "sandbox program output equals the generator's value"})
    return kept


def write_task_folder(out: str | Path, rows: list[dict]) -> Path:
    """The rows as a synthesis stage's output folder (kept math tasks); returns the tasks table's path."""
    import pyarrow as pa

    from evolforge.storage.parts import write_table_atomic
    from evolforge.storage.synthesis_sets import TASK_SCHEMA, SynthLayout

    lay = SynthLayout(out)
    Path(lay.root).mkdir(parents=True, exist_ok=True)
    table = [{"task_id": r["id"], "seed_id": r["id"], "kind": "math", "status": "kept", "reject_reason": None,
              "statement": r["statement"], "entry_point": None, "solution": None, "tests": None, "answer": r["answer"],
              "difficulty": "easy" if r["steps"] == 1 else "medium", "pass_rate": None, "solver_passes": None,
              "solver_attempts": None, "repairs": 0, "sandbox_seconds": None, "wall_seconds": None,
              "attempts": json.dumps([{"phase": "generator", "template": r["template"], "program": r["program"],
                                       "verified": r["verified"]}])} for r in rows]
    path = write_table_atomic(pa.Table.from_pylist(table, schema=TASK_SCHEMA), lay.tasks)
    lay.start_marker("synthesize")
    lay.finish_marker("synthesize", {"kept": len(rows)})
    return Path(str(path))
