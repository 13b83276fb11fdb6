"""Evol-Instruct flow: seeds -> N rounds of evolution and elimination -> datasets + cost ledger.

Reads top to bottom like the stage it runs:
  settings -> output folder -> seeds into the round-1 pool -> model endpoint
  (embedded or configured) -> for each round: one Prefect task per batch,
  round table artifact, completion marker, next pool -> final datasets,
  ledger, summary.json and a markdown summary artifact.

Re-running over the same output folder resumes: finished rounds and batches are
skipped, a killed batch replays its journaled calls. Retrying a failed flow run
re-runs only the batches that failed (Prefect result cache).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import polars as pl
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.futures import as_completed
from prefect.runtime import flow_run
from pydantic import BaseModel, Field

from evolforge.config.settings import SAMPLE_SEEDS, Settings, load_settings
from evolforge.storage import rounds as round_store
from evolforge.storage.datasets import import_seeds
from evolforge.storage.fs import exists, read_parquet
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import LedgerTail, read_ledger
from evolforge.tasks.dedup_round import dedup_round_task, index_seeds_task
from evolforge.tasks.embedded_model import embedded_server
from evolforge.tasks.evolve_batch import close_gateways, evolve_batch_task, gateway_for
from evolforge.tasks.gateway import EndpointDown
from evolforge.tasks.reporting import CostTally, cost_summary, markdown_summary, round_rows
from evolforge.tasks.runners import build_task_runner


class EvolveParams(BaseModel):
    """Parameters of the evolve flow (the form the Prefect UI shows)."""

    seeds: str = Field(str(SAMPLE_SEEDS), description="Seed instructions: a jsonl, parquet or csv file.")
    out: str = Field("runs/evolve", description="Output folder or fsspec URL (s3://bucket/run); running again over it "
                     "resumes the run.")
    rounds: int | None = Field(None, ge=1, le=64, description="Evolution rounds (default: evol_instruct.rounds).")
    config: str | None = Field(None, description="TOML config file (default: config/default.toml).")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint; empty uses the embedded model.")
    model: str | None = Field(None, description="Model for every stage without its own model in the config.")
    overrides: dict[str, Any] = Field(default_factory=dict, description='Nested config overrides, e.g. {"evol_instruct": {"batch_size": 64}}.')
    dedup_index: str | None = Field(None, description="Persistent dedup index folder (default: OUT/dedup_index; "
                                    "the nightly flow shares one per dataset so every night is checked against all earlier ones).")


def resolve_settings(p: EvolveParams) -> Settings:
    overrides: dict[str, Any] = dict(p.overrides)
    if p.rounds is not None:
        overrides.setdefault("evol_instruct", {})["rounds"] = p.rounds
    if p.base_url is not None:
        overrides.setdefault("gateway", {})["base_url"] = p.base_url
    if p.model:
        overrides.setdefault("models", {})["default"] = p.model
    return load_settings(p.config, overrides)


@contextlib.contextmanager
def model_endpoint(settings: Settings, layout: RunLayout):
    """The configured endpoint, or the embedded model for the length of the run."""
    if settings.uses_embedded_model:
        with embedded_server(settings.embedded, layout.logs_dir) as url:
            yield url
    else:
        yield settings.gateway.base_url


def _run_round(layout: RunLayout, r: int, settings: Settings, base_url: str, run_id: str, runner, logger,
               index_dir: str | None) -> dict:
    n_batches = round_store.batch_count(layout, r)
    settings_json = settings.model_dump_json()
    progress = create_progress_artifact(progress=0.0, key=f"evolve-round-{r}-progress",
                                        description=f"Round {r}: batches done of {n_batches}")
    futures = [
        runner.submit(evolve_batch_task.with_options(task_run_name=f"evolve-round-{r}-batch-{b:05d}"),
                      parameters=dict(out_dir=str(layout.root), round_no=r, batch_index=b,
                                      settings_json=settings_json, base_url=base_url, run_id=run_id))
        for b in range(n_batches)
    ]
    failed: list[tuple[int, BaseException]] = []
    done = 0
    index = {id(f): b for b, f in enumerate(futures)}
    for fut in as_completed(futures):
        b = index[id(fut)]
        try:
            fut.result()
        except BaseException as e:  # noqa: BLE001 - collected, reported once below
            failed.append((b, e))
        done += 1
        update_progress_artifact(progress, progress=100.0 * done / n_batches)
    if failed:
        fatal = next((e for _, e in failed if isinstance(e, EndpointDown)), failed[0][1])
        batches = ", ".join(str(b) for b, _ in sorted(failed, key=lambda x: x[0])[:20])
        raise RuntimeError(
            f"round {r}: {len(failed)} of {n_batches} batches failed (batches {batches}). "
            f"First error: {fatal}. Finished batches are checkpointed in {layout.round_dir(r)}; "
            "run again over the same --out, or retry this flow run, to redo only the failed batches."
        ) from None
    if index_dir:
        removed = dedup_round_task.with_options(task_run_name=f"dedup-round-{r}")(
            str(layout.root), r, settings_json, index_dir)
        logger.info("round %d dedup removed %s", r, removed or "nothing")
    table = round_store.round_table(layout, r)
    round_store.mark_round_complete(layout, r, {"batches": n_batches, **{k: table[k] for k in ("attempts", "accepted")}})
    logger.info("round %d: %d attempts, %d accepted (survival %.1f%%), eliminated by rule %s",
                r, table["attempts"], table["accepted"], 100 * table["survival"], table["by_rule"])
    return table


@flow(name="evolve", log_prints=True)
def evolve_flow(params: EvolveParams = EvolveParams()) -> dict:
    logger = get_run_logger()
    settings = resolve_settings(params)
    cfg = settings.evol_instruct
    layout = RunLayout(params.out).ensure()
    run_id = flow_run.id or f"local-{int(time.time())}"
    t_start = time.time()

    if not exists(layout.round_input(1)):
        counts = import_seeds(params.seeds, layout.round_input(1), layout.rejects, batch_size=cfg.batch_size,
                              **settings.input.model_dump(include={"instruction_field", "id_field", "domain_field", "max_chars"}))
        logger.info("imported %d seeds (%d rejected -> %s)", counts["seeds"], counts["rejected"], layout.rejects)
    round_store.write_json_atomic(layout.run_info, {"seeds": params.seeds, "run_id": run_id,
                                                    "settings": settings.fingerprint()})

    tables: list[dict] = []
    try:
        summary = _evolve_rounds(params, settings, layout, run_id, tables, logger, t_start)
    finally:
        close_gateways(run_id)
    return summary


def _evolve_rounds(params: EvolveParams, settings: Settings, layout: RunLayout, run_id: str, tables: list,
                   logger, t_start: float) -> dict:
    cfg = settings.evol_instruct
    with model_endpoint(settings, layout) as base_url, build_task_runner(settings.runner) as runner:
        gw = gateway_for(settings, base_url, run_id, layout.root)
        gw.check_reachable()
        logger.info("model endpoint %s; models: %s", gw.describe(), settings.models.model_dump())
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
            cost = tally.add(ledger_tail.new_rows()).cost_of(round_store.round_lineage(layout, r).select("id").collect()["id"])
            table["cost_usd"] = cost
            create_table_artifact(key=f"evolve-round-{r}", table=round_rows(table, cost),
                                  description=f"Round {r}: survival by operation, eliminations by rule, tokens, cost")
            tables.append(table)

    rounds_done = list(range(1, cfg.rounds + 1))
    counts = round_store.write_final_datasets(layout, rounds_done, cfg.batch_size)
    ledger = read_ledger(layout.root)
    round_store.compact_ledger(layout, ledger)
    lineage = pl.from_arrow(read_parquet(layout.lineage, columns=["id", "round"]))
    summary = {
        "run_id": run_id,
        "out_dir": str(layout.root),
        "endpoint": base_url if not settings.uses_embedded_model else f"embedded {settings.embedded.alias}",
        "seeds": params.seeds,
        "rounds": [{k: t[k] for k in ("round", "attempts", "accepted", "eliminated", "errors", "survival",
                                      "by_rule", "by_operation", "calls", "prompt_tokens", "completion_tokens", "cost_usd")}
                   for t in tables],
        "counts": counts,
        "gateway": gw.stats.as_dict(),
        "cost": cost_summary(ledger, lineage),
        "wall_seconds": round(time.time() - t_start, 2),
        "datasets": {"evolved": str(layout.evolved), "lineage": str(layout.lineage),
                     "final_pool": str(layout.final_pool), "cost_ledger": str(layout.ledger_parquet),
                     "rejects": str(layout.rejects)},
    }
    round_store.write_json_atomic(layout.summary, summary)
    create_markdown_artifact(key="evolve-summary", markdown=markdown_summary(summary),
                             description="Evol-Instruct run summary: rounds, survival, cost per stage and task")
    logger.info("done: %d records in %s; cost %s; summary %s", counts["evolved"], layout.evolved,
                summary["cost"].get("cost_usd"), layout.summary)
    return summary


if __name__ == "__main__":
    evolve_flow()
