"""The preamble and epilogue every stage flow shares, so a flow body is its DAG and nothing else.

    with stage_run("synthesize", params) as run:        # settings, fail-fast check, folder + stage.json, run id
        run.snapshot(run.folder.tasks_set, lambda: ...)  # the input snapshot, once (row group = batch)
        with run.endpoint(("synthesize", "solver")) as ep:   # model endpoint + task runner + gateway pre-flight
            run.batches(synthesize_batch_task, run.folder.tasks_set)  # one Prefect task per batch
        ...
        return finish_stage(run, summary, card=..., plots=..., artifacts=...)

`stage_run` loads the settings from the parameters (a bad config fails first), runs the stage's input check
(tasks/<stage>/checks.py; before anything is created, the same check the CLI runs), creates the output folder
and writes its stage.json marker (storage/folder.py), and gives the run its id (the Prefect flow run's). When
the endpoint's pre-flight (`run.endpoint`: one minimal call per model) fails, that is a PreflightError (a user
error: one line, exit 2) and an output folder this run created is removed again: nothing is left that would
make the corrected command a resume of "a run started from other inputs". The run holds its output folder's
lock throughout (one writer per folder: storage/locks.py `run_lock`), and a SIGINT or SIGTERM stops it
within seconds (tasks/core/stopping.py: no new call, the calls in flight cancelled, what finished kept).
`finish_stage` adds the run id, folder, cost (from the folder's ledger) and wall time to the summary, draws the
plots (OUT/plots/*.png and a markdown artifact), writes the dataset card, summary.json and the finished
stage.json with the counts, and creates the stage's table and markdown artifacts. A plot or card that cannot be
made is a warning (the data is already written).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel

from evolforge.config.settings import Settings
from evolforge.flows._fanout import retry_options, run_batches
from evolforge.flows._params import endpoint_label, model_endpoint
from evolforge.flows._report import attach_card, attach_plots
from evolforge.flows._runners import build_task_runner
from evolforge.storage.folder import BatchedSet, StageFolder, read_marker
from evolforge.storage.fs import AnyPath, exists, location, remove_tree, write_json_atomic
from evolforge.storage.ledger import read_ledger
from evolforge.storage.locks import run_lock, run_lock_created_folder
from evolforge.tasks.core.batch import close_gateways, gateway_for
from evolforge.tasks.core.checks import PreflightError
from evolforge.tasks.core.gateway import Gateway, GatewayError
from evolforge.tasks.core.reporting import cost_summary
from evolforge.tasks.core.stages import Stage, get
from evolforge.tasks.core.stopping import stop_on_signals


@dataclass
class Endpoint:
    """The model endpoint of a run (its base URL and label), the task runner and the run's gateway."""

    base_url: str
    label: str
    runner: Any
    gateway: Gateway


@dataclass
class StageRun:
    """One run of a stage over its output folder (what the preamble makes; see the module docstring)."""

    stage: Stage
    params: BaseModel
    settings: Settings
    folder: StageFolder
    run_id: str
    started: float
    logger: Any
    endpoint_: Endpoint | None = field(default=None, repr=False)
    runner_: Any = field(default=None, repr=False)
    preflight_failed: bool = False  # the endpoint's pre-flight failed (nothing was worked on)
    finished: bool = False  # finish_stage wrote the finished stage.json

    @property
    def settings_json(self) -> str:
        """The settings as every batch task receives them (a JSON string: a stable cache key)."""
        return self.settings.model_dump_json()

    def snapshot(self, batched: BatchedSet | AnyPath, build: Callable[[], Any], what: str = "records") -> None:
        """Write the stage's input snapshot once (`build()` writes it and returns how many records it took)."""
        path = batched.input if isinstance(batched, BatchedSet) else batched
        if not exists(path):
            n = build()
            if isinstance(n, int):
                self.logger.info("took %d %s", n, what)

    @contextlib.contextmanager
    def endpoint(self, roles: tuple[str, ...] = ("evolve", "answer", "judge"),
                 models: tuple[str, ...] = (), log: str = "") -> Iterator[Endpoint]:
        """The model endpoint (the configured one, or the embedded model while the block runs), the task runner
        and the run's gateway, after one minimal call per model of `roles` (plus `models`) answered."""
        try:
            with model_endpoint(self.settings, self.folder) as base_url, \
                    build_task_runner(self.settings.runner) as runner:
                gw = gateway_for(self.settings, base_url, self.run_id, self.folder.root)
                try:
                    gw.check_reachable(roles, tuple(sorted(models)))
                except GatewayError as e:  # a wrong endpoint, model or key: the user's to fix, before any work
                    self.preflight_failed = True
                    raise PreflightError(str(e)) from None
                self.logger.info("model endpoint %s%s", gw.describe(), f"; {log}" if log else "")
                self.logger.info(gw.concurrency_line())  # shown on the terminal (cli/terminal.py SHOWN)
                self.endpoint_ = Endpoint(base_url, endpoint_label(self.settings, base_url), runner, gw)
                self.runner_ = runner
                yield self.endpoint_
        finally:
            self.runner_ = None
            close_gateways(self.run_id)

    @contextlib.contextmanager
    def workers(self) -> Iterator[Any]:
        """The task runner of [runner] while the block runs, for a stage whose batches call no model."""
        with build_task_runner(self.settings.runner) as runner:
            self.runner_ = runner
            try:
                yield runner
            finally:
                self.runner_ = None

    def batches(self, task, batched: BatchedSet | int, *, what: str | None = None, name: str | None = None,
                checkpoints: AnyPath | None = None, progress_key: str | None = None,
                after: tuple[str, Any] | None = None, **extra: Any) -> list[dict]:
        """One Prefect task per batch of `batched` (or of `range(batched)`), on the task runner of
        `run.endpoint(...)` (each also gets base_url) or `run.workers()`; each gets out_dir, batch, settings_json
        and run_id, plus `extra`. Results in batch order; failed batches raise one error naming them
        (flows/_fanout.py). `after` = (step, fn): a step run after the batches that changes their accepted
        count (fn returns the final count; run_batches shows it)."""
        if self.runner_ is None:
            raise RuntimeError("run.batches runs inside `with run.endpoint(...)` or `with run.workers()`")
        count = batched.batch_count() if isinstance(batched, BatchedSet) else batched
        what = what or self.stage.name
        name = name or f"{what}-batch"
        common = dict(out_dir=str(self.folder.root), settings_json=self.settings_json, run_id=self.run_id, **extra)
        if self.endpoint_ is not None:
            common["base_url"] = self.endpoint_.base_url
        return run_batches(self.runner_, task, [(f"{name}-{b:05d}", dict(common, batch=b))
                                                         for b in range(count)],
                           what=what, checkpoints=checkpoints or self.folder.root,
                           progress_key=progress_key or f"{self.stage.name}-progress", after=after,
                           retry=retry_options(self.settings.runner.batch_retries,
                                               self.settings.runner.retry_delay_seconds))

    def elapsed(self) -> float:
        return round(time.time() - self.started, 2)


