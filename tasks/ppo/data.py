"""PPO prompt data from an evolve run, in verl's parquet form (also what TRL's GRPOTrainer reads).

One row per distinct evolved instruction (seeds + accepted evolutions):
    data_source   "evolforge/<domain>"
    prompt        [{"role": "user", "content": <the answer prompt of the evolve stage around the instruction>}]
    ability       the domain: math, code or general
    reward_model  {"style": "rule", "ground_truth": X} when the evolve answer states a final answer X
                  ("The answer is: X", "#### X" or \\boxed{X}: tasks/text/answers.py; math only),
                  else {"style": "model", "ground_truth": ""}
    extra_info    {split, index, question (the raw instruction, what the IRM scores), answer (the evolve
                  answer), domain, lineage: {id, parent_id, seed_id, round, operation, direction}}
The test split holds whole seed lineages (a stable hash of seed_id), so no evolution of a held-out seed is
trained on.
"""

from __future__ import annotations

import hashlib
from typing import Any

from evolforge.tasks.evolve.prompts import answer_messages
from evolforge.tasks.text.answers import extract_answer

KEEP_STATUS = {"seed", "accepted"}


def ground_truth_of(answer: str | None, domain: str | None) -> str:
    """The reference answer of a math record (its final answer, tasks/text/answers.py), else ""."""
    if domain != "math" or not answer:
        return ""
    return extract_answer(answer) or ""


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


def verl_row(rec: dict, split: str, index: int, answer_in_steps: bool = True) -> dict[str, Any]:
    domain = rec.get("domain") or "general"
    gt = ground_truth_of(rec.get("answer"), domain)
    return {
        "data_source": f"evolforge/{domain}",
        "prompt": answer_messages(rec["instruction"], answer_in_steps),
        "ability": domain,
        "reward_model": {"style": "rule" if gt else "model", "ground_truth": gt},
        "extra_info": {
            "split": split, "index": index, "question": rec["instruction"], "answer": rec.get("answer") or "",
            "domain": domain,
            "lineage": {k: rec.get(k) for k in ("id", "parent_id", "seed_id", "round", "operation", "direction")},
        },
    }


def build_prompt_rows(records: list[dict], test_fraction: float = 0.1, split_seed: int = 42,
                      answer_in_steps: bool = True) -> tuple[list[dict], list[dict], dict]:
    """Evolved records -> (train rows, test rows, counts). Drops eliminated or errored records, empty
    instructions and repeated instructions (the first occurrence is kept)."""
    seen: set[str] = set()
    kept = []
    dropped = {"status": 0, "empty": 0, "duplicate": 0}
    for rec in records:
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
        rows.append(verl_row(rec, split, len(rows), answer_in_steps))
    counts = {"records": len(records), "train": len(train), "test": len(test), "dropped": dropped,
              "with_ground_truth": sum(r["reward_model"]["style"] == "rule" for r in train + test),
              "test_lineages": len(test_seeds)}
    return train, test, counts
