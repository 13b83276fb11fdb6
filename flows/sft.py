"""SFT flow: forged data -> the rows (step-form evolved answers, verified code solutions, successful trajectories;
held-out lineages and evaluation overlaps left out) -> TRL SFTTrainer -> a transformers folder with its model card.

Reads top to bottom like the stage it runs:
  stage_run (settings, input check, output folder) -> the rows, once per output folder (tasks/sft/job.py prepare:
  data/train.parquet, data/skipped.parquet, decontamination.json) -> the base policy (sft.base_model, else the GGUF
  converted to transformers) -> training (its optimizer steps are live progress: the terminal's bar and the
  `sft-progress-train` artifact; resumes from the last checkpoint in OUT/checkpoints) -> OUT/model, its card, its
  ledger row -> finish_stage: plots (sft_loss, sft_learning_rate), the dataset card of data/, summary.json and the
  `sft-summary` artifact. A finished model in the folder is kept unless `retrain`.
Parameters and check: tasks/sft/stage.py; the figures: tasks/sft/report.py; the files: storage/sft_sets.py.
"""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from evolforge.flows._report import progress_artifacts
from evolforge.flows._stage import finish_stage, stage_run
from evolforge.storage.sft_sets import SFTFolder, read_json, read_log
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.core.progress import StepProgress
from evolforge.tasks.sft import job, report, train
from evolforge.tasks.sft.stage import SFTParams

__all__ = ["SFTParams", "sft_flow"]


@task(name="sft-train", cache_policy=NO_CACHE)
def train_task(out_dir: str, settings_json: str) -> dict:
    settings, folder = settings_from_json(settings_json), SFTFolder(out_dir)
    base = train.base_policy(settings.sft, settings.ppo, folder)
    progress = StepProgress("train", settings.sft.max_steps or None, "steps")
    result = train.train(folder, base, settings.sft, progress)
    progress.finish(f"train loss {result['train_loss']:.4g}")
    return result


@flow(name="sft", log_prints=True)
def sft_flow(params: SFTParams) -> dict:
    with stage_run("sft", params) as run:
        folder, cfg = run.folder, run.settings.sft
        prepared = job.prepare(params, run.settings, folder)
        run.logger.info("SFT rows: %d (%s), %d left out (%s)", prepared["rows"], prepared["by_source"],
                        prepared["skipped"], prepared["skipped_by_reason"])
        trained = None
        if folder.model_ready() and not params.retrain:
            trained = (read_json(folder.summary) or {}).get("training")
            run.logger.info("a finished model is in %s: kept (retrain=True trains again)", folder.model)
        else:
            if params.retrain:
                folder.clear_checkpoints()  # again from the base model, not from the last run's final step
            with progress_artifacts("sft-progress", "train"):  # the optimizer steps, live
                trained = train_task(str(folder.root), run.settings_json)
            job.record_cost(folder, run.run_id, trained, cfg.compute_usd_per_hour)
        summary = report.summarize(params, prepared, trained, folder)
        return finish_stage(
            run, summary, counts=report.counts(summary),
            plots=("SFT plots", lambda: report.plots(read_log(folder.train_log))),
            card=({"train": folder.train, "skipped": folder.skipped},
                  report.card({"run_id": run.run_id, **summary}, run.settings.fingerprint(), folder)),
            markdown={"sft-summary": (report.markdown(summary), "SFT stage: rows, decontamination, training")})
