"""Nightly evolution: each night evolves the survivors of the last night one round further.

    DATASET/nights/2026-11-29/   a complete evolve run (its own checkpoints, ledger, summary)
    DATASET/nights/2026-11-30/   seeded from 2026-11-29's dataset/final_pool.parquet
    DATASET/nights.json          index: night, seeds used, rounds so far, counts, cost

A night never overwrites an earlier one; running the same night again resumes
it (or returns at once when it finished). The first night starts from `seeds`.
The `nightly` deployment (its descriptor in tasks/evolve/stage.py, rendered into
deployments/prefect.yaml) runs this flow on the [schedule] cron with a concurrency
limit of 1, so two nights never overlap. Parameters and check: tasks/evolve/stage.py;
the dataset folder: storage/nights.py.
"""

from __future__ import annotations

import json

from prefect import flow

from evolforge.flows._stage import finish_stage, stage_run
from evolforge.flows.evolve import evolve_flow
from evolforge.storage.chain import night_run_name as night_run_name_of
from evolforge.tasks.evolve.stage import NightlyParams, night_of, night_params, with_dataset

__all__ = ["NightlyParams", "nightly_flow"]


def night_run_name() -> str:
    """The run's name, night-YYYY-MM-DD: the chained reward-data deployment's trigger reads the night from it
    (storage/chain.py), since a scheduled run's parameters leave the night to the flow."""
    from prefect.runtime import flow_run

    raw = flow_run.parameters.get("params")
    try:
        params = raw if isinstance(raw, NightlyParams) else NightlyParams.model_validate(raw or {})
        return night_run_name_of(night_of(params, params.settings()))
    except Exception:  # a bad night or config: the flow itself reports it (one line); the run keeps a plain name
        return "nightly"


@flow(name="nightly", log_prints=True, flow_run_name=night_run_name)
def nightly_flow(params: NightlyParams = NightlyParams()) -> dict:
    with stage_run("nightly", with_dataset(params)) as run:  # the dataset: `dataset`, else schedule.dataset
        ds, night = run.folder, night_of(params, run.settings)  # the label was checked before any work
        previous = ds.last_finished(before=night)
        seeds = str(ds.final_pool(previous)) if previous else params.seeds
        run.logger.info("night %s: evolving %s (%s)", night, seeds,
                        f"survivors of {previous}" if previous else "first night")
        summary = evolve_flow(night_params(params, run.settings, ds, night, previous, seeds))
        entry = ds.record(night, seeds=seeds, previous=previous, summary=summary)
        run.logger.info("night %s done: %d rounds so far, %d records tonight", night, entry["total_rounds"],
                        summary["counts"]["evolved"])
        return finish_stage(run, entry, cost=False,  # each night's cost is in its own folder (and in the entry)
                            counts={"nights": len(ds.entries()), "total_rounds": entry["total_rounds"]})


if __name__ == "__main__":
    print(json.dumps(nightly_flow(), indent=2, default=str))
