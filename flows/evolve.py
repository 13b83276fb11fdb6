"""Evol-Instruct flow: seeds -> N rounds of evolution and elimination -> datasets + cost ledger.

Reads top to bottom like the stage it runs:
  settings -> output folder -> seeds into the round-1 pool, while the model endpoint
  (embedded or configured) starts and is probed -> for each round: one Prefect task per batch,
  round table artifact, completion marker, next pool -> final datasets,
  ledger, summary.json and a markdown summary artifact.

Re-running over the same output folder resumes: finished rounds and batches are
skipped, a killed batch replays its journaled calls. Retrying a failed flow run
re-runs only the batches that failed (Prefect result cache). A run over an existing
folder must use the run's own seed file and result-changing settings (run.json, see
storage/run_record.py), else it stops naming the change (`force_settings` accepts it);
fewer rounds than the run finished keep every finished round in the datasets.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import polars as pl
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import Field

from evolforge.config.settings import SAMPLE_SEEDS, Settings
from evolforge.flows._fanout import BATCH_TASK_OPTIONS, run_batches
from evolforge.flows._params import EndpointParams, endpoint_label, model_endpoint
from evolforge.flows._report import attach_card, attach_plots
from evolforge.flows._runners import build_task_runner
from evolforge.storage import rounds as round_store
from evolforge.storage import run_record
from evolforge.storage.cards import write_sft_view
from evolforge.storage.datasets import import_seeds
from evolforge.storage.fs import exists, location, read_parquet
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import LedgerTail, read_ledger
from evolforge.tasks.core.batch import close_gateways, gateway_for, settings_from_json
from evolforge.tasks.core.checks import check_evolve
from evolforge.tasks.core.reporting import CostTally, cost_summary, markdown_summary, round_rows
from evolforge.tasks.evolve.batch import run_evolve_batch
from evolforge.tasks.report.card import evolve_card


class EvolveParams(EndpointParams):
    """Parameters of the evolve flow (the form the Prefect UI shows)."""

    seeds: str = Field(str(SAMPLE_SEEDS), description="Seed instructions: a jsonl, parquet or csv file.")
    out: str = Field("runs/evolve", description="Output folder or fsspec URL (s3://bucket/run); running again over it "
                     "resumes the run.")
    rounds: int | None = Field(None, ge=1, le=64, description="Evolution rounds (default: evol_instruct.rounds).")
    dedup_index: str | None = Field(None, description="Persistent dedup index folder (default: OUT/dedup_index; "
                                    "the nightly flow shares one per dataset so every night is checked against all earlier ones).")
    force_settings: bool = Field(False, description="Go on over an existing output folder although the seed file or "
                                 "settings that change results differ from the run's own (the change is recorded in "
                                 "run.json's history). Without it such a run stops and names the change.")

    def stage_overrides(self) -> dict[str, Any]:
        return {"evol_instruct": {"rounds": self.rounds}} if self.rounds is not None else {}


# ----------------------------------------------------------------- batch tasks (thin wrappers)

@task(name="evolve-batch", **BATCH_TASK_OPTIONS)
def evolve_batch_task(out_dir: str, round_no: int, batch_index: int, settings_json: str, base_url: str, run_id: str) -> dict:
    logger = get_run_logger()

    def progress(done: int, total: int) -> None:
        logger.info("round %d batch %d: %d/%d records evolved", round_no, batch_index, done, total)

    return run_evolve_batch(out_dir, round_no, batch_index, settings_from_json(settings_json), base_url, run_id,
                            progress)


@task(name="dedup-seeds")
def index_seeds_task(out_dir: str, settings_json: str, index_dir: str) -> dict:
    from evolforge.tasks.evolve.dedup_round import index_seeds  # the dedup stack loads when dedup runs

    return index_seeds(RunLayout(out_dir), settings_from_json(settings_json), location(index_dir))


@task(name="dedup-round")
def dedup_round_task(out_dir: str, round_no: int, settings_json: str, index_dir: str) -> dict:
    from evolforge.tasks.evolve.dedup_round import dedup_round

    return dedup_round(RunLayout(out_dir), round_no, settings_from_json(settings_json), location(index_dir))


def _evolve_plots(summary: dict) -> dict:
    from evolforge.tasks.report.plots import evolve_plots  # matplotlib loads at the end, not before the first call

    return evolve_plots(summary)


# ----------------------------------------------------------------- the flow

def _run_round(layout: RunLayout, r: int, settings: Settings, base_url: str, run_id: str, runner, logger,
               index_dir: str | None) -> dict:
    n_batches = round_store.batch_count(layout, r)
    settings_json = settings.model_dump_json()
    run_batches(runner, evolve_batch_task,
                [(f"evolve-round-{r}-batch-{b:05d}",
                  dict(out_dir=str(layout.root), round_no=r, batch_index=b, settings_json=settings_json,
                       base_url=base_url, run_id=run_id)) for b in range(n_batches)],
                what=f"round {r}", checkpoints=layout.round_dir(r), progress_key=f"evolve-round-{r}-progress")
    if index_dir:
        removed = dedup_round_task.with_options(task_run_name=f"dedup-round-{r}")(
            str(layout.root), r, settings_json, index_dir)
        logger.info("round %d dedup removed %s", r, removed or "nothing")
    table = round_store.round_table(layout, r)
    round_store.mark_round_complete(layout, r, {"batches": n_batches, **{k: table[k] for k in ("attempts", "accepted")}})
    logger.info("round %d: %d attempts, %d accepted (survival %.1f%%), eliminated by rule %s",
                r, table["attempts"], table["accepted"], 100 * table["survival"], table["by_rule"])
    return table


def _priced_round(layout: RunLayout, r: int, table: dict, tally: CostTally, ledger_tail: LedgerTail) -> dict:
    """The round's table with its cost (from the ledger rows new since the last round), as a table artifact."""
    cost = tally.add(ledger_tail.new_rows()).cost_of(round_store.round_lineage(layout, r).select("id").collect()["id"])
    table["cost_usd"] = cost
    create_table_artifact(key=f"evolve-round-{r}", table=round_rows(table, cost),
                          description=f"Round {r}: survival by operation, eliminations by rule, tokens, cost")
    return table


