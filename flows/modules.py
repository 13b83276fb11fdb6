"""Module-DAG reasoning flow (DeCoRL): questions -> module outputs, final answers, per-module contributions, PRM rows.

Reads top to bottom like the stage it runs:
  settings (the module graph is checked at load) -> output folder -> snapshot of the questions (row group = batch)
  -> model endpoint (embedded or configured) -> pre-flight of the judge and every module model -> one Prefect
  task per batch (inside: each question's modules run along the dependency graph, then 1 + k judge calls) ->
  items (data/train-00000-of-00001.parquet), prm_steps.parquet (TRL stepwise form), graph.md + markdown artifact (the Mermaid graph with mean
  latency and mean contribution per module) -> plots/*.png (per-module contribution histograms, schema pass
  rates, tokens and cost; the `modules-plots` artifact) -> the dataset card README.md (a `datasets` config per table)
  -> summary.json.
With `compare` (modules.compare, `--compare`), the same Prefect task then answers every question of its batch
single-shot and judges it with the same judge (tasks/modules/compare.py) -> comparison.parquet, summary.json
`comparison` (graph win rate overall and by difficulty) and the `modules-comparison` table artifact.

Re-running over the same output folder resumes: finished batches are skipped, a killed batch replays its
journaled calls (no finished module or judge call is sent twice).
"""

from __future__ import annotations

import time
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import Field

from evolforge.flows._fanout import BATCH_TASK_OPTIONS, run_batches
from evolforge.flows._params import EndpointParams, endpoint_label, model_endpoint
from evolforge.flows._report import attach_card, attach_plots
from evolforge.flows._runners import build_task_runner
from evolforge.storage import module_sets as store
from evolforge.storage.fs import exists, read_text, write_json_atomic
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import read_ledger
from evolforge.tasks.core.batch import close_gateways, gateway_for, settings_from_json
from evolforge.tasks.core.checks import check_modules
from evolforge.tasks.core.reporting import cost_summary
from evolforge.tasks.modules.batch import assemble, run_modules_batch
from evolforge.tasks.modules.compare import assemble_comparison, comparison_table, run_compare_batch, single_shot_model
from evolforge.tasks.modules.report import contributions_by_module
from evolforge.tasks.modules.run import judge_model, module_models
from evolforge.tasks.report.card import modules_card
from evolforge.tasks.report.plots import modules_plots


class ModulesParams(EndpointParams):
    """Parameters of the modules flow (the form the Prefect UI shows)."""

    input: str = Field(..., description="Questions: jsonl / csv / parquet with a `question` field (modules.question_field; "
                       "else `instruction`, so an evolve run's dataset/evolved.parquet works).")
    out: str = Field("runs/modules", description="Output folder; running again over it resumes.")
    max_items: int | None = Field(None, ge=1, description="Use at most this many questions (default: modules.max_items).")
    aggregation: Literal["integrate", "concat"] | None = Field(None, description="Φ: the answer the judge scores (default: modules.aggregation).")
    ablation: Literal["mask", "recompute"] | None = Field(None, description="What the dependants of a removed module see (default: modules.ablation).")
    compare: bool = Field(False, description="Also answer every question single-shot and judge both answers with the "
                          "same judge: graph win rate overall and by difficulty (true here or modules.compare).")

    def stage_overrides(self) -> dict[str, Any]:
        mods: dict[str, Any] = {}
        for key in ("max_items", "aggregation", "ablation", "compare"):
            if getattr(self, key):
                mods[key] = getattr(self, key)
        return {"modules": mods} if mods else {}


@task(name="modules-batch", **BATCH_TASK_OPTIONS)
def modules_batch_task(out_dir: str, batch: int, settings_json: str, base_url: str, run_id: str) -> dict:
    logger = get_run_logger()

    def progress(done: int, total: int) -> None:
        logger.info("modules batch %d: %d/%d questions done", batch, done, total)

    settings = settings_from_json(settings_json)
    stats = run_modules_batch(out_dir, batch, settings, base_url, run_id, progress)
    if settings.modules.compare:  # after the batch's graph: it reuses the graph's judge scores
        stats["compare"] = run_compare_batch(out_dir, batch, settings, base_url, run_id)
    return stats


