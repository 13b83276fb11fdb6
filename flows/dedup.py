"""Dedup flow: any jsonl, parquet or csv with a text field -> kept set + dropped set with reasons.

input -> exact, MinHash + LSH and embedding dedup (with `index`, also against a persistent index, which it then
extends, so a dataset can be deduplicated incrementally) -> OUT/kept.<fmt>, OUT/dropped.<fmt> (with
dedup_duplicate_of, dedup_method, dedup_similarity, ...), summary.json (counts, per-method counts and timings) and
the `dedup-summary` table artifact. Parameters and check: tasks/dedup/stage.py; files: storage/dedup_sets.py; the
figures: tasks/dedup/report.py. The same methods run inside every evolution round (tasks/evolve/dedup_round.py).

The dedup is the engine's plan (tasks/dedup/plan.py); this flow only schedules its steps. With `dedup.shards` = 1
there is nothing to spread: one `dedup-file` task runs the plan in its process (tasks/dedup/pipeline.py
`dedup_file`). With more, every batch of the plan's steps becomes `dedup-step` tasks on the `[runner]` task
runner (one per shard, or per run of shards: at most `dedup.step_tasks` per batch), so a Dask or Ray cluster
spreads them over its workers; they exchange files through the work folder under `dedup.shard_dir`
(storage/dedup_work.py). Same settings, same kept and dropped records either way.
"""

from __future__ import annotations

import contextlib

from prefect import flow, task

from evolforge.flows._runners import build_task_runner
from evolforge.flows._stage import finish_stage, stage_run
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.dedup import report
from evolforge.tasks.dedup.distributed import run_step, work_for
from evolforge.tasks.dedup.index import index_lock
from evolforge.tasks.dedup.pipeline import dedup_file
from evolforge.tasks.dedup.plan import DedupJob, Step, run_plan
from evolforge.tasks.dedup.stage import DedupParams

__all__ = ["DedupParams", "dedup_flow"]


@task(name="dedup-file")
def dedup_file_task(input: str, text_field: str, out_dir: str, id_field: str | None, index: str | None,
                    settings_json: str) -> dict:
    return dedup_file(input, text_field, out_dir, settings_from_json(settings_json).dedup, id_field=id_field,
                      index_dir=index)


@task(name="dedup-step", retries=2, retry_delay_seconds=1)
def dedup_step_task(step: str, work: str, args: list[dict], settings_json: str) -> list[dict]:
    """One step for one or more shards, one after the other (at most `dedup.step_tasks` tasks per batch)."""
    s = settings_from_json(settings_json).dedup
    return [run_step(step, work, a, s) for a in args]


def _task_name(chunk: list[Step]) -> str:
    first, last = chunk[0].args(), chunk[-1].args()
    shards = [f"{first['shard']}" + (f"..{last['shard']}" if len(chunk) > 1 else "")] if "shard" in first else []
    return "dedup-" + "-".join([chunk[0].kind] + [str(first[k]) for k in ("phase", "round") if k in first] + shards)


def on_workers(runner, p: DedupParams, settings, settings_json: str, logger) -> dict:
    """The plan's steps as `dedup-step` tasks on `runner`, batch after batch; this process keeps the steps' records
    (counts and paths) only. With an index, its lock is held from before the work folder is named to the end."""
    s = settings.dedup
    submitted = [0]

    def execute(batch: list[Step]) -> list[dict]:
        n = min(len(batch), s.step_tasks)
        futures = [runner.submit(dedup_step_task.with_options(task_run_name=_task_name(c)), parameters={
            "step": c[0].kind, "work": work.location, "args": [x.args() for x in c], "settings_json": settings_json})
            for c in (batch[len(batch) * i // n: len(batch) * (i + 1) // n] for i in range(n))]
        submitted[0] += len(futures)
        return [r for f in futures for r in f.result()]

    with index_lock(p.index, s) if p.index else contextlib.nullcontext():
        work = work_for(p.input, p.out, s, p.index)
        job = DedupJob(input=str(p.input), text_field=p.text_field, id_field=p.id_field, index=p.index, out=str(p.out))
        summary = run_plan(job, s, work, execute, progress=True, scheduled=lambda: {"prefect_tasks": submitted[0] + 1})
    work.remove()
    st = summary["stats"]
    logger.info("%d records in %d shards on %s: %d steps in %d tasks, %d reused", st["records"], s.shards,
                settings.runner.kind, st["steps"], st["prefect_tasks"], len(st["steps_reused"]))
    return summary


@flow(name="dedup", log_prints=True)
def dedup_flow(params: DedupParams) -> dict:
    with stage_run("dedup", params) as run:
        settings, p = run.settings, params
        if settings.dedup.shards == 1:
            summary = dedup_file_task(p.input, p.text_field, p.out, p.id_field, p.index, run.settings_json)
        else:
            with build_task_runner(settings.runner) as runner:
                summary = on_workers(runner, p, settings, run.settings_json, run.logger)
        run.logger.info("kept %d, dropped %d -> %s", summary["kept"], summary["dropped"], p.out)
        summary = report.plain(summary)
        return finish_stage(run, summary, cost=False, counts=report.counts(summary),
                            tables={"dedup-summary": (report.removed_by_method(summary), f"Dedup of {p.input}")})
