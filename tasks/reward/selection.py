"""The RLEIF loop's IRM filter: the trained IRM scores the evolved pool and a share or a threshold picks what PPO
(tasks/ppo/job.py prompt_data) and SFT (tasks/sft/job.py prepare, with --irm-dir) train on.

    select(ids, scores, mode, share, threshold)   per id: {irm_score, irm_rank, irm_selected}; mode "share" keeps
                                                  the top reward.select_share of the pool (at least one), mode
                                                  "threshold" every score >= reward.select_threshold
    irm_selection(records, irm_dir, cfg)          the evolved records (seeds and accepted evolutions with an
                                                  instruction) scored by the IRM (tasks/reward/scoring.py) and
                                                  selected; returns (per-id selection, summary)

    prm_filter(rows, prm_dir, threshold, share)   the evolved answers' steps scored by the PRM; an answer is kept
                                                  when its lowest step scores >= reward.prm_min_step and, with
                                                  reward.prm_keep_share, it ranks in that best share; returns
                                                  (per-id {prm_min, prm_step, prm_rank, prm_kept}, summary)

Only the evolved pool is filtered: verified synthesis tasks carry checked ground truth and are never dropped by a
learned score. The selection is recorded with each row (PPO: extra_info.lineage irm_score / irm_rank /
irm_selected; SFT: the skip reason of an unselected row, with score and rank) and summarised in the stage's
summary (data.irm_selection).
"""

from __future__ import annotations

import math
from pathlib import Path

from evolforge.config.sections.reward import RewardSettings
from evolforge.tasks.reward import scoring

MODES = ("off", "share", "threshold")


def select(ids: list[str], scores: list[float], mode: str, share: float, threshold: float) -> dict[str, dict]:
    if mode not in MODES[1:]:
        raise ValueError(f"IRM selection mode must be one of {MODES[1:]}, got {mode!r}")
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], str(ids[i])))  # ties: a stable order by id
    keep = max(1, math.ceil(share * len(ids))) if ids else 0
    out = {}
    for rank, i in enumerate(order, start=1):
        chosen = rank <= keep if mode == "share" else scores[i] >= threshold
        out[str(ids[i])] = {"irm_score": round(float(scores[i]), 4), "irm_rank": rank, "irm_selected": bool(chosen)}
    return out


def irm_selection(records: list[dict], irm_dir: str | Path, cfg: RewardSettings) -> tuple[dict[str, dict], dict]:
    """Score each evolved record's instruction with the IRM in `irm_dir` and select (reward.select_by_irm)."""
    pool = {}
    for r in records:
        text = (r.get("instruction") or "").strip()
        if text and (r.get("status") or "seed") in ("seed", "accepted") and r.get("id") is not None:
            pool.setdefault(str(r["id"]), text)
    ids = list(pool)
    scores = scoring.score_instructions(irm_dir, [pool[i] for i in ids]) if ids else []
    chosen = select(ids, scores, cfg.select_by_irm, cfg.select_share, cfg.select_threshold)
    kept = [v["irm_score"] for v in chosen.values() if v["irm_selected"]]
    summary = {"mode": cfg.select_by_irm, "share": cfg.select_share if cfg.select_by_irm == "share" else None,
               "threshold": cfg.select_threshold if cfg.select_by_irm == "threshold" else None,
               "irm": str(irm_dir), "scored": len(ids), "selected": len(kept),
               "score_mean": round(sum(scores) / len(scores), 4) if scores else None,
               "selected_min_score": min(kept) if kept else None}
    return chosen, summary


def prm_filter(rows: list[tuple[str, str, list[str]]], prm_dir: str | Path, threshold: float,
               keep_share: float = 0.0) -> tuple[dict[str, dict], dict]:
    """rows: (id, prompt, steps) of each evolved answer in step form. Each answer's steps are scored by the PRM in
    `prm_dir` (0..1 per step, batched); the answer is kept when its lowest step scores at least `threshold` and,
    with `keep_share` > 0, it is among the best `keep_share` of the scored answers by that lowest score (at least
    one; ties broken by id)."""
    scores = scoring.score_step_lists(prm_dir, [p for _, p, _ in rows], [s for _, _, s in rows]) if rows else []
    out = {}
    for (rid, _, _), steps in zip(rows, scores):
        low = min(range(len(steps)), key=steps.__getitem__) if steps else None
        worst = round(float(steps[low]), 4) if low is not None else None
        out[str(rid)] = {"prm_min": worst, "prm_step": None if low is None else low + 1,
                         "prm_kept": worst is not None and worst >= threshold, "prm_rank": None}
    ranked = sorted((k for k, v in out.items() if v["prm_min"] is not None), key=lambda k: (-out[k]["prm_min"], k))
    for rank, k in enumerate(ranked, 1):
        out[k]["prm_rank"] = rank
    if keep_share > 0:
        allowed = max(1, math.ceil(keep_share * len(ranked))) if ranked else 0
        for k, v in out.items():
            v["prm_kept"] = v["prm_kept"] and v["prm_rank"] is not None and v["prm_rank"] <= allowed
    kept = sum(v["prm_kept"] for v in out.values())
    mins = [v["prm_min"] for v in out.values() if v["prm_min"] is not None]
    return out, {"prm": str(prm_dir), "threshold": threshold, "keep_share": keep_share, "scored": len(out),
                 "kept": kept,
                 "min_score_mean": round(sum(mins) / len(mins), 4) if mins else None}
