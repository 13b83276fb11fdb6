"""Task synthesis flow: seeds -> verified Python tasks and math problems, with the cost of every task.

seeds (an evolve run's dataset/evolved.parquet, or any jsonl / parquet / csv of
instructions) -> one Prefect task per batch (propose, sandboxed tests, repair
loop, solver check; resumable from parts and call journals) -> the tasks table
(data/train-00000-of-00001.parquet: what load_dataset("parquet", data_dir=OUT) loads), rejected.parquet, cost_per_task.parquet/.csv (the headline: calls, tokens, USD,
wall and sandbox seconds of proposal, repairs and solver attempts per task),
summary.json, and Prefect table + markdown artifacts.
"""

from __future__ import annotations

import time

import polars as pl
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import Field

from evolforge.flows._fanout import BATCH_TASK_OPTIONS, run_batches
from evolforge.flows._params import EndpointParams, model_endpoint
from evolforge.flows._report import attach_card, attach_plots
from evolforge.flows._runners import build_task_runner
from evolforge.storage.datasets import import_seeds
from evolforge.storage.fs import exists
from evolforge.storage.ledger import known_sum, read_ledger
from evolforge.storage.parts import num_row_groups, write_table_atomic
from evolforge.storage.rounds import write_json_atomic
from evolforge.storage.synthesis_sets import SynthLayout, write_csv_atomic
from evolforge.tasks.core.batch import close_gateways, gateway_for, settings_from_json
from evolforge.tasks.core.checks import check_synthesize
from evolforge.tasks.core.reporting import cost_summary, usd
from evolforge.tasks.report.card import synthesis_card
from evolforge.tasks.report.plots import synthesis_plots
from evolforge.tasks.sandbox.run import check_sandbox_available
from evolforge.tasks.synthesis.batch import run_synthesize_batch


class SynthesizeParams(EndpointParams):
    """Parameters of the synthesis flow ([synthesis] and [sandbox] sections of the config)."""

    seeds: str = Field(..., description="Instructions to draw tasks from: an evolve run's dataset/evolved.parquet or any file.")
    out: str = Field("runs/synthesize", description="Output folder; running again over it resumes.")


@task(name="synthesize-batch", **BATCH_TASK_OPTIONS)
def synthesize_batch_task(out_dir: str, batch: int, settings_json: str, base_url: str, run_id: str) -> dict:
    return run_synthesize_batch(out_dir, batch, settings_from_json(settings_json), base_url, run_id)


def cost_per_task(ledger: pl.DataFrame, tasks: pl.DataFrame) -> pl.DataFrame:
    """One row per task: calls, tokens and USD per phase (proposal, repair, solver), wall and sandbox seconds."""
    phase = {"synthesize": "proposal", "repair": "repairs", "solver": "solver"}
    led = ledger.with_columns(pl.col("stage").replace(phase).alias("phase"))
    per = led.group_by("task_id", "phase").agg(
        pl.len().alias("calls"), (pl.col("prompt_tokens").fill_null(0) + pl.col("completion_tokens").fill_null(0)).sum().alias("tokens"),
        known_sum("cost_usd").alias("usd"))
    wide = tasks.select("task_id", "kind", "status", "reject_reason", "difficulty", "repairs", "wall_seconds",
                        "sandbox_seconds")
    for ph in ("proposal", "repairs", "solver"):
        part = per.filter(pl.col("phase") == ph).select(
            "task_id", pl.col("calls").alias(f"{ph}_calls"), pl.col("tokens").alias(f"{ph}_tokens"),
            pl.col("usd").alias(f"{ph}_usd"))
        wide = wide.join(part, on="task_id", how="left")
    totals = led.group_by("task_id").agg(pl.len().alias("calls"), known_sum("cost_usd").alias("usd"),
                                         pl.col("cost_usd").is_null().sum().alias("unpriced_calls"))
    out = wide.join(totals, on="task_id", how="left")
    # a task without calls cost nothing; a task with an unpriced call has an unknown cost (null), never 0
    no_calls = pl.col("calls").is_null()
    return out.with_columns(
        *[pl.when(no_calls).then(0).otherwise(pl.col(c).fill_null(0)).alias(c)
          for c in out.columns if c.endswith(("_calls", "_tokens")) or c in ("calls", "unpriced_calls")],
        *[pl.when(no_calls | pl.col(c.replace("_usd", "_calls")).is_null()).then(0.0).otherwise(pl.col(c)).alias(c)
          for c in out.columns if c.endswith("_usd")],
        pl.when(no_calls).then(0.0).otherwise(pl.col("usd")).alias("usd"),
    ).sort("task_id")


