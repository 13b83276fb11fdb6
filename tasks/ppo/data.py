"""PPO prompt data from an evolve run and its verified tasks, in verl's parquet form (also what TRL's
GRPOTrainer reads).

One row per distinct evolved instruction (seeds + accepted evolutions), and one per kept synthesized task:
    data_source   "evolforge/<domain>"
    prompt        [{"role": "user", "content": <the answer prompt of the evolve stage around the instruction>}]
                  (a code task: the synthesis solver's prompt, asking for solution.py in a python block)
    ability       the domain: math, code or general
    reward_model  {"style": "rule", "ground_truth": X} or {"style": "model", "ground_truth": ""}, X by source:
                    synthesis_math  a kept math task: its majority-verified answer evaluated to a number
                                    (tasks/synthesis/checks.py eval_number)
                    synthesis_code  a kept code task: JSON {"entry_point", "tests"} (its own pytest tests,
                                    run against the response's code by tasks/ppo/reward.py)
                    own_answer      an evolved math instruction whose evolve answer states a final answer X
                                    ("The answer is: X", "#### X" or \\boxed{X}: tasks/text/answers.py), only
                                    with unverified_ground_truth="own_answer" (the answer model's own word,
                                    often wrong for a small model)
                    none            every other row: rA is the PRM alone
    extra_info    {split, index, question (the raw instruction or task statement, what the IRM scores), answer
                  (the evolve answer, or the task's reference answer / solution), domain, ground_truth_source,
                  lineage: {id, parent_id, seed_id, round, operation, direction, irm_score, irm_rank,
                  irm_selected (the last three null without an IRM selection)}}
With an IRM selection (tasks/reward/selection.py, reward.select_by_irm) each evolved row's lineage also carries
irm_score, irm_rank and irm_selected, and evolved training rows the IRM did not select are left out (counted as
dropped.irm_selection); test rows and synthesis tasks are never filtered.
The test split holds whole seed lineages (a stable hash of seed_id; a task carries its instruction's seed_id),
so no evolution of a held-out seed, nor a task drawn from one, is trained on.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from evolforge.tasks.evolve.prompts import answer_messages
from evolforge.tasks.synthesis.checks import eval_number
from evolforge.tasks.synthesis.prompts import SOLVE_CODE
from evolforge.tasks.text.answers import extract_answer

KEEP_STATUS = {"seed", "accepted"}
UNVERIFIED = ("exclude", "own_answer")  # ppo.unverified_ground_truth
IRM_FIELDS = ("irm_score", "irm_rank", "irm_selected")  # lineage of the RLEIF IRM filter (tasks/reward/selection.py)
SOURCES = ("synthesis_math", "synthesis_code", "own_answer", "none")  # where a row's ground truth comes from


def ground_truth_of(answer: str | None, domain: str | None) -> str:
    """The reference answer of a math record (its final answer, tasks/text/answers.py), else ""."""
    if domain != "math" or not answer:
        return ""
    return extract_answer(answer) or ""


def number_text(value: float) -> str:
    """A verified number as a ground-truth string: 12.0 -> "12", 0.75 -> "0.75"."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else format(value, ".12g")


def task_ground_truth(task: dict) -> tuple[str, str] | None:
    """(source, ground truth) of a kept synthesized task, or None when it has nothing to check against."""
    if task.get("kind") == "math":
        value = eval_number(task.get("answer") or "")
        return ("synthesis_math", number_text(value)) if value is not None else None
    if task.get("kind") == "code" and (task.get("tests") or "").strip() and (task.get("entry_point") or "").strip():
        return "synthesis_code", json.dumps({"entry_point": task["entry_point"], "tests": task["tests"]})
    return None


