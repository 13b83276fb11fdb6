"""One batch of reward-model data (IRM groups or PRM step labels), and the assembly of the finished sets.

`run_reward_batch` is the plain function (tests call it directly); `reward_batch_task` is its thin Prefect
wrapper: one Prefect task per batch and kind, never per record. Like an evolve batch, it
  1. returns at once when its part exists and is whole (resume); a corrupt part is moved aside and redone;
  2. otherwise labels its records with bounded concurrency, replaying finished calls from its journal;
  3. writes its part atomically.
A record whose request the endpoint rejects (HTTP 400/422) is kept with status `error`; transient failures
that outlast the gateway's retries fail the batch so Prefect retries it; auth errors and a down endpoint
stop the run. `assemble` turns the parts into the trainer-ready sets and the data-level health scores.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from ..config.settings import Settings
from ..storage import parts
from ..storage import reward_sets as store
from ..storage.fs import exists
from ..storage.journal import CallJournal
from . import irm_data, prm_data
from .evolve_batch import BATCH_TASK_OPTIONS, batch_journal, gateway_for, is_fatal, run_records
from .gateway import GatewayError

log = logging.getLogger("evolforge.reward_data")

KINDS = {
    "irm": (irm_data.rank_group, irm_data.error_group, store.GROUP_SCHEMA),
    "prm": (prm_data.label_answer, prm_data.error_row, store.STEP_ROW_SCHEMA),
}


def _safely(kind: str, row: dict, gw, settings: Settings, journal: CallJournal) -> dict:
    fn, on_error, _ = KINDS[kind]
    try:
        return fn(row, gw, settings, journal)
    except GatewayError as e:
        if is_fatal(e) or e.retryable:
            raise
        return on_error(row, e)  # the endpoint rejected this record's request: kept, visibly, as an error


def run_reward_batch(kind: str, out_dir: str | Path, batch: int, settings: Settings, base_url: str, run_id: str,
                     progress: Callable[[int, int], None] | None = None) -> dict:
    _, _, schema = KINDS[kind]
    layout = store.RewardLayout(out_dir)
    part = layout.part(kind, batch)
    if exists(part):
        try:
            return _stats(kind, part, parts.read_part(part).to_pylist(), skipped=True)
        except parts.CorruptPart as e:
            moved = parts.quarantine(part)
            log.warning("corrupt checkpoint %s (%s): moved to %s, redoing the batch", part, e, moved.name)
    rows = store.read_batch(layout, batch)
    gw = gateway_for(settings, base_url, run_id, out_dir)
    replayed_before = gw.stats.replayed
    with batch_journal(gw, layout.journal(kind, batch), settings) as journal:
        results = run_records(lambda r: _safely(kind, r, gw, settings, journal), rows, settings.reward.concurrency,
                              f"{kind}{batch}", progress)
    store.write_part(results, schema, part)
    stats = _stats(kind, part, results, skipped=False)
    stats["replayed_calls"] = gw.stats.replayed - replayed_before
    return stats


def _stats(kind: str, part: Path, rows: list[dict], skipped: bool) -> dict:
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    return {"kind": kind, "part": str(part), "rows": len(rows), "by_status": by_status, "skipped": skipped}


def assemble(out_dir: str | Path, settings: Settings, kinds: tuple[str, ...] = ("irm", "prm")) -> dict:
    """Write irm_groups / irm_pairs / prm_steps / prm_rejected from the parts; return counts and data scores."""
    layout = store.RewardLayout(out_dir)
    out: dict = {"irm_scores": [], "prm_scores": []}
    if "irm" in kinds:
        groups = store.concat_parts(layout, "irm", store.GROUP_SCHEMA)
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
        steps = store.concat_parts(layout, "prm", store.STEP_ROW_SCHEMA)
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


# ----------------------------------------------------------------- Prefect wrapper
from prefect import task  # noqa: E402


@task(name="reward-batch", **BATCH_TASK_OPTIONS)
def reward_batch_task(kind: str, out_dir: str, batch: int, settings_json: str, base_url: str, run_id: str) -> dict:
    from prefect import get_run_logger

    settings = Settings.model_validate_json(settings_json)
    logger = get_run_logger()
    step = max(1, settings.reward.batch_size // 4)

    def progress(done: int, total: int) -> None:
        if done % step == 0 or done == total:
            logger.info("%s batch %d: %d/%d records labelled", kind, batch, done, total)

    return run_reward_batch(kind, out_dir, batch, settings, base_url, run_id, progress)
