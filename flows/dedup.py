"""Dedup flow: any jsonl, parquet or csv with a text field -> kept set + dropped set with reasons.

    OUT/kept.<fmt>      the kept rows, every column, input order
    OUT/dropped.<fmt>   dropped rows + dedup_duplicate_of, dedup_method (exact | minhash | embedding),
                        dedup_similarity, dedup_matched_id, dedup_matched_similarity, dedup_detail
    OUT/summary.json    counts and per-method timings

With `index` set, records are also checked against (and then added to) a
persistent index, so a dataset can be deduplicated incrementally over time.
The same methods run inside every evolution round (see tasks/evolve/dedup_round.py).

Scale-out: with `dedup.shards` > 1 the flow drives the dedup itself and runs the MinHash band shards and the
embedding search shards as Prefect tasks (one per shard) on the `[runner]` task runner, so a Dask or Ray
cluster spreads them over its workers; the shards exchange .npy files through `dedup.shard_dir`
(storage/dedup_shards.py). The kept and dropped records are those of the same settings in one process.
"""

from __future__ import annotations

import os
import resource
import time

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from pydantic import Field

from evolforge.config.sections.dedup import DedupSettings
from evolforge.flows._params import StageParams
from evolforge.flows._runners import build_task_runner
from evolforge.storage.dedup_shards import load_arrays, new_stage_dir, remove_stage_dir, save_arrays
from evolforge.tasks.core import progress as live_progress
from evolforge.tasks.core.checks import check_dedup
from evolforge.tasks.dedup.pipeline import dedup_file
from evolforge.tasks.dedup.shards import run_shard


class DedupParams(StageParams):
    """Parameters of the dedup flow."""

    input: str = Field(..., description="A jsonl, parquet or csv file.")
    text_field: str = Field("instruction", description="Column holding the text to deduplicate.")
    id_field: str | None = Field(None, description="Column with record ids (default: row numbers).")
    out: str = Field(..., description="Output folder for kept / dropped / summary.json.")
    index: str | None = Field(None, description="Persistent index folder to check against and extend (optional).")


@task(name="dedup-file")
def dedup_file_task(params_json: str) -> dict:
    p = DedupParams.model_validate_json(params_json)
    settings = p.settings()
    return dedup_file(p.input, p.text_field, p.out, settings.dedup, id_field=p.id_field, index_dir=p.index)


@task(name="dedup-shard")
def dedup_shard_task(kind: str, inputs: dict[str, str], job: dict, settings_json: str, out_dir: str) -> dict:
    """One shard on a worker: memory-map the shared inputs, run it, write its result; paths and worker stats back."""
    t0 = time.perf_counter()
    out = run_shard(kind, load_arrays(inputs), job, DedupSettings.model_validate_json(settings_json))
    return {"paths": save_arrays(out_dir, out), "pid": os.getpid(), "seconds": time.perf_counter() - t0,
            "peak_rss_mb": _peak_rss_mb()}


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: its own address space; ru_maxrss would carry a big parent's peak
    over fork + exec, as a Dask nanny's worker inherits the driver's)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PrefectShards:
    """A shard runner (tasks/dedup/shards.py) that runs one `dedup-shard` task per shard on a Prefect task runner."""

    def __init__(self, runner, shard_dir: str = ""):
        self.runner = runner
        self.shard_dir = shard_dir
        self.workers: dict[int, float] = {}      # worker pid -> its peak RSS (MB) seen by a shard
        self.shard_seconds: dict[str, list[float]] = {}

    def __call__(self, kind: str, shared: dict, jobs: list, settings: DedupSettings) -> list:
        folder = new_stage_dir(self.shard_dir or None, kind)
        try:
            inputs = save_arrays(folder / "in", shared)
            tally = live_progress.StepProgress(f"dedup {kind} shards", len(jobs), unit="shards")
            tally.update(detail=f"on {type(self.runner).__name__}")
            futures = [self.runner.submit(dedup_shard_task.with_options(task_run_name=f"dedup-{kind}-{i}"),
                                          parameters={"kind": kind, "inputs": inputs, "job": job,
                                                      "settings_json": settings.model_dump_json(),
                                                      "out_dir": str(folder / f"out-{i}")})
                       for i, job in enumerate(jobs)]
            results = []
            for f in futures:
                r = f.result()
                results.append(r)
                tally.update(advance=1)
            tally.finish()
            parts = []
            for r in results:
                self.workers[r["pid"]] = max(self.workers.get(r["pid"], 0.0), r["peak_rss_mb"])
                self.shard_seconds.setdefault(kind, []).append(r["seconds"])
                parts.append({k: v.copy() for k, v in load_arrays(r["paths"]).items()})
            return parts
        finally:
            remove_stage_dir(folder)


@flow(name="dedup", log_prints=True)
def dedup_flow(params: DedupParams) -> dict:
    logger = get_run_logger()
    settings = params.settings()  # a bad config fails before anything is read
    check_dedup(params.input, params.text_field, params.out)  # before anything is created (tasks/core/checks.py)
    if settings.dedup.shards == 1:
        summary = dedup_file_task(params.model_dump_json())
    else:
        with build_task_runner(settings.runner) as runner:
            shards = PrefectShards(runner, settings.dedup.shard_dir)
            summary = dedup_file(params.input, params.text_field, params.out, settings.dedup, id_field=params.id_field,
                                 index_dir=params.index, shard_runner=shards)
        summary["stats"]["shard_workers"] = {str(pid): round(mb, 1) for pid, mb in sorted(shards.workers.items())}
        summary["stats"]["shard_seconds"] = shards.shard_seconds
        logger.info("%d shards on %s: %d worker processes", settings.dedup.shards, settings.runner.kind, len(shards.workers))
    stats = summary["stats"]
    rows = [{"method": m, "removed": int(stats.get(f"dropped_{m}", 0))} for m in ("exact", "minhash", "embedding")]
    rows.append({"method": "kept", "removed": summary["kept"]})
    create_table_artifact(key="dedup-summary", table=rows, description=f"Dedup of {params.input}")
    logger.info("kept %d, dropped %d -> %s", summary["kept"], summary["dropped"], params.out)
    return summary
