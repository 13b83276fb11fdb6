"""One batch of reward-model data (IRM groups or PRM step labels), and the assembly of the finished sets.

`run_reward_batch` describes the batch for the batch runtime (tasks/core/batch.py: resume, journal replay,
atomic part, error classification) and runs it, with the part and journal of the kind's batched set
(storage/reward_sets.RewardLayout.irm / .prm); the Prefect task that wraps it is in flows/reward_data.py.
One batch per kind and row group, never per record. A record whose request the endpoint rejects
(HTTP 400/422) is kept with status `error`. `assemble` turns the parts into the trainer-ready sets and the
data-level health scores.
"""

from __future__ import annotations

from pathlib import Path

from evolforge.config.settings import Settings
from evolforge.storage import reward_sets as store
from evolforge.tasks.core.batch import BatchSpec, Progress, run_batch
from evolforge.tasks.reward import irm as irm_data
from evolforge.tasks.reward import prm as prm_data

KINDS = {
    "irm": (irm_data.rank_group, irm_data.error_group, store.GROUP_SCHEMA),
    "prm": (prm_data.label_answer, prm_data.error_row, store.STEP_ROW_SCHEMA),
}


def reward_batch_spec(kind: str, out_dir: str | Path, batch: int, settings: Settings) -> BatchSpec:
    fn, on_error, schema = KINDS[kind]
    layout = store.RewardLayout(out_dir)
    batched = layout.batched(kind)
    return BatchSpec(
        name=f"{kind}{batch}", part=batched.part(batch), journal=batched.journal(batch), schema=schema,
        load_rows=lambda: store.read_batch(layout, batch),
        work=lambda row, gw, journal: fn(row, gw, settings, journal), on_rejected=on_error,
        concurrency=settings.reward.concurrency, extra_stats=lambda statuses: {"kind": kind})


def run_reward_batch(kind: str, out_dir: str | Path, batch: int, settings: Settings, base_url: str, run_id: str,
                     progress: Progress | None = None) -> dict:
    return run_batch(reward_batch_spec(kind, out_dir, batch, settings), settings, base_url, run_id, out_dir,
                     progress)


def assemble(out_dir: str | Path, settings: Settings, kinds: tuple[str, ...] = ("irm", "prm")) -> dict:
    """Write irm_groups / irm_pairs / prm_steps / prm_rejected from the parts; return counts and data scores."""
    layout = store.RewardLayout(out_dir)
    out: dict = {"irm_scores": [], "prm_scores": []}
    if "irm" in kinds:
        groups = store.concat_parts(layout.irm, store.GROUP_SCHEMA)
        rows = groups.to_pylist()
        pairs = [p for g in rows for p in irm_data.pairs_from_group(g, settings.reward.irm_prompt)]
        store.write_irm_sets(groups, pairs, layout)
        out["irm_scores"] = [s for g in rows for s in irm_data.group_scores(g)]
        out["irm"] = {"instructions": len(rows), "by_status": _count(rows, "status"), "pairs": len(pairs),
                      "failures": _count([g for g in rows if g["status"] != "ranked"], "reason"),
                      "judge_scores_given": sum(1 for g in rows if g.get("judge_scores")),
                      "failed_ranking_attempts": sum(g.get("failed_attempts") or 0 for g in rows),
                      "path": str(layout.irm_pairs)}
    if "prm" in kinds:
        steps = store.concat_parts(layout.prm, store.STEP_ROW_SCHEMA)
        rows = steps.to_pylist()
        n_ok, n_rejected = store.write_prm_sets(steps, layout)
        ok = [r for r in rows if r["status"] == "ok"]
        labels = [v for r in ok for v in r["labels"]]
        out["prm_scores"] = [s for r in ok for s in r["scores"]]
        out["prm"] = {"answers": len(rows), "labelled": n_ok, "not_labelled": n_rejected,
                      "by_status": _count(rows, "status"), "steps": len(labels),
                      "correct_share": (sum(labels) / len(labels)) if labels else None,
                      "reasked": sum(1 for r in rows if r["reasked"]),
                      "reasked_and_labelled": sum(1 for r in ok if r["reasked"]),
                      "reasons": _count([r for r in rows if r["status"] != "ok"], "reason"),
                      "method": settings.reward.step_label_method, "path": str(layout.prm_steps)}
    return out


def _count(rows: list[dict], key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        k = str(r.get(key))
        if key == "reason":  # group free-text reasons by their first words
            k = " ".join(k.split()[:6])
        counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
