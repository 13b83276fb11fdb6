"""Task synthesis flow: seeds -> verified Python tasks and math problems, with the cost of every task.

seeds (an evolve run's dataset/evolved.parquet, or any jsonl / parquet / csv of instructions) -> one Prefect
task per batch (propose, sandboxed tests, repair loop, solver check; resumable from parts and call journals)
-> the tasks table (data/train-00000-of-00001.parquet), rejected.parquet, cost_per_task.parquet/.csv (calls,
tokens, USD of the proposal and of the validation (repairs and the final solver check, ledger stage `validate`),
repairs, wall and sandbox seconds per task) -> summary.json (with the models that proposed and validated, and a
warning when they are one model), the dataset card, plots, and Prefect table + markdown artifacts. Parameters and check: tasks/synthesis/stage.py;
files: storage/synthesis_sets.py; the figures: tasks/synthesis/report.py.
"""

from __future__ import annotations

import polars as pl
from prefect import flow, task

from evolforge.flows._fanout import BATCH_TASK_OPTIONS
from evolforge.flows._stage import finish_stage, stage_run
from evolforge.storage.datasets import import_seeds
from evolforge.storage.ledger import read_ledger
from evolforge.storage.parts import write_table_atomic
from evolforge.storage.synthesis_sets import write_csv_atomic, write_task_tables
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.core.reporting import cost_summary
from evolforge.tasks.sandbox.run import check_sandbox_available
from evolforge.tasks.synthesis import report
from evolforge.tasks.synthesis.batch import run_synthesize_batch
from evolforge.tasks.synthesis.stage import ROLES, SynthesizeParams
from evolforge.tasks.synthesis.synthesize import roles, same_model_warning

__all__ = ["SynthesizeParams", "synthesize_flow"]


@task(name="synthesize-batch", **BATCH_TASK_OPTIONS)
def synthesize_batch_task(out_dir: str, batch: int, settings_json: str, base_url: str, run_id: str) -> dict:
    return run_synthesize_batch(out_dir, batch, settings_from_json(settings_json), base_url, run_id)


@flow(name="synthesize", log_prints=True)
def synthesize_flow(params: SynthesizeParams) -> dict:
    with stage_run("synthesize", params) as run:
        lay, settings = run.folder, run.settings
        check_sandbox_available(settings.sandbox)  # refuse before spending anything
        warning = same_model_warning(settings)  # no independent validator: said once, and in the summary
        if warning:
            run.logger.warning(warning)
        run.snapshot(lay.seeds, lambda: import_seeds(
            params.seeds, lay.input, lay.rejects, batch_size=settings.synthesis.batch_size,
            **settings.input.model_dump(include={"instruction_field", "id_field", "domain_field", "max_chars"})))
        with run.endpoint(ROLES):
            run.batches(synthesize_batch_task, lay.seeds, what="synthesis")
        table = pl.from_arrow(lay.all_parts())
        write_task_tables(lay, table.to_arrow())  # none kept: data/ holds the rejected split (storage/synthesis_sets.py)
        ledger = read_ledger(lay.root)
        costs, cost = report.cost_per_task(ledger, table), cost_summary(ledger)
        write_table_atomic(costs.to_arrow(), lay.cost_per_task)
        write_csv_atomic(costs, lay.cost_per_task.with_suffix(".csv"))
        summary = {**({"warning": warning} if warning else {}),
                   **report.summarize(table, costs, roles(settings)), "datasets": {
            "tasks": str(lay.tasks), "rejected": str(lay.rejected), "cost_per_task": str(lay.cost_per_task)}}
        run.logger.info("synthesis: %d kept of %d proposed -> %s", summary["kept"], summary["proposed"], lay.tasks)
        return finish_stage(
            run, summary, cost=False, counts={k: summary[k] for k in ("proposed", "kept")},
            plots_key="synthesis-plots", plots=("Task synthesis plots", lambda: report.plots(
                table.select("kind", "status", "difficulty").to_dicts(), cost.get("by_stage", []))),
            card=({"tasks": lay.tasks, "rejected": lay.rejected, "cost_per_task": lay.cost_per_task},
                  report.card({"run_id": run.run_id, **summary}, settings.fingerprint(), cost)),
            tables={"synthesis-cost-per-task": (costs.head(500).to_dicts(), "Cost per task: calls, tokens, USD, "
                                                "wall and sandbox seconds by phase")},
            markdown={"synthesis-summary": (report.markdown(summary, run.run_id), "Task synthesis summary")})