def summarize(table: pl.DataFrame, costs: pl.DataFrame) -> dict:
    kept = costs.filter(pl.col("status") == "kept")
    reasons = table.filter(pl.col("status") != "kept").group_by("reject_reason").len().sort("len", descending=True)
    n = table.height
    return {
        "proposed": n, "kept": kept.height, "yield": round(kept.height / n, 4) if n else 0.0,
        "by_kind": table.group_by("kind", "status").len().to_dicts(),
        "by_difficulty": kept.group_by("difficulty").len().to_dicts() if kept.height else [],
        "rejections": {r["reject_reason"]: r["len"] for r in reasons.to_dicts()},
        "total_usd": _known(costs["usd"], costs["usd"].sum()), "unpriced_calls": int(costs["unpriced_calls"].sum()),
        "usd_per_kept_task": {"mean": _known(kept["usd"], kept["usd"].mean()),
                              "median": _known(kept["usd"], kept["usd"].median())},
        "minutes_per_kept_task": {"mean": _f(kept["wall_seconds"].mean(), 60), "median": _f(kept["wall_seconds"].median(), 60)},
        "sandbox_seconds": float(costs["sandbox_seconds"].sum()),
        # all model calls and sandbox time, divided over the kept tasks (what a kept task really costs)
        "usd_per_kept_task_all_in": _known(costs["usd"], costs["usd"].sum() / kept.height) if kept.height else None,
    }


def _known(values: pl.Series, stat) -> float | None:
    """A cost statistic, or None (unknown) when any task in it has an unpriced call."""
    return None if values.null_count() else _f(stat)


def _f(v, div: float = 1.0):
    return None if v is None else round(float(v) / div, 6)


@flow(name="synthesize", log_prints=True)
def synthesize_flow(params: SynthesizeParams) -> dict:
    logger = get_run_logger()
    settings = params.settings()
    check_synthesize(params.seeds, params.out, settings)  # before anything is created (tasks/core/checks.py)
    check_sandbox_available(settings.sandbox)  # refuse before spending anything
    lay = SynthLayout(params.out).ensure()
    run_id = flow_run.id or f"local-{int(time.time())}"
    if not exists(lay.input):
        counts = import_seeds(params.seeds, lay.input, lay.rejects, batch_size=settings.synthesis.batch_size,
                              **settings.input.model_dump(include={"instruction_field", "id_field", "domain_field", "max_chars"}))
        logger.info("synthesis seeds: %d (%d rejected)", counts["seeds"], counts["rejected"])
    settings_json = settings.model_dump_json()
    try:
        with model_endpoint(settings, lay) as base_url, build_task_runner(settings.runner) as runner:
            gateway_for(settings, base_url, run_id, lay.root).check_reachable(("synthesize", "solver"))
            run_batches(runner, synthesize_batch_task,
                        [(f"synthesize-batch-{b:05d}", dict(out_dir=str(lay.root), batch=b, settings_json=settings_json,
                                                           base_url=base_url, run_id=run_id))
                         for b in range(num_row_groups(lay.input))],
                        what="synthesis", checkpoints=lay.root, progress_key="synthesis-progress")
    finally:
        close_gateways(run_id)
    table = pl.from_arrow(lay.all_parts())
    write_table_atomic(table.filter(pl.col("status") == "kept").to_arrow(), lay.tasks)
    write_table_atomic(table.filter(pl.col("status") != "kept").to_arrow(), lay.rejected)
    ledger = read_ledger(lay.root)
    costs = cost_per_task(ledger, table)
    write_table_atomic(costs.to_arrow(), lay.cost_per_task)
    write_csv_atomic(costs, lay.cost_per_task.with_suffix(".csv"))
    summary = {"run_id": run_id, "out_dir": str(lay.root), **summarize(table, costs),
               "datasets": {"tasks": str(lay.tasks), "rejected": str(lay.rejected),
                            "cost_per_task": str(lay.cost_per_task)}}
    cost = cost_summary(ledger)
    summary["plots"] = attach_plots(lay, "synthesis-plots", "Task synthesis plots", lambda: synthesis_plots(
        table.select("kind", "status", "difficulty").to_dicts(), cost.get("by_stage", [])))
    summary["card"] = attach_card(lay.root, {"tasks": lay.tasks, "rejected": lay.rejected,
                                             "cost_per_task": lay.cost_per_task},
                                  synthesis_card(summary, settings.fingerprint(), cost))
    write_json_atomic(lay.summary, summary)
    create_table_artifact(key="synthesis-cost-per-task", table=costs.head(500).to_dicts(),
                          description="Cost per task: calls, tokens, USD, wall and sandbox seconds by phase")
    md = [f"# Task synthesis `{run_id}`", "",
          f"Yield: {summary['kept']} kept / {summary['proposed']} proposed ({summary['yield']:.0%})", "",
          f"Per kept task: mean {usd(summary['usd_per_kept_task']['mean'])}, median "
          f"{usd(summary['usd_per_kept_task']['median'])}; mean {summary['minutes_per_kept_task']['mean'] or 0:.2f} min",
          f"Sandbox seconds: {summary['sandbox_seconds']:.1f}; unpriced calls: {summary['unpriced_calls']}", "",
          "## Rejections", ""] + [f"- {k}: {v}" for k, v in summary["rejections"].items()]
    create_markdown_artifact(key="synthesis-summary", markdown="\n".join(md), description="Task synthesis summary")
    logger.info("synthesis: %d kept of %d proposed -> %s", summary["kept"], summary["proposed"], lay.tasks)
    return summary