@flow(name="modules", log_prints=True)
def modules_flow(params: ModulesParams) -> dict:
    logger = get_run_logger()
    settings = params.settings()
    check_modules(params.input, params.out, settings)  # before anything is created (tasks/core/checks.py)
    cfg = settings.modules
    layout = store.ModulesLayout(params.out).ensure()
    run_layout = RunLayout(params.out).ensure()  # ledger and logs live where every flow keeps them
    run_id = flow_run.id or f"local-{int(time.time())}"
    t_start = time.time()

    if not exists(layout.input):
        n = store.build_input(params.input, layout.input, cfg.batch_size, cfg.question_field, cfg.id_field,
                              cfg.max_items)
        logger.info("took %d questions from %s", n, params.input)

    try:
        with model_endpoint(settings, run_layout) as base_url, build_task_runner(settings.runner) as runner:
            gw = gateway_for(settings, base_url, run_id, layout.root)
            models = {judge_model(settings), *module_models(settings).values()}
            if cfg.compare:
                models.add(single_shot_model(settings))
            gw.check_reachable(("judge",), tuple(sorted(models)))
            logger.info("model endpoint %s; %d modules, exit %s, aggregation %s, ablation %s", gw.describe(),
                        len(cfg.graph), cfg.exit_module.id, cfg.aggregation, cfg.ablation)
            settings_json = settings.model_dump_json()
            batches = run_batches(
                runner, modules_batch_task,
                [(f"modules-batch-{b:05d}", dict(out_dir=str(layout.root), batch=b, settings_json=settings_json,
                                                 base_url=base_url, run_id=run_id))
                 for b in range(store.batch_count(layout))],
                what="modules", checkpoints=layout.root, progress_key="modules-progress")
            gateway_stats = gw.stats.as_dict()
    finally:
        close_gateways(run_id)

    sets = assemble(layout.root, settings)
    create_markdown_artifact(key="modules-graph", markdown=read_text(layout.graph_md),
                             description="Module graph with mean latency and mean contribution per module")
    summary = {
        "run_id": run_id, "out_dir": str(layout.root), "input": params.input,
        "endpoint": endpoint_label(settings, base_url), **sets,
        "batches": {"total": len(batches), "skipped": sum(1 for b in batches if b["skipped"]),
                    "replayed_calls": sum(b.get("replayed_calls", 0) + b.get("compare", {}).get("replayed_calls", 0)
                                          for b in batches)},
        "gateway": gateway_stats, "cost": cost_summary(read_ledger(layout.root)),
        "wall_seconds": round(time.time() - t_start, 2),
        "datasets": {"items": str(layout.items), "prm_steps": str(layout.prm_steps),
                     "prm_rejected": str(layout.prm_rejected), "graph": str(layout.graph_md)},
    }
    if cfg.compare:
        summary["comparison"] = assemble_comparison(layout.root, settings)
        summary["datasets"]["comparison"] = str(layout.comparison)
        create_table_artifact(key="modules-comparison", table=comparison_table(summary["comparison"]),
                              description="Module graph vs single-shot, same judge: graph wins, single-shot wins and "
                              "ties by difficulty; win rate = graph wins / n")
        overall = summary["comparison"]["overall"]
        logger.info("comparison: graph wins %d, single-shot wins %d, ties %d of %d (win rate %s)",
                    overall["graph_wins"], overall["single_shot_wins"], overall["ties"], overall["n"],
                    overall["win_rate"])
    tables = {"items": layout.items, "prm_steps": layout.prm_steps, "prm_rejected": layout.prm_rejected,
              **({"comparison": layout.comparison} if cfg.compare else {})}
    summary["card"] = attach_card(layout.root, tables, modules_card(summary, settings.fingerprint()))
    summary["plots"] = attach_plots(layout, "modules-plots", "Module-DAG plots", lambda: modules_plots(
        contributions_by_module(store.read_items(layout.items).to_dicts(), sets["graph"]["modules"], sets["graph"]["exit"]),
        sets["modules"], summary["cost"].get("by_stage", [])))
    write_json_atomic(layout.summary, summary)
    create_table_artifact(key="modules-counts", table=[{"status": k, "questions": v} for k, v in sets["by_status"].items()],
                          description="Module-DAG reasoning: questions by status")
    logger.info("done: %d questions (%s), %d PRM rows; summary %s", sets["items"],
                ", ".join(f"{k} {v}" for k, v in sets["by_status"].items()), sets["prm"]["rows"], layout.summary)
    return summary


if __name__ == "__main__":
    import sys

    modules_flow(ModulesParams(input=sys.argv[1], out=sys.argv[2] if len(sys.argv) > 2 else "runs/modules"))
