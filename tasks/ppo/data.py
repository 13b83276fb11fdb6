"""PPO prompt data from an evolve run and its verified tasks, in verl's parquet form (also what TRL's
GRPOTrainer reads).

One row per distinct evolved instruction (seeds + accepted evolutions), and one per kept synthesized task:
    data_source   "evolforge/<domain>"
    prompt        [{"role": "user", "content": <the answer prompt of the evolve stage around the instruction>}]
                  (a code task: the synthesis solver's prompt, asking for solution.py in a python block)
    ability       the domain: math, code or general
    reward_model  {"style": "rule", "ground_truth": X} or {"style": "model", "ground_truth": ""}, X by source:
                    synthesis_math  a kept math task: its majority-verified answer evaluated to a number
                                    (tasks/problems/truth.py)
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
The test split holds whole seed lineages (tasks/problems/split.py, the split SFT and eval use too; a task carries
its instruction's seed_id), so no evolution of a held-out seed, nor a task drawn from one, is trained on. The
prompt is tasks/problems/prompts.py task_messages, byte-identical to SFT's and eval's.
"""

from __future__ import annotations

from typing import Any

from evolforge.tasks.problems.prompts import task_messages
from evolforge.tasks.problems.split import problem_records, split_lineages
from evolforge.tasks.problems.truth import ground_truth_of

UNVERIFIED = ("exclude", "own_answer")  # ppo.unverified_ground_truth
IRM_FIELDS = ("irm_score", "irm_rank", "irm_selected")  # lineage of the RLEIF IRM filter (tasks/reward/selection.py)
SOURCES = ("synthesis_math", "synthesis_code", "own_answer", "none")  # where a row's ground truth comes from


def verl_row(rec: dict, split: str, index: int, answer_in_steps: bool = True,
             unverified_ground_truth: str = "exclude") -> dict[str, Any]:
    """The verl row of an evolved record, or of a synthesized task (a record with `_ground_truth`)."""
    domain = rec.get("domain") or "general"
    if "_ground_truth" in rec:
        source, gt = rec["_ground_truth"]
    else:
        gt = ground_truth_of(rec.get("answer"), domain) if unverified_ground_truth == "own_answer" else ""
        source = "own_answer" if gt else "none"
    prompt = task_messages("code" if source == "synthesis_code" else "text", rec["instruction"],
                           rec.get("entry_point"), answer_in_steps)
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


def build_prompt_rows(records: list[dict], test_fraction: float = 0.1, split_seed: int = 42,
                      answer_in_steps: bool = True, tasks: list[dict] | None = None,
                      unverified_ground_truth: str = "exclude",
                      selection: dict[str, dict] | None = None,
                      held_out: list[str] | tuple[str, ...] = ()) -> tuple[list[dict], list[dict], dict]:
    """Evolved records (+ kept synthesized tasks) -> (train rows, test rows, counts). Drops eliminated or errored
    records, empty instructions and repeated instructions (the first occurrence is kept; tasks come first, so a
    verified task wins over an identical unverified instruction). `unverified_ground_truth`: "exclude" (evolved
    instructions get no ground truth) or "own_answer" (their evolve answer's final answer, see module doc).
    `held_out`: seed lineages held out by name (ppo.held_out_seeds) in place of the hash split."""
    if unverified_ground_truth not in UNVERIFIED:
        raise ValueError(f"unverified_ground_truth must be one of {UNVERIFIED}, got {unverified_ground_truth!r}")
    kept, dropped, unverifiable = problem_records(records, tasks)
    if selection is not None:
        dropped["irm_selection"] = 0
    test_seeds = split_lineages([r["seed_id"] for r in kept], test_fraction, split_seed, held_out)
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