class _Background:
    """A call in a daemon thread; `result()` waits for it and raises what it raised."""

    def __init__(self, fn: Callable, *args: Any, **kw: Any):
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args, kw), name="evolforge-seeds", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable, args: tuple, kw: dict) -> None:
        try:
            self._result = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread by result()
            self._error = e

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def _finished_rounds_after(layout: RunLayout, last: int) -> list[int]:
    """Rounds after `last` that an earlier run over the folder finished (consecutive: each evolves the one before)."""
    found: list[int] = []
    r = last + 1
    while exists(layout.round_input(r)) and round_store.round_is_complete(layout, r):
        found.append(r)
        r += 1
    return found


@flow(name="evolve", log_prints=True)
def evolve_flow(params: EvolveParams = EvolveParams()) -> dict:
    logger = get_run_logger()
    settings = params.settings()
    check_evolve(params.seeds, params.out, settings)  # before anything is created (tasks/core/checks.py)
    cfg = settings.evol_instruct
    layout = RunLayout(params.out).ensure()
    run_id = flow_run.id or f"local-{int(time.time())}"
    t_start = time.time()

    # a run over an existing folder: the same seeds and result-changing settings, or a clear error (before any work)
    record = run_record.open_run(layout, params.seeds, settings, run_id, force=params.force_settings)
    for note in record.notes:
        logger.warning("%s", note)
    # The seeds are imported in a thread while the model endpoint starts and answers its probe (a first run's
    # start-up: the embedded model's start, or a remote endpoint's round trip, overlaps reading the seeds).
    pending = [_Background(import_seeds, params.seeds, layout.round_input(1), layout.rejects, batch_size=cfg.batch_size,
                           **settings.input.model_dump(include={"instruction_field", "id_field", "domain_field",
                                                                "max_chars"}))
               ] if not exists(layout.round_input(1)) else []

    def seeds_ready() -> None:
        """Wait for the seed import (its error is raised here), then record the run (once)."""
        if pending:
            counts = pending.pop().result()
            logger.info("imported %d seeds (%d rejected -> %s)", counts["seeds"], counts["rejected"], layout.rejects)
            record.save()  # appends this run to run.json's history; the first record is kept

    if not pending:
        record.save()
    tables: list[dict] = []
    try:
        summary = _evolve_rounds(params, settings, layout, run_id, tables, logger, t_start, seeds_ready)
    finally:
        try:
            seeds_ready()  # the endpoint failed first: the import still finishes and the run is recorded with it
        finally:
            close_gateways(run_id)
    return summary


