"""Which Prefect task runner executes batch tasks: threads (default), Dask or Ray.

`[runner] kind` picks it; `address` joins an existing Dask scheduler or Ray
cluster instead of starting a local one; `max_workers` bounds batches in flight
(threads) or sets the local cluster's worker count (Dask, one thread each).
Batch tasks take and return paths only, so any runner can ship them.
"""

from __future__ import annotations

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from evolforge.config.settings import RunnerSettings


class RunnerUnavailable(RuntimeError):
    pass


def build_task_runner(cfg: RunnerSettings) -> TaskRunner:
    if cfg.kind == "threads":
        return ThreadPoolTaskRunner(max_workers=cfg.max_workers)
    if cfg.kind == "dask":
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError:
            raise RunnerUnavailable("runner.kind = 'dask' needs prefect-dask: pip install 'evolforge[dask]'") from None
        if cfg.address:
            return DaskTaskRunner(address=cfg.address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.max_workers, "threads_per_worker": 1,
                                              "processes": True, "dashboard_address": None})
    if cfg.kind == "ray":
        try:
            from prefect_ray import RayTaskRunner
        except ImportError:
            raise RunnerUnavailable("runner.kind = 'ray' needs prefect-ray: pip install 'evolforge[ray]'") from None
        return RayTaskRunner(address=cfg.address or None)
    raise RunnerUnavailable(f"unknown runner.kind {cfg.kind!r}")
