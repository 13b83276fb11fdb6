"""Reward-model data flow: an evolve run's instructions -> IRM preference pairs + PRM step labels + health.

Reads top to bottom like the stage it runs:
  stage_run (settings, input check, output folder + stage.json) -> snapshot of the evolve run's instructions
  (reward_input.parquet, row group = batch) -> model endpoint (embedded or configured) -> one Prefect task per
  batch and kind, both kinds in one fan-out (IRM: versions + judge ranking; PRM: step split, re-ask, step
  labels) -> the IRM pairs (TRL RewardTrainer form; data/train-00000-of-00001.parquet, what
  load_dataset("parquet", data_dir=OUT) loads) and prm_steps.parquet (TRL stepwise supervision) -> data
  health checks (health.json + the `reward-data-health` artifact) -> finish_stage: summary.json, plots, the
  dataset card, the finished stage.json and the `reward-data-counts` artifact.

Re-running over the same output folder resumes: finished batches are skipped, a killed batch replays its
journaled calls. The health policy is applied by the training flow (policy 'stop' refuses to train).
Parameters and check: tasks/reward/stage.py; files: storage/reward_sets.py; the figures: tasks/reward/report.py.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task

from evolforge.flows._fanout import BATCH_TASK_OPTIONS, retry_options, run_batches
from evolforge.flows._stage import batch_totals, finish_stage, stage_run
from evolforge.storage import reward_sets as store
from evolforge.storage.fs import write_json_atomic
from evolforge.storage.ledger import read_ledger
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.core.reporting import cost_summary
from evolforge.tasks.reward import report
from evolforge.tasks.reward.batch import assemble, run_reward_batch
from evolforge.tasks.reward.health import check_health, health_markdown
from evolforge.tasks.reward.stage import RewardDataParams

__all__ = ["RewardDataParams", "reward_data_flow"]


@task(name="reward-batch", **BATCH_TASK_OPTIONS)
def reward_batch_task(kind: str, out_dir: str, batch: int, settings_json: str, base_url: str, run_id: str) -> dict:
    logger = get_run_logger()

    def progress(done: int, total: int) -> None:
        logger.info("%s batch %d: %d/%d records labelled", kind, batch, done, total)

    return run_reward_batch(kind, out_dir, batch, settings_from_json(settings_json), base_url, run_id, progress)


@flow(name="reward-data", log_prints=True)
def reward_data_flow(params: RewardDataParams) -> dict:
    with stage_run("reward-data", params) as run:
        lay, cfg = run.folder, run.settings.reward
        run.snapshot(lay.irm, lambda: store.build_input(store.evolve_dataset(params.evolve_out), lay.input,
                                                         cfg.batch_size, cfg.max_instructions,
                                                         cfg.reference_answer_field), "instructions")
        with run.endpoint(("evolve", "answer", "judge"), tuple(cfg.variant_models),
                          log=f"PRM method {cfg.step_label_method}") as ep:
            batches = run_batches(ep.runner, reward_batch_task, [  # every kind's batches in one fan-out
                (f"{kind}-batch-{b:05d}", dict(kind=kind, out_dir=str(lay.root), batch=b, base_url=ep.base_url,
                                               settings_json=run.settings_json, run_id=run.run_id))
                for kind in params.kinds for b in range(lay.batched(kind).batch_count())],
                what="reward-data", checkpoints=lay.root, progress_key="reward-data-progress",
                retry=retry_options(run.settings.runner.batch_retries, run.settings.runner.retry_delay_seconds))
        # the kinds made by an earlier run over the folder count too
        sets = assemble(lay.root, run.settings, tuple(k for k in store.KINDS
                                                      if k in params.kinds or lay.batched(k).complete()))
        health = check_health(sets["irm_scores"], sets["prm_scores"], cfg, stage="data")
        write_json_atomic(lay.health, {"data": health, "model": None})
        if not health["passed"]:
            run.logger.warning("data health checks failed (policy %s): %s", cfg.health_policy,
                               "; ".join(health["problems"]))
        cost = cost_summary(read_ledger(lay.root))
        summary = {"evolve_out": params.evolve_out, **report.data_summary(sets, health, cfg.health_policy),
                   "batches": batch_totals(batches), "cost": cost,
                   "datasets": {**{k: str(p) for k, p in lay.data_tables().items()}, "health": str(lay.health)}}
        summary = finish_stage(
            run, summary, cost=False, counts={k: summary[k] for k in ("irm_pairs", "prm_rows")},
            plots=("Reward data plots", lambda: report.data_plots(sets, cfg, cost.get("by_stage", []))),
            card=(lay.data_tables(), report.card({"run_id": run.run_id, **summary}, run.settings.fingerprint())),
            tables={"reward-data-counts": (report.count_rows(summary), "Reward data: groups ranked, pairs, answers "
                                           "labelled, failures by reason")},
            markdown={"reward-data-health": (health_markdown(health), "Reward data health: IRM and PRM score "
                                             "distributions against RLEIF thresholds")})
        run.logger.info("done: %s IRM pairs, %s labelled PRM answers; health %s; summary %s", summary["irm_pairs"],
                        summary["prm_rows"], "passed" if health["passed"] else "FAILED", lay.summary)
        return summary


if __name__ == "__main__":
    import sys

    reward_data_flow(RewardDataParams(evolve_out=sys.argv[1], out=sys.argv[2] if len(sys.argv) > 2 else "runs/reward"))