@contextlib.contextmanager
def stage_run(name: str, params: BaseModel) -> Iterator[StageRun]:
    """The preamble of a stage flow (see the module docstring)."""
    stage = get(name)
    logger = get_run_logger()
    settings = params.settings()  # a bad config fails here, before anything is read or created
    if stage.check is not None:
        stage.check(params, settings)  # the same check the CLI runs, before anything is created
    out = stage.out_of(params)
    # one writer per output folder, for the whole run (the CLI took it already: re-entrant; storage/locks.py);
    # SIGINT / SIGTERM stop the run within seconds, over Prefect's own SIGTERM handler (tasks/core/stopping.py)
    with run_lock(location(out)) if out is not None else contextlib.nullcontext(), stop_on_signals():
        fresh = out is not None and run_lock_created_folder(location(out))
        before = read_marker(location(out)) if out is not None else None
        folder = stage.folder_class()(out).ensure()
        folder.start_marker(stage.name)
        run = StageRun(stage, params, settings, folder, flow_run.id or f"local-{int(time.time())}", time.time(),
                       logger)
        try:
            yield run
        except PreflightError:
            if fresh and run.preflight_failed:  # made by this run, whose own pre-flight failed before any work
                remove_tree(location(out))
            raise
        if not run.finished and before and "finished_at" in before:
            write_json_atomic(folder.marker, before)  # a run that did nothing (a no-op retry): stage.json as it was


class KeptNothing(RuntimeError):
    """A stage that keeps nothing (its descriptor's `kept` count is 0): its flow run fails, after writing its
    summary and stage.json; `summary` is what it wrote (the CLI prints it, then one line, exit 1)."""

    def __init__(self, stage: str, kept: str, summary: dict):
        super().__init__(f"{stage} kept nothing ({kept} = 0)")
        self.summary = summary


def batch_totals(batches: list[dict]) -> dict:
    """The `batches` entry of a summary: total, skipped (finished by an earlier run) and replayed calls."""
    return {"total": len(batches), "skipped": sum(1 for b in batches if b.get("skipped")),
            "replayed_calls": sum(b.get("replayed_calls", 0) for b in batches)}


def finish_stage(run: StageRun, summary: dict, *, counts: dict | None = None,
                 card: tuple[dict[str, Any], dict] | None = None,
                 plots: tuple[str, Callable[[], dict[str, bytes]]] | None = None,
                 tables: dict[str, tuple[list[dict], str]] | None = None,
                 markdown: dict[str, tuple[str, str]] | None = None, cost: bool = True,
                 plots_key: str | None = None) -> dict:
    """The epilogue of a stage flow (see the module docstring); returns the summary it wrote.

    `counts`: the figures stage.json keeps; `card`: (tables by config name, card content); `plots`: (title,
    draw function), shown in the markdown artifact `plots_key` (default "<stage>-plots"); `tables` / `markdown`:
    artifact key -> (rows or markdown, description)."""
    folder, key = run.folder, run.stage.name
    head: dict[str, Any] = {"run_id": run.run_id, "out_dir": str(folder.root)}
    if run.endpoint_ is not None:
        head["endpoint"] = run.endpoint_.label
        summary.setdefault("gateway", run.endpoint_.gateway.stats.as_dict())
    summary = {**head, **summary}
    if cost:
        summary.setdefault("cost", cost_summary(read_ledger(folder.root)))
    summary.setdefault("wall_seconds", run.elapsed())
    if plots is not None:
        title, draw = plots
        summary["plots"] = attach_plots(folder, plots_key or f"{key}-plots", title, draw)
    if card is not None:
        card_tables, content = card
        summary["card"] = attach_card(folder.card_dir, card_tables, content)
    write_json_atomic(folder.summary, summary)
    folder.finish_marker(key, counts or {})
    run.finished = True
    for art_key, (rows, description) in (tables or {}).items():
        create_table_artifact(key=art_key, table=rows, description=description)
    for art_key, (text, description) in (markdown or {}).items():
        create_markdown_artifact(key=art_key, markdown=text, description=description)
    kept = run.stage.kept
    if kept and summary.get(kept) == 0 and flow_run.parent_flow_run_id is None:  # a pipeline's stage: it decides
        raise KeptNothing(key, kept, summary)
    return summary