def _bucket(seed_id: str, split_seed: int) -> float:
    digest = hashlib.sha256(f"{split_seed}:{seed_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_lineages(seed_ids: list[str], test_fraction: float, split_seed: int) -> set[str]:
    """The seed ids held out for test; at least one, and never all of them when there are two or more."""
    distinct = sorted(set(seed_ids), key=lambda s: _bucket(s, split_seed))
    test = {s for s in distinct if _bucket(s, split_seed) < test_fraction}
    if not test and len(distinct) >= 2:
        test = {distinct[0]}
    if len(test) == len(distinct) and len(distinct) >= 2:
        test.discard(distinct[-1])
    return test


def verl_row(rec: dict, split: str, index: int, answer_in_steps: bool = True,
             unverified_ground_truth: str = "exclude") -> dict[str, Any]:
    """The verl row of an evolved record, or of a synthesized task (a record with `_ground_truth`)."""
    domain = rec.get("domain") or "general"
    if "_ground_truth" in rec:
        source, gt = rec["_ground_truth"]
    else:
        gt = ground_truth_of(rec.get("answer"), domain) if unverified_ground_truth == "own_answer" else ""
        source = "own_answer" if gt else "none"
    if source == "synthesis_code":
        prompt = [{"role": "user", "content": SOLVE_CODE.format(entry_point=rec["entry_point"],
                                                               statement=rec["instruction"])}]
    else:
        prompt = answer_messages(rec["instruction"], answer_in_steps)
    return {
        "data_source": f"evolforge/{domain}",
        "prompt": prompt,
        "ability": domain,
        "reward_model": {"style": "rule" if gt else "model", "ground_truth": gt},
        "extra_info": {
            "split": split, "index": index, "question": rec["instruction"], "answer": rec.get("answer") or "",
            "domain": domain, "ground_truth_source": source,
            "lineage": {**{k: rec.get(k) for k in ("id", "parent_id", "seed_id", "round", "operation", "direction")},
                        **dict.fromkeys(IRM_FIELDS)},  # filled by an IRM selection (build_prompt_rows)
        },
    }


def task_records(tasks: list[dict]) -> tuple[list[dict], int]:
    """Kept synthesized tasks -> records for `verl_row` (statement as instruction, task kind as domain), and how
    many kept tasks had no checkable ground truth (skipped)."""
    out, skipped = [], 0
    for t in tasks:
        if (t.get("status") or "kept") != "kept" or (verified := task_ground_truth(t)) is None:
            skipped += 1
            continue
        out.append({"id": t.get("task_id"), "parent_id": None, "seed_id": t.get("seed_id") or t.get("task_id"),
                    "round": None, "operation": "synthesis", "direction": None, "status": "accepted",
                    "instruction": t.get("statement") or "", "domain": t["kind"], "entry_point": t.get("entry_point"),
                    "answer": (t.get("answer") if t["kind"] == "math" else t.get("solution")) or "",
                    "_ground_truth": verified})
    return out, skipped


def build_prompt_rows(records: list[dict], test_fraction: float = 0.1, split_seed: int = 42,
                      answer_in_steps: bool = True, tasks: list[dict] | None = None,
                      unverified_ground_truth: str = "exclude",
                      selection: dict[str, dict] | None = None) -> tuple[list[dict], list[dict], dict]:
    """Evolved records (+ kept synthesized tasks) -> (train rows, test rows, counts). Drops eliminated or errored
    records, empty instructions and repeated instructions (the first occurrence is kept; tasks come first, so a
    verified task wins over an identical unverified instruction). `unverified_ground_truth`: "exclude" (evolved
    instructions get no ground truth) or "own_answer" (their evolve answer's final answer, see module doc)."""
    if unverified_ground_truth not in UNVERIFIED:
        raise ValueError(f"unverified_ground_truth must be one of {UNVERIFIED}, got {unverified_ground_truth!r}")
    task_recs, unverifiable = task_records(tasks or [])
    seen: set[str] = set()
    kept = []
    dropped = {"status": 0, "empty": 0, "duplicate": 0} | ({"irm_selection": 0} if selection is not None else {})
    for rec in task_recs + list(records):
        text = (rec.get("instruction") or "").strip()
        if (rec.get("status") or "seed") not in KEEP_STATUS:
            dropped["status"] += 1
        elif not text:
            dropped["empty"] += 1
        elif " ".join(text.lower().split()) in seen:
            dropped["duplicate"] += 1
        else:
            seen.add(" ".join(text.lower().split()))
            kept.append({**rec, "instruction": text, "seed_id": rec.get("seed_id") or rec.get("id")})
    test_seeds = split_lineages([r["seed_id"] for r in kept], test_fraction, split_seed)
    train, test = [], []
    for rec in kept:
        split, rows = ("test", test) if rec["seed_id"] in test_seeds else ("train", train)
        picked = None if selection is None or "_ground_truth" in rec else selection.get(str(rec.get("id")))
        if picked is not None and split == "train" and not picked["irm_selected"]:
            dropped["irm_selection"] += 1
            continue
        row = verl_row(rec, split, len(rows), answer_in_steps, unverified_ground_truth)
        if picked is not None:
            row["extra_info"]["lineage"].update(picked)
        rows.append(row)
    sources = dict.fromkeys(SOURCES, 0)
    for r in train + test:
        sources[r["extra_info"]["ground_truth_source"]] += 1
    counts = {"records": len(records), "tasks": len(tasks or []), "tasks_without_ground_truth": unverifiable, "train": len(train), "test": len(test),
              "dropped": dropped, "with_ground_truth": sum(r["reward_model"]["style"] == "rule" for r in train + test),
              "ground_truth_sources": sources, "unverified_ground_truth": unverified_ground_truth,
              "test_lineages": len(test_seeds)}
    return train, test, counts
