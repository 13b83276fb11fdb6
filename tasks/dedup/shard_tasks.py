"""The dedup shards as tasks on a task runner (threads, Dask or Ray): the shard runner of the dedup flow.

    SubmittedShards(submit, settings)   a shard runner (tasks/dedup/shards.py `ShardRunner`): per sharded search
                                        it saves the shared arrays once under `dedup.shard_dir`
                                        (storage/dedup_shards.py), submits one task per shard through
                                        `submit(task_run_name, parameters)`, collects the results in job order,
                                        and removes the folder; `stats()`: each worker's peak memory and each
                                        shard's seconds (summary.json `stats.shard_workers` / `shard_seconds`)
    run_shard_files(kind, inputs, job, settings, out_dir)
                                        one shard on a worker: memory-map the shared inputs, run it
                                        (tasks/dedup/shards.py `run_shard`), write its result; paths and the
                                        worker's pid, seconds and peak memory back

Prefect-free: flows/dedup.py owns the `dedup-shard` task (which calls `run_shard_files`) and the task runner
(its `submit` is what `SubmittedShards` calls). Each task gets the run's settings as `settings_json`.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any, Callable

from evolforge.config.sections.dedup import DedupSettings
from evolforge.config.settings import Settings
from evolforge.storage.dedup_shards import load_arrays, new_stage_dir, register_store, remove_stage_dir, save_arrays
from evolforge.tasks.core import progress as live_progress
from evolforge.tasks.dedup.shards import run_shard

Submit = Callable[[str, dict], Any]  # (task run name, task parameters) -> a future with .result()


def run_shard_files(kind: str, inputs: dict[str, str], job: dict, settings: DedupSettings, out_dir: str) -> dict:
    """One shard on a worker: memory-map the shared inputs, run it, write its result; paths and worker stats back."""
    t0 = time.perf_counter()
    register_store(settings.shard_dir)
    out = run_shard(kind, load_arrays(inputs), job, settings)
    return {"paths": save_arrays(out_dir, out), "pid": os.getpid(), "seconds": time.perf_counter() - t0,
            "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float:
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


class SubmittedShards:
    """A shard runner that submits one task per shard (see the module docstring)."""

    def __init__(self, submit: Submit, settings: Settings, runner_name: str = ""):
        self.submit = submit
        self.settings = settings
        self.runner_name = runner_name
        self.workers: dict[int, float] = {}      # worker pid -> its peak RSS (MB) seen by a shard
        self.shard_seconds: dict[str, list[float]] = {}

    def __call__(self, kind: str, shared: dict, jobs: list, dedup: DedupSettings) -> list:
        settings_json = self.settings.model_copy(update={"dedup": dedup}).model_dump_json()
        folder = new_stage_dir(dedup.shard_dir or None, kind)
        try:
            inputs = save_arrays(folder / "in", shared)
            tally = live_progress.StepProgress(f"dedup {kind} shards", len(jobs), unit="shards")
            tally.update(detail=f"on {self.runner_name}")
            futures = [self.submit(f"dedup-{kind}-{i}", {"kind": kind, "inputs": inputs, "job": job,
                                                         "settings_json": settings_json,
                                                         "out_dir": str(folder / f"out-{i}")})
                       for i, job in enumerate(jobs)]
            results = []
            for f in futures:
                results.append(f.result())
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

    def stats(self) -> dict:
        """summary.json `stats` entries: peak RSS (MB) per worker pid, seconds per shard by search kind."""
        return {"shard_workers": {str(pid): round(mb, 1) for pid, mb in sorted(self.workers.items())},
                "shard_seconds": self.shard_seconds}
