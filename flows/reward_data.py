"""Reward-model data flow: an evolve run's instructions -> IRM preference pairs + PRM step labels + health.

Reads top to bottom like the stage it runs:
  settings -> output folder -> snapshot of the evolve run's instructions (row group = batch) -> model
  endpoint (embedded or configured) -> one Prefect task per batch and kind (IRM: versions + judge ranking;
  PRM: step split, re-ask, step labels) -> the IRM pairs (TRL RewardTrainer form; data/train-00000-of-00001.parquet,
  what load_dataset("parquet", data_dir=OUT) loads) and prm_steps.parquet
  (TRL stepwise supervision) -> data health checks (health.json + markdown artifact) -> summary.json.

Re-running over the same output folder resumes: finished batches are skipped, a killed batch replays its
journaled calls. The health policy is applied by the training flow (policy 'stop' refuses to train).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import Field

from evolforge.config.settings import Settings
from evolforge.flows._fanout import BATCH_TASK_OPTIONS, run_batches
from evolforge.flows._params import EndpointParams, endpoint_label, model_endpoint
from evolforge.flows._report import attach_card, attach_plots
from evolforge.flows._runners import build_task_runner
from evolforge.storage import reward_sets as store
from evolforge.storage.fs import exists, write_json_atomic
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import read_ledger
from evolforge.tasks.core.batch import close_gateways, gateway_for, settings_from_json
from evolforge.tasks.core.checks import check_reward_data
from evolforge.tasks.core.reporting import cost_summary
from evolforge.tasks.report.card import reward_card
from evolforge.tasks.report.plots import reward_plots
from evolforge.tasks.reward.batch import assemble, run_reward_batch
from evolforge.tasks.reward.health import check_health, health_markdown


class RewardDataParams(EndpointParams):
    """Parameters of the reward-data flow (the form the Prefect UI shows)."""

    evolve_out: str = Field(..., description="Output folder of a finished evolve run (its dataset/evolved.parquet is read).")
    out: str = Field("runs/reward", description="Output folder; running again over it resumes.")
    method: Literal["judge", "decorl", "math_shepherd", "modules"] | None = Field(
        None, description="PRM step-label method (default: reward.step_label_method); modules: per-module "
        "contribution rewards of the module graph ([modules]).")
    max_instructions: int | None = Field(None, ge=1, description="Use at most this many instructions (default: reward.max_instructions).")
    kinds: list[Literal["irm", "prm"]] = Field(["irm", "prm"], description="Which data to make: IRM pairs, PRM step labels, or both.")

    def stage_overrides(self) -> dict[str, Any]:
        reward: dict[str, Any] = {}
        if self.method:
            reward["step_label_method"] = self.method
        if self.max_instructions:
            reward["max_instructions"] = self.max_instructions
        return {"reward": reward} if reward else {}


@task(name="reward-batch", **BATCH_TASK_OPTIONS)
def reward_batch_task(kind: str, out_dir: str, batch: int, settings_json: str, base_url: str, run_id: str) -> dict:
    logger = get_run_logger()

    def progress(done: int, total: int) -> None:
        logger.info("%s batch %d: %d/%d records labelled", kind, batch, done, total)

    return run_reward_batch(kind, out_dir, batch, settings_from_json(settings_json), base_url, run_id, progress)


def _run_batches(layout: store.RewardLayout, kinds: list[str], settings: Settings, base_url: str, run_id: str,
                 runner) -> list[dict]:
    settings_json = settings.model_dump_json()
    return run_batches(runner, reward_batch_task,
                       [(f"{kind}-batch-{b:05d}", dict(kind=kind, out_dir=str(layout.root), batch=b,
                                                       settings_json=settings_json, base_url=base_url, run_id=run_id))
                        for kind in kinds for b in range(store.batch_count(layout))],
                       what="reward-data", checkpoints=layout.root, progress_key="reward-data-progress")


@flow(name="reward-data", log_prints=True)
def reward_data_flow(params: RewardDataParams) -> dict:
    logger = get_run_logger()
    settings = params.settings()
    check_reward_data(params.evolve_out, params.out, settings)  # before anything is created (tasks/core/checks.py)
    cfg = settings.reward
    layout = store.RewardLayout(params.out).ensure()
    run_layout = RunLayout(params.out).ensure()  # ledger and logs live where every flow keeps them
    run_id = flow_run.id or f"local-{int(time.time())}"
    t_start = time.time()

    if not exists(layout.input):
        n = store.build_input(store.evolve_dataset(params.evolve_out), layout.input, cfg.batch_size,
                              cfg.max_instructions, cfg.reference_answer_field)
        logger.info("took %d instructions from %s", n, params.evolve_out)

    try:
        with model_endpoint(settings, run_layout) as base_url, build_task_runner(settings.runner) as runner:
            gw = gateway_for(settings, base_url, run_id, layout.root)
            gw.check_reachable(("evolve", "answer", "judge"), tuple(settings.reward.variant_models))
            logger.info("model endpoint %s; PRM method %s", gw.describe(), cfg.step_label_method)
            batches = _run_batches(layout, list(params.kinds), settings, base_url, run_id, runner)
            gateway_stats = gw.stats.as_dict()
    finally:
        close_gateways(run_id)

    done = tuple(k for k in ("irm", "prm") if k in params.kinds or store.parts_complete(layout, k))
    sets = assemble(layout.root, settings, done)  # kinds made by an earlier run over the folder count too
    health = check_health(sets["irm_scores"], sets["prm_scores"], cfg, stage="data")
    write_json_atomic(layout.health, {"data": health, "model": None})
    create_markdown_artifact(key="reward-data-health", markdown=health_markdown(health),
                             description="Reward data health: IRM and PRM score distributions against RLEIF thresholds")
    if not health["passed"]:
        logger.warning("data health checks failed (policy %s): %s", cfg.health_policy, "; ".join(health["problems"]))

    ledger = read_ledger(layout.root)
    summary = {
        "run_id": run_id, "out_dir": str(layout.root), "evolve_out": params.evolve_out,
        "endpoint": endpoint_label(settings, base_url),
        "irm_pairs": (sets.get("irm") or {}).get("pairs"), "prm_rows": (sets.get("prm") or {}).get("labelled"),
        "irm": sets.get("irm"), "prm": sets.get("prm"),
        "health": {"passed": health["passed"], "policy": cfg.health_policy, "problems": health["problems"]},
        "batches": {"total": len(batches), "skipped": sum(1 for b in batches if b["skipped"]),
                    "replayed_calls": sum(b.get("replayed_calls", 0) for b in batches)},
        "gateway": gateway_stats, "cost": cost_summary(ledger),
        "wall_seconds": round(time.time() - t_start, 2),
        "datasets": {"irm_pairs": str(layout.irm_pairs), "irm_groups": str(layout.irm_groups),
                     "prm_steps": str(layout.prm_steps), "prm_rejected": str(layout.prm_rejected),
                     "health": str(layout.health)},
    }
    summary["plots"] = attach_plots(layout, "reward-data-plots", "Reward data plots", lambda: reward_plots(
        "reward_data_scores", {"IRM label scores": sets["irm_scores"], "PRM step scores": sets["prm_scores"]},
        (cfg.healthy_mean_low, cfg.healthy_mean_high), summary["cost"].get("by_stage", []),
        "Reward data: label score distributions"))
    summary["card"] = attach_card(layout.root, {"irm_pairs": layout.irm_pairs, "irm_groups": layout.irm_groups,
                                                "prm_steps": layout.prm_steps, "prm_rejected": layout.prm_rejected},
                                  reward_card(summary, settings.fingerprint()))
    write_json_atomic(layout.summary, summary)
    create_table_artifact(key="reward-data-counts", table=_count_rows(summary),
                          description="Reward data: groups ranked, pairs, answers labelled, failures by reason")
    logger.info("done: %s IRM pairs, %s labelled PRM answers; health %s; summary %s",
                (sets.get("irm") or {}).get("pairs"), (sets.get("prm") or {}).get("labelled"),
                "passed" if health["passed"] else "FAILED", layout.summary)
    return summary


def _count_rows(summary: dict) -> list[dict]:
    rows = []
    for kind in ("irm", "prm"):
        part = summary.get(kind) or {}
        for status, n in (part.get("by_status") or {}).items():
            rows.append({"set": kind, "status": status, "count": n})
    irm, prm = summary.get("irm") or {}, summary.get("prm") or {}
    rows.append({"set": "irm", "status": "pairs", "count": irm.get("pairs", 0)})
    rows.append({"set": "prm", "status": "steps", "count": prm.get("steps", 0)})
    return rows


if __name__ == "__main__":
    import sys

    reward_data_flow(RewardDataParams(evolve_out=sys.argv[1], out=sys.argv[2] if len(sys.argv) > 2 else "runs/reward"))
