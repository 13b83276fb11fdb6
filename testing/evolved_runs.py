"""A small finished evolve run on disk (seeds + accepted evolutions with step-form answers), for the
reward-data, training and PPO tests; and training settings small enough for a CPU test."""

from __future__ import annotations

import polars as pl

from evolforge.storage.layout import RunLayout

ANSWERS = [
    "Step 1: Add {i} and 2.\nStep 2: This is wrong: subtract 9.\nStep 3: So the sum is {j}.\nThe answer is: {j}",
    "Step 1: Read the numbers {i} and 2.\nStep 2: Add them to get {j}.\nThe answer is: {j}",
    "The sum is {j}.",  # not in step form: re-asked once, the scripted strict reply is in step form
]
TINY_TRAINING = {"irm_max_steps": 2, "prm_max_steps": 2, "max_length": 64, "train_batch_size": 4, "eval_share": 0.34}


def evolve_folder(tmp_path, n=6):
    """TMP/evolve: n seeds and n accepted evolutions (answers in three forms, see ANSWERS)."""
    rows = []
    for i in range(n):
        seed = {"id": f"s{i}", "parent_id": None, "seed_id": f"s{i}", "round": 0, "operation": None,
                "direction": None, "model": None, "status": "seed", "elimination_rule": None,
                "instruction": f"What is {i} plus 2? Explain number {i}.", "answer": None, "judge_verdict": None,
                "domain": "math", "generation": 0}
        evolved = {**seed, "id": f"e{i}", "parent_id": f"s{i}", "round": 1, "operation": "deepening",
                   "direction": "up", "model": "m", "status": "accepted", "generation": 1,
                   "instruction": f"What is {i} plus 2, and why? Show the steps for number {i}.",
                   "answer": ANSWERS[i % 3].format(i=i, j=i + 2), "judge_verdict": "not_equal"}
        rows += [seed, evolved]
    layout = RunLayout(tmp_path / "evolve")
    layout.dataset_dir.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows).write_parquet(layout.evolved)
    return layout.root