def _evolve_rounds(params: EvolveParams, settings: Settings, layout: RunLayout, run_id: str, tables: list,
                   logger, t_start: float, seeds_ready: Callable[[], None]) -> dict:
    cfg = settings.evol_instruct
    with model_endpoint(settings, layout) as base_url, build_task_runner(settings.runner) as runner:
        gw = gateway_for(settings, base_url, run_id, layout.root)
        gw.check_reachable()
        logger.info("model endpoint %s; models: %s", gw.describe(), settings.models.model_dump())
        seeds_ready()  # the round-1 pool, imported meanwhile
        ledger_tail, tally = LedgerTail(layout.root), CostTally()  # prices each round from the new ledger rows only
        index_dir = None
        if cfg.dedup_each_round:
            index_dir = params.dedup_index or str(layout.dedup_index)
            index_seeds_task(str(layout.root), settings.model_dump_json(), index_dir)
        for r in range(1, cfg.rounds + 1):
            if not exists(layout.round_input(r)):
                round_store.build_next_pool(layout, r - 1, layout.round_input(r), cfg.batch_size)
            if round_store.round_is_complete(layout, r):
                table = round_store.round_table(layout, r)
                logger.info("round %d already complete: skipped", r)
            else:
                table = _run_round(layout, r, settings, base_url, run_id, runner, logger, index_dir)
            tables.append(_priced_round(layout, r, table, tally, ledger_tail))
        # fewer rounds than an earlier run over this folder finished: its later rounds stay in the datasets
        kept = _finished_rounds_after(layout, cfg.rounds)
        rounds_note = None
        if kept:
            rounds_note = (f"{cfg.rounds} rounds asked, but this run had finished rounds 1-{kept[-1]}: the datasets "
                           f"keep every finished round (rounds {', '.join(map(str, kept))} were not run again); "
                           "to get fewer rounds, use a new output folder")
            logger.warning("%s", rounds_note)
            for r in kept:
                tables.append(_priced_round(layout, r, round_store.round_table(layout, r), tally, ledger_tail))

    rounds_done = list(range(1, cfg.rounds + 1)) + kept
    counts = round_store.write_final_datasets(layout, rounds_done, cfg.batch_size)
    counts["sft"] = write_sft_view(layout.evolved, layout.sft)  # TRL SFTTrainer conversations
    ledger = read_ledger(layout.root)
    round_store.compact_ledger(layout, ledger)
    lineage = pl.from_arrow(read_parquet(layout.lineage, columns=["id", "round"]))
    summary = {
        "run_id": run_id,
        "out_dir": str(layout.root),
        "endpoint": endpoint_label(settings, base_url),
        "seeds": params.seeds,
        "rounds": [{k: t[k] for k in ("round", "attempts", "accepted", "eliminated", "errors", "survival",
                                      "by_rule", "by_operation", "calls", "prompt_tokens", "completion_tokens", "cost_usd")}
                   for t in tables],
        "rounds_requested": cfg.rounds,
        "rounds_in_datasets": rounds_done,
        **({"rounds_note": rounds_note} if rounds_note else {}),
        "counts": counts,
        "gateway": gw.stats.as_dict(),
        "cost": cost_summary(ledger, lineage),
        "wall_seconds": round(time.time() - t_start, 2),
        "datasets": {"sft": str(layout.sft), "evolved": str(layout.evolved), "lineage": str(layout.lineage),
                     "final_pool": str(layout.final_pool), "cost_ledger": str(layout.ledger_parquet),
                     "rejects": str(layout.rejects)},
    }
    summary["plots"] = attach_plots(layout, "evolve-plots", "Evol-Instruct plots", lambda: _evolve_plots(summary))
    summary["card"] = attach_card(layout.dataset_dir, {"sft": layout.sft, "evolved": layout.evolved,
                                                       "lineage": layout.lineage, "final_pool": layout.final_pool},
                                  evolve_card(summary, settings.fingerprint()))
    round_store.write_json_atomic(layout.summary, summary)
    markdown = markdown_summary(summary) + (f"\n\n**Note:** {rounds_note}" if rounds_note else "")
    create_markdown_artifact(key="evolve-summary", markdown=markdown,
                             description="Evol-Instruct run summary: rounds, survival, cost per stage and task")
    logger.info("done: %d records in %s; cost %s; summary %s", counts["evolved"], layout.evolved,
                summary["cost"].get("cost_usd"), layout.summary)
    return summary


if __name__ == "__main__":
    evolve_flow()
