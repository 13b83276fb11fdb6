"""Which Prefect task runner executes batch tasks: threads (default), Dask or Ray.

`[runner] kind` picks it; `address` joins an existing Dask scheduler or Ray cluster instead of starting a
local one; `max_workers` bounds batches in flight (threads) or sets the local cluster's worker count (Dask,
one thread each). Batch tasks take and return paths only (and the settings as one JSON string, parsed once
per process), so any runner can ship them.

The Prefect API of the workers. A Dask or Ray task runs in a worker process with the flow's Prefect settings,
serialized at submit. When the flow reports to Prefect's temporary (ephemeral) server, those settings name no
API URL, so every worker process started its own temporary server (a subprocess with its own migrations)
before its first task: measured 25-40 s per worker on this 2-core machine, the whole gap between the evolve
flow on Ray (34 items/s) and on threads (141 items/s), see BENCHMARKS.md. The Dask and Ray runners here
submit with the driver's API URL in those settings (`driver_api_url`), so the workers report to the flow's
own server. For a cluster on other machines, an ephemeral server on 127.0.0.1 is out of their reach: such a
run needs PREFECT_API_URL set to a server every machine reaches, and is warned when it is not.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import socket
from typing import Any
from uuid import uuid4

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from evolforge.config.settings import RunnerSettings

log = logging.getLogger("evolforge.runners")


class RunnerUnavailable(RuntimeError):
    pass


def driver_api_url() -> tuple[str, bool]:
    """(the Prefect API URL this process reports to, whether it is Prefect's temporary server it started)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    given = PREFECT_API_URL.value()
    if given:
        return str(given), False
    with get_client(sync_client=True) as client:  # starts (or finds) the temporary server, as the flow did
        return str(client.api_url).rstrip("/"), True


def is_local_address(address: str) -> bool:
    """Whether a Dask scheduler / Ray cluster address (empty: a local cluster) is on this machine."""
    if not address or address == "auto":
        return True
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    try:
        ip = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return False
    if ip.is_loopback:
        return True
    try:
        own = {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        own = set()
    return str(ip) in own


class _DriverApi:
    """Submits with the driver's Prefect API URL in the settings the workers receive (module docstring), and
    keeps the driver's cost per submitted task down:
    - Prefect serializes its whole settings tree into every task it ships (about 60 ms of the driver's CPU per
      task on 2 cores, the largest part of the driver's share in a run of many small tasks): the settings
      context here serializes them once per runner;
    - Dask names a task by hashing its arguments, the Prefect task object included, which it cloudpickles for
      that (about 15 ms per task): the task object is given a token of its own (its key and name; the task run
      id among the arguments keeps every submission's key unique)."""

    evolforge_address: str = ""
    _worker_settings: Any = None

    def __enter__(self):
        out = super().__enter__()
        from prefect.context import SettingsContext
        from prefect.settings import PREFECT_API_URL, get_current_settings

        url, ephemeral = driver_api_url()
        settings = get_current_settings()
        if ephemeral and not is_local_address(self.evolforge_address):
            log.warning("the flow reports to Prefect's temporary server (%s), which workers on other machines "
                        "cannot reach: each of their processes starts its own. Set PREFECT_API_URL to a Prefect "
                        "server every machine reaches.", url)
        elif ephemeral:
            settings = settings.copy_with_update(updates={PREFECT_API_URL: url})
        ctx = SettingsContext.get()
        self._worker_settings = (ctx.profile if ctx else None, settings)
        return out

    def submit(self, task, parameters, wait_for=None, dependencies=None):
        if getattr(task, "__dask_tokenize__", None) is None:
            task.__dask_tokenize__ = lambda: ("prefect-task", task.task_key, task.name)
        if self._worker_settings is None or self._worker_settings[0] is None:
            return super().submit(task, parameters, wait_for=wait_for, dependencies=dependencies)
        profile, settings = self._worker_settings
        with _settings_context_class()(profile=profile, settings=settings):
            return super().submit(task, parameters, wait_for=wait_for, dependencies=dependencies)


_SERIALIZED: dict[tuple[int, bool], tuple[Any, dict]] = {}


@functools.cache
def _settings_context_class():
    """A Prefect SettingsContext whose serialize() is computed once per settings object (what a task runner sends
    with each task): the same dict, so the workers get the same settings."""
    from prefect.context import SettingsContext

    class SettingsContextOnce(SettingsContext):
        def serialize(self, include_secrets: bool = True) -> dict:
            key = (id(self.settings), include_secrets)
            hit = _SERIALIZED.get(key)
            if hit is None or hit[0] is not self.settings:   # the entry holds the settings: no id reuse
                if len(_SERIALIZED) > 64:
                    _SERIALIZED.clear()
                hit = _SERIALIZED[key] = (self.settings, super().serialize(include_secrets=include_secrets))
            return hit[1]

    return SettingsContextOnce


def _dask_runner(cfg: RunnerSettings) -> TaskRunner:
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise RunnerUnavailable("runner.kind = 'dask' needs prefect-dask: pip install 'evolforge[dask]'") from None

    class EvolforgeDaskTaskRunner(_DriverApi, DaskTaskRunner):
        evolforge_address = cfg.address

    if cfg.address:
        return EvolforgeDaskTaskRunner(address=cfg.address)
    return EvolforgeDaskTaskRunner(cluster_kwargs={"n_workers": cfg.max_workers, "threads_per_worker": 1,
                                                   "processes": True, "dashboard_address": None})


def _import_modules(names: list[str]) -> int:
    """A Ray worker's warm-up: import what the flow's tasks need (runs in the worker)."""
    import importlib
    import os

    for name in names:
        importlib.import_module(name)
    return os.getpid()


def _warm_ray_workers(limit: int = 64) -> None:
    """Start one worker process per free CPU of the Ray cluster (at most `limit`) importing Prefect's task engine
    and the running flow's module, without waiting: a worker process starts and imports for 3-9 s on this
    machine, which then overlaps the flow's own start (endpoint, pre-flight, seeds) instead of delaying its
    first batches. The later tasks reuse these processes (same job, same resources)."""
    import ray
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    names = ["prefect.task_engine"] + ([ctx.flow.fn.__module__] if ctx and ctx.flow else [])
    cpus = int(ray.available_resources().get("CPU", 1))
    warm = ray.remote(num_cpus=1)(_import_modules)
    for _ in range(max(1, min(cpus, limit))):
        warm.remote(names)


def _ray_runner(cfg: RunnerSettings) -> TaskRunner:
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        raise RunnerUnavailable("runner.kind = 'ray' needs prefect-ray: pip install 'evolforge[ray]'") from None

    class EvolforgeRayTaskRunner(_DriverApi, RayTaskRunner):
        """prefect-ray's runner, with the driver's API URL (module docstring) and a cheaper submit: prefect-ray
        0.6 serializes the whole Prefect context (settings included: 0.27 s of driver CPU per task, profiled)
        and exports a new Ray remote function for every task (0.04 s); here the flow run's part of the context
        is serialized once per flow run and one remote function serves every task. Same task arguments."""

        evolforge_address = cfg.address
        _context_cache: tuple | None = None
        _remote = None

        def __enter__(self):
            out = super().__enter__()
            _warm_ray_workers()
            return out

        def _base_context(self) -> dict:
            from prefect.context import EngineContext, SettingsContext, TagsContext, TaskRunContext, serialize_context

            # the objects themselves (compared by identity), so an id is never reused while cached
            key = (EngineContext.get(), TaskRunContext.get(), SettingsContext.get().settings,
                   tuple(sorted(TagsContext.get().current_tags)))
            cached = self._context_cache
            if cached is None or any(a is not b for a, b in zip(cached[0][:3], key[:3])) or cached[0][3] != key[3]:
                self._context_cache = cached = (key, serialize_context())
            return cached[1]

        def submit(self, task, parameters, wait_for=None, dependencies=None):
            if not self._started:
                raise RuntimeError("The task runner must be started before submitting work.")
            if self._worker_settings is None or self._worker_settings[0] is None:
                return self._submit(task, parameters, wait_for, dependencies)
            from prefect.context import SettingsContext

            profile, settings = self._worker_settings
            with SettingsContext(profile=profile, settings=settings):
                return self._submit(task, parameters, wait_for, dependencies)

        def _submit(self, task, parameters, wait_for, dependencies):
            import ray
            from prefect.context import AssetContext
            from prefect.utilities.engine import collect_task_run_inputs_sync
            from prefect_ray.context import RemoteOptionsContext
            from prefect_ray.task_runners import PrefectRayFuture

            task_run_id = uuid4()
            task_inputs = {k: collect_task_run_inputs_sync(v, future_cls=PrefectRayFuture)
                           for k, v in parameters.items()}
            context = dict(self._base_context())
            context["asset_context"] = AssetContext.from_task_and_inputs(
                task=task, task_run_id=task_run_id, task_inputs=task_inputs, copy_to_child_ctx=True).serialize()
            parameters, upstream = self._exchange_prefect_for_ray_futures(parameters)
            options = RemoteOptionsContext.get().current_remote_options
            if options:
                remote = ray.remote(**options)(self._run_prefect_task)
            else:
                if self._remote is None:
                    self._remote = ray.remote(self._run_prefect_task)
                remote = self._remote
            ref = remote.options(name=task.name).remote(
                *upstream, task=task, task_run_id=task_run_id, parameters=parameters, wait_for=wait_for,
                dependencies=dependencies, context=context)
            return PrefectRayFuture(task_run_id=task_run_id, wrapped_future=ref)

    return EvolforgeRayTaskRunner(address=cfg.address or None)


def build_task_runner(cfg: RunnerSettings) -> TaskRunner:
    if cfg.kind == "threads":
        return ThreadPoolTaskRunner(max_workers=cfg.max_workers)
    if cfg.kind == "dask":
        return _dask_runner(cfg)
    if cfg.kind == "ray":
        return _ray_runner(cfg)
    raise RunnerUnavailable(f"unknown runner.kind {cfg.kind!r}")
