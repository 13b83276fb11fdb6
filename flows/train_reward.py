"""Reward-model training flow: reward data -> health gate -> IRM (TRL RewardTrainer) + PRM (token
classification) -> held-out metrics -> model health checks -> metrics.json.

Reads top to bottom like the stage it runs:
  stage_run (settings, input check, output folder; --out defaults to the data folder, which keeps its
  reward-data stage.json: storage/reward_sets.RewardModelsFolder) -> the data folder's health.json (policy
  'stop' with failed checks refuses to train unless `override_health`) -> one Prefect task per model (trained
  one after the other: CPU-bound; its optimizer steps are live progress: the terminal's bar and the
  `train-reward-progress-train-<kind>` artifact) -> the trained models score a sample of the data -> health
  checks on those scores (health.json "model", the `reward-model-health` artifact) -> the `reward-model-plots`
  -> finish_stage: metrics.json (the stage's summary) and the `reward-training` artifact. A model already
  trained in the output folder is kept unless `retrain`.
Parameters and check: tasks/reward/stage.py; the figures: tasks/reward/report.py.
Scoring API for the PPO stage: evolforge.tasks.reward.scoring.score_instructions / score_steps.
"""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from evolforge.flows._report import attach_plots, progress_artifacts
from evolforge.flows._stage import finish_stage, stage_run
from evolforge.storage.fs import read_json, write_json_atomic
from evolforge.storage.reward_sets import RewardLayout
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.core.health import enforce
from evolforge.tasks.reward import report
from evolforge.tasks.reward.health import health_markdown
from evolforge.tasks.reward.stage import TrainRewardParams
from evolforge.tasks.reward.training import model_health, train_reward_model

__all__ = ["TrainRewardParams", "train_reward_flow"]


@task(name="train-reward-model", cache_policy=NO_CACHE)
def train_reward_model_task(kind: str, data_dir: str, out_dir: str, settings_json: str) -> dict:
    return train_reward_model(kind, data_dir, out_dir, settings_from_json(settings_json).reward)


@flow(name="train-reward", log_prints=True)
def train_reward_flow(params: TrainRewardParams) -> dict:
    with stage_run("train-reward", params) as run:
        lay, cfg, data = run.folder, run.settings.reward, RewardLayout(params.data)
        health = read_json(data.health) or {}
        if not health.get("data"):
            run.logger.warning("no data health report in %s: training without the health gate", data.health)
        warning = enforce(health.get("data"), cfg.health_policy, params.override_health)  # raises under 'stop'
        if warning:
            run.logger.warning("%s (policy %s%s): training anyway", warning, cfg.health_policy,
                               ", overridden" if params.override_health else "")
        previous, models = (read_json(lay.metrics) or {}).get("models", {}), {}
        for kind in params.models:
            if not params.retrain and lay.model_ready(kind) and kind in previous:
                run.logger.info("%s model already trained in %s: kept (retrain=True trains again)", kind,
                                lay.model_dir(kind))
                models[kind] = previous[kind]
                continue
            with progress_artifacts("train-reward-progress", f"train {kind}"):  # the optimizer steps, live
                m = train_reward_model_task.with_options(task_run_name=f"train-{kind}")(
                    kind=kind, data_dir=str(data.root), out_dir=str(lay.root), settings_json=run.settings_json)
            models[kind] = {**m, "path": str(lay.model_dir(kind))}
            run.logger.info("%s trained: %s", kind, m)
        checked = model_health(data.root, lay.root, cfg)
        write_json_atomic(lay.health, {"data": health.get("data"), "model": checked})
        if not checked["passed"]:
            run.logger.warning("trained reward models fail the health checks: %s", "; ".join(checked["problems"]))
        metrics = report.training_metrics(models, str(data.root), cfg, health.get("data"), checked,
                                          params.override_health)
        metrics["plots"] = attach_plots(lay, "reward-model-plots", "Reward model plots",
                                        lambda: report.model_plots(checked, cfg))
        metrics = finish_stage(
            run, metrics, cost=False, counts={"models": list(models), "model_health_passed": checked["passed"]},
            markdown={"reward-model-health": (health_markdown(checked, "Reward model health"), "Trained IRM / PRM "
                                              "scores on a data sample against RLEIF thresholds"),
                      "reward-training": (report.training_markdown(metrics), "Reward models: held-out pairwise / "
                                          "step accuracy, training time")})
        return {**metrics, "irm": models.get("irm"), "prm": models.get("prm"), "metrics": str(lay.metrics)}


if __name__ == "__main__":
    import sys

    train_reward_flow(TrainRewardParams(data=sys.argv[1]))
