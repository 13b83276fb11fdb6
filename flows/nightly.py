"""Nightly evolution: each night evolves the survivors of the last night one round further.

    DATASET/nights/2026-11-29/   a complete evolve run (its own checkpoints, ledger, summary)
    DATASET/nights/2026-11-30/   seeded from 2026-11-29's dataset/final_pool.parquet
    DATASET/nights.json          index: night, seeds used, rounds so far, counts, cost

A night never overwrites an earlier one; running the same night again resumes
it (or returns at once when it finished). The first night starts from `seeds`.
The `nightly` deployment in deployments/prefect.yaml runs this flow on a cron
schedule with `concurrency_limit: 1`, so two nights never overlap.
"""

from __future__ import annotations

import datetime as dt
import json
from zoneinfo import ZoneInfo

from prefect import flow, get_run_logger
from pydantic import Field

from evolforge.config.settings import SAMPLE_SEEDS, deep_merge
from evolforge.flows._params import EndpointParams
from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.storage.nights import NightIndex


class NightlyParams(EndpointParams):
    """Parameters of the nightly flow (defaults continue the same dataset)."""

    dataset: str | None = Field(None, description="Dataset folder to continue (default: schedule.dataset).")
    seeds: str = Field(str(SAMPLE_SEEDS), description="Seeds of the first night only; later nights continue the pool.")
    rounds_per_night: int | None = Field(None, ge=1, le=16, description="Default: schedule.rounds_per_night.")
    night: str | None = Field(None, description="Night label YYYY-MM-DD (default: today in schedule.timezone).")
    force_settings: bool = Field(False, description="Resume a night although its seeds (the last night's pool) or "
                                 "result-changing settings changed since it started (recorded in its run.json).")


@flow(name="nightly", log_prints=True)
def nightly_flow(params: NightlyParams = NightlyParams()) -> dict:
    logger = get_run_logger()
    settings = params.settings()
    sched = settings.schedule
    index = NightIndex(params.dataset or sched.dataset)
    night = params.night or dt.datetime.now(ZoneInfo(sched.timezone)).date().isoformat()
    dt.date.fromisoformat(night)  # a bad label fails here, before any work

    previous = index.last_finished(before=night)
    seeds = str(index.final_pool(previous)) if previous else params.seeds
    logger.info("night %s: evolving %s (%s)", night, seeds, f"survivors of {previous}" if previous else "first night")

    overrides = params.overrides
    if previous:  # a pool written by evolforge: its own column names, whatever the first seeds used
        overrides = deep_merge(overrides, {"input": {"instruction_field": "instruction", "id_field": "id",
                                                "domain_field": "domain"}})
    summary = evolve_flow(EvolveParams(
        seeds=seeds, out=str(index.night_dir(night)), rounds=params.rounds_per_night or sched.rounds_per_night,
        config=params.config, base_url=params.base_url, model=params.model, overrides=overrides,
        dedup_index=str(index.dedup_index),  # one index per dataset: every night checked against all earlier
        force_settings=params.force_settings,  # a resumed night is checked against its run.json like any run
    ))
    entry = index.record(night, seeds=seeds, previous=previous, summary=summary)
    logger.info("night %s done: %d rounds so far, %d records tonight", night, entry["total_rounds"],
                summary["counts"]["evolved"])
    return entry


if __name__ == "__main__":
    print(json.dumps(nightly_flow(), indent=2, default=str))
