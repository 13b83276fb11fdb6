"""The train / held-out split: whole seed lineages, the one split SFT, PPO and eval use.

    problem_records(records, tasks)   evolved records (+ kept synthesized tasks, as records with `_ground_truth`)
                                      after the drops every stage makes: not seed/accepted, empty, repeated
                                      instructions (tasks come first, so a verified task wins over an identical
                                      unverified instruction); returns (kept, dropped counts, unverifiable tasks)
    split_lineages(seed_ids, fraction, seed, named)  the seed ids held out: `named` ones when given (ppo.held_out_seeds,
                                      e.g. whole template families), else a stable hash of seed_id and the split seed
    held_out_seeds(evolved, tasks, fraction, seed, named)  the seed ids held out over the same inputs as the PPO data and
                                      SFT rows (so no evolution of a training seed, nor a task drawn from one, is
                                      evaluated)
"""

from __future__ import annotations

import hashlib

from evolforge.tasks.problems.truth import task_ground_truth

KEEP_STATUS = {"seed", "accepted"}


def task_records(tasks: list[dict]) -> tuple[list[dict], int]:
    """Kept synthesized tasks -> records (statement as instruction, task kind as domain), and how many kept tasks
    had no checkable ground truth (skipped)."""
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


def problem_records(records: list[dict], tasks: list[dict] | None = None) -> tuple[list[dict], dict, int]:
    """(kept records, dropped counts, kept tasks without a checkable ground truth); see the module doc."""
    task_recs, unverifiable = task_records(tasks or [])
    seen: set[str] = set()
    kept = []
    dropped = {"status": 0, "empty": 0, "duplicate": 0}
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
    return kept, dropped, unverifiable


def _bucket(seed_id: str, split_seed: int) -> float:
    digest = hashlib.sha256(f"{split_seed}:{seed_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_lineages(seed_ids: list[str], test_fraction: float, split_seed: int,
                   named: list[str] | tuple[str, ...] = ()) -> set[str]:
    """The seed ids held out for test: the `named` ones present, when any are named; else by hash, at least one, and
    never all of them when there are two or more."""
    if named:
        return set(seed_ids) & set(named)
    distinct = sorted(set(seed_ids), key=lambda s: _bucket(s, split_seed))
    test = {s for s in distinct if _bucket(s, split_seed) < test_fraction}
    if not test and len(distinct) >= 2:
        test = {distinct[0]}
    if len(test) == len(distinct) and len(distinct) >= 2:
        test.discard(distinct[-1])
    return test


def held_out_seeds(evolved: list[dict], tasks: list[dict], test_fraction: float, split_seed: int,
                   named: list[str] | tuple[str, ...] = ()) -> set[str]:
    """The seed ids of the test split over these evolved records and tasks."""
    if not evolved and not tasks:
        return set()
    kept, _, _ = problem_records(evolved, tasks)
    return split_lineages([r["seed_id"] for r in kept], test_fraction, split_seed, named)
