"""Dedup flow: any jsonl, parquet or csv with a text field -> kept set + dropped set with reasons.

input -> exact, MinHash + LSH and embedding dedup (tasks/dedup/pipeline.py `dedup_file`; with `index`, also
against a persistent index, which it then extends, so a dataset can be deduplicated incrementally) ->
OUT/kept.<fmt>, OUT/dropped.<fmt> (with dedup_duplicate_of, dedup_method, dedup_similarity, ...), summary.json
(counts, per-method counts and timings) and the `dedup-summary` table artifact. Parameters and check:
tasks/dedup/stage.py; files: storage/dedup_sets.py; the figures: tasks/dedup/report.py. The same methods run
inside every evolution round (tasks/evolve/dedup_round.py).

With `dedup.shards` = 1 the dedup is one `dedup-file` task. With more, the flow drives it and runs the MinHash
band shards and the embedding search shards as `dedup-shard` tasks (one per shard) on the `[runner]` task
runner, so a Dask or Ray cluster spreads them over its workers (tasks/dedup/shard_tasks.py); the shards
exchange .npy files through `dedup.shard_dir` (storage/dedup_shards.py). Same settings, same kept and dropped
records as in one process.
"""

from __future__ import annotations

from prefect import flow, task

from evolforge.flows._runners import build_task_runner
from evolforge.flows._stage import finish_stage, stage_run
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.dedup import report
from evolforge.tasks.dedup.pipeline import dedup_file
from evolforge.tasks.dedup.shard_tasks import SubmittedShards, run_shard_files
from evolforge.tasks.dedup.stage import DedupParams

__all__ = ["DedupParams", "dedup_flow"]


@task(name="dedup-file")
def dedup_file_task(input: str, text_field: str, out_dir: str, id_field: str | None, index: str | None,
                    settings_json: str) -> dict:
    return dedup_file(input, text_field, out_dir, settings_from_json(settings_json).dedup, id_field=id_field,
                      index_dir=index)


@task(name="dedup-shard")
def dedup_shard_task(kind: str, inputs: dict[str, str], job: dict, settings_json: str, out_dir: str) -> dict:
    return run_shard_files(kind, inputs, job, settings_from_json(settings_json).dedup, out_dir)


@flow(name="dedup", log_prints=True)
def dedup_flow(params: DedupParams) -> dict:
    with stage_run("dedup", params) as run:
        settings, p = run.settings, params
        if settings.dedup.shards == 1:
            summary = dedup_file_task(p.input, p.text_field, p.out, p.id_field, p.index, run.settings_json)
        else:
            with build_task_runner(settings.runner) as runner:
                shards = SubmittedShards(lambda name, parameters: runner.submit(
                    dedup_shard_task.with_options(task_run_name=name), parameters=parameters),
                    settings, type(runner).__name__)
                summary = dedup_file(p.input, p.text_field, p.out, settings.dedup, id_field=p.id_field,
                                     index_dir=p.index, shard_runner=shards)
            summary["stats"].update(shards.stats())
            run.logger.info("%d shards on %s: %d worker processes", settings.dedup.shards, settings.runner.kind,
                            len(shards.workers))
        run.logger.info("kept %d, dropped %d -> %s", summary["kept"], summary["dropped"], p.out)
        summary = report.plain(summary)
        return finish_stage(run, summary, cost=False, counts=report.counts(summary),
                            tables={"dedup-summary": (report.removed_by_method(summary), f"Dedup of {p.input}")})
