"""Module-DAG reasoning flow (DeCoRL): questions -> module outputs, final answers, per-module contributions, PRM rows.

questions (jsonl / csv / parquet, or an evolve run's dataset/evolved.parquet) -> snapshot (modules_input.parquet,
row group = batch) -> model endpoint (embedded or configured) and pre-flight of the judge and every module model
-> one Prefect task per batch (inside: each question's modules run along the dependency graph, then 1 + k judge
calls; with `compare` (modules.compare, `--compare`) the same task then answers every question of its batch
single-shot and judges it with the same judge, tasks/modules/compare.py) -> items
(data/train-00000-of-00001.parquet), prm_steps.parquet (TRL stepwise form), prm_rejected.parquet, graph.md (the
Mermaid graph with mean latency and mean contribution per module; the `modules-graph` artifact), with `compare`
comparison.parquet and summary.json `comparison` (graph win rate overall and by difficulty; the
`modules-comparison` artifact) -> the `modules-counts` artifact, plots/*.png (`modules-plots`), the dataset card
and summary.json. Parameters and check: tasks/modules/stage.py; files: storage/module_sets.py; the figures:
tasks/modules/report.py. Re-running over the same folder resumes: finished batches are skipped, a killed batch
replays its journaled calls (no finished module or judge call is sent twice).
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task

from evolforge.flows._fanout import BATCH_TASK_OPTIONS
from evolforge.flows._stage import finish_stage, stage_run
from evolforge.storage.fs import read_text
from evolforge.storage.ledger import read_ledger
from evolforge.storage.module_sets import build_input
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.core.reporting import cost_summary
from evolforge.tasks.modules import report
from evolforge.tasks.modules.batch import assemble, endpoint_models, run_modules_batch
from evolforge.tasks.modules.compare import assemble_comparison, comparison_table, run_compare_batch
from evolforge.tasks.modules.stage import ModulesParams

__all__ = ["ModulesParams", "modules_flow"]


@task(name="modules-batch", **BATCH_TASK_OPTIONS)
def modules_batch_task(out_dir: str, batch: int, settings_json: str, base_url: str, run_id: str) -> dict:
    logger, settings = get_run_logger(), settings_from_json(settings_json)

    def progress(done: int, total: int) -> None:
        logger.info("modules batch %d: %d/%d questions done", batch, done, total)

    stats = run_modules_batch(out_dir, batch, settings, base_url, run_id, progress)
    if settings.modules.compare:  # after the batch's graph: it reuses the graph's judge scores
        stats["compare"] = run_compare_batch(out_dir, batch, settings, base_url, run_id)
    return stats


@flow(name="modules", log_prints=True)
def modules_flow(params: ModulesParams) -> dict:
    with stage_run("modules", params) as run:
        lay, settings, cfg = run.folder, run.settings, run.settings.modules
        run.snapshot(lay.questions, lambda: build_input(params.input, lay.input, cfg.batch_size, cfg.question_field,
                                                        cfg.id_field, cfg.max_items), "questions")
        with run.endpoint(("judge",), endpoint_models(settings), log=report.describe(settings)):
            batches = run.batches(modules_batch_task, lay.questions)
        sets = assemble(lay.root, settings)
        summary = {"input": params.input, **sets, "batches": report.batch_totals(batches),
                   "cost": cost_summary(read_ledger(lay.root)), "datasets": report.datasets(lay, cfg.compare)}
        tables = {"modules-counts": (report.status_rows(sets["by_status"]), "Module-DAG reasoning: questions by status")}
        if cfg.compare:
            summary["comparison"] = assemble_comparison(lay.root, settings)
            tables["modules-comparison"] = (comparison_table(summary["comparison"]), "Module graph vs single-shot, "
                                            "same judge: graph wins, single-shot wins and ties by difficulty; win "
                                            "rate = graph wins / n")
            run.logger.info("comparison: %s", report.comparison_line(summary["comparison"]))
        run.logger.info("done: %s; summary %s", report.done_line(sets), lay.summary)
        return finish_stage(
            run, summary, counts={k: sets[k] for k in ("items", "by_status")} | {"prm_rows": sets["prm"]["rows"]},
            card=(report.card_tables(lay, cfg.compare), report.card({"run_id": run.run_id, **summary},
                                                                     settings.fingerprint())),
            plots=("Module-DAG plots", lambda: report.run_plots(lay, summary)), tables=tables,
            markdown={"modules-graph": (read_text(lay.graph_md), "Module graph with mean latency and mean "
                                        "contribution per module")})
