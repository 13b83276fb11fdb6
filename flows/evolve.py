"""Evol-Instruct flow: seeds -> N rounds of evolution and elimination -> datasets + cost ledger.

Reads top to bottom like the stage it runs: settings, check, output folder and stage.json (flows/_stage.py) ->
run.json checked -> the seeds imported into the round-1 pool while the model endpoint (embedded or configured)
starts and is probed -> for each round: its pool, one Prefect task per batch, its dedup step, the round table
artifact and completion marker -> the final datasets, their SFT view, the compacted ledger, summary.json, the
dataset card, plots and the markdown summary artifact.

Re-running over the same output folder resumes: finished rounds and batches are skipped, a killed batch
replays its journaled calls. Retrying a failed flow run re-runs only the batches that failed (Prefect result
cache); `retry=true` (`evolforge retry`) re-runs only the failed or rejected batches of a finished run, with the
run's own seeds and result-changing settings, the user's endpoint and dedup index (tasks/evolve/stage.py
run_to_retry, tasks/evolve/resume.py reopen_for_retry). A run over an existing folder must use
the run's own seed file and result-changing settings (run.json, see storage/run_record.py), else it stops naming
the change (`force_settings` accepts it); fewer rounds than the run finished keep every finished round in the
datasets. Parameters and check: tasks/evolve/stage.py; files: storage/layout.py RunLayout, storage/rounds.py;
the figures: tasks/evolve/report.py.
"""

from __future__ import annotations

import polars as pl
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact

from evolforge.flows._fanout import BATCH_TASK_OPTIONS
from evolforge.flows._stage import StageRun, finish_stage, stage_run
from evolforge.storage import rounds as round_store
from evolforge.storage import run_record
from evolforge.storage.fs import exists, location, read_json, read_parquet
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import read_ledger
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.core.reporting import cost_summary
from evolforge.tasks.evolve import report
from evolforge.tasks.evolve.batch import run_evolve_batch
from evolforge.tasks.evolve.resume import SeedImport, finished_rounds_after, reopen_for_retry, rounds_note
from evolforge.tasks.evolve.stage import EvolveParams, index_of, run_to_retry

__all__ = ["EvolveParams", "evolve_flow"]


# ----------------------------------------------------------------- tasks (thin wrappers)

@task(name="evolve-batch", **BATCH_TASK_OPTIONS)
def evolve_batch_task(out_dir: str, round_no: int, batch: int, settings_json: str, base_url: str, run_id: str) -> dict:
    logger = get_run_logger()

    said = [0]  # the run's log gets a batch's halfway mark and its end (the live progress sees every tenth)

    def progress(done: int, total: int) -> None:
        mark = 2 if done >= total else 1 if 2 * done >= total else 0
        if mark > said[0]:
            said[0] = mark
            logger.info("round %d batch %d: %d/%d records evolved", round_no, batch, done, total)

    return run_evolve_batch(out_dir, round_no, batch, settings_from_json(settings_json), base_url, run_id, progress)


@task(name="dedup-seeds")
def index_seeds_task(out_dir: str, settings_json: str, index_dir: str) -> dict:
    from evolforge.tasks.evolve.dedup_round import index_seeds  # the dedup stack loads when dedup runs

    return index_seeds(RunLayout(out_dir), settings_from_json(settings_json), location(index_dir))


@task(name="dedup-round")
def dedup_round_task(out_dir: str, round_no: int, settings_json: str, index_dir: str) -> dict:
    from evolforge.tasks.evolve.dedup_round import dedup_round

    return dedup_round(RunLayout(out_dir), round_no, settings_from_json(settings_json), location(index_dir))


# ----------------------------------------------------------------- a round

def dedup_index(run: StageRun, given: str | None) -> str | None:
    """The dedup index of the run (`dedup_index`, else OUT/dedup_index) with the seeds in it; None: no dedup."""
    if not run.settings.evol_instruct.dedup_each_round:
        return None
    index_dir = given or str(run.folder.dedup_index)
    index_seeds_task(str(run.folder.root), run.settings_json, index_dir)
    return index_dir


def evolve_round(run: StageRun, r: int, index_dir: str | None) -> dict:
    """Round r: its pool, one task per batch, its dedup step, its completion marker; its table (storage/rounds.py
    round_table). A round an earlier run finished is skipped."""
    lay = run.folder
    if not exists(lay.round_input(r)):
        round_store.build_next_pool(lay, r - 1, lay.round_input(r), run.settings.evol_instruct.batch_size)
    if round_store.round_is_complete(lay, r):
        run.logger.info("round %d already complete: skipped", r)
        return round_store.round_table(lay, r)
    def dedup() -> int:  # the round's dedup step; the accepted count the round's table (and summary) gives
        removed = dedup_round_task.with_options(task_run_name=f"dedup-round-{r}")(
            str(lay.root), r, run.settings_json, index_dir)
        run.logger.info("round %d dedup removed %s", r, removed or "nothing")
        return round_store.round_table(lay, r)["accepted"]

    # with dedup, the live progress says "N accepted before dedup" until it ran, then the round's final count
    run.batches(evolve_batch_task, lay.round_set(r), what=f"round {r}", name=f"evolve-round-{r}-batch",
                checkpoints=lay.round_dir(r), progress_key=f"evolve-round-{r}-progress", round_no=r,
                after=("dedup", dedup) if index_dir else None)
    table = round_store.round_table(lay, r)
    round_store.mark_round_complete(lay, r, {"batches": lay.round_set(r).batch_count(),
                                             **{k: table[k] for k in ("attempts", "accepted")}})
    run.logger.info("round %d: %d attempts, %d accepted (survival %.1f%%); eliminated because the rewrite: %s",
                    r, table["attempts"], table["accepted"], 100 * table["survival"],
                    report.rules_in_words(table["by_rule"]))
    return table


def priced(table: dict, costs: report.RoundCosts) -> dict:
    """The round in the summary, with its cost (from the ledger rows new since the last round), as a table artifact."""
    r = table["round"]
    table["cost_usd"] = costs.of_round(r)
    create_table_artifact(key=f"evolve-round-{r}", table=report.round_rows(table, table["cost_usd"]),
                          description=f"Round {r}: survival by operation, eliminations by rule, tokens, cost")
    return report.round_summary(table)


def write_datasets(lay: RunLayout, rounds: list[int], batch_size: int) -> tuple[dict, pl.DataFrame]:
    """The final datasets of these rounds, their SFT view (TRL SFTTrainer conversations) and the compacted ledger
    (cost_ledger.parquet): (their counts, the ledger)."""
    counts = round_store.write_final_datasets(lay, rounds, batch_size)
    counts["sft"] = round_store.write_sft_view(lay.evolved, lay.sft)
    ledger = read_ledger(lay.root)
    round_store.compact_ledger(lay, ledger)
    return counts, ledger


# ----------------------------------------------------------------- the flow

@flow(name="evolve", log_prints=True)
def evolve_flow(params: EvolveParams = EvolveParams()) -> dict:
    params = run_to_retry(params) if params.retry else params  # a retry: the run's own seeds and settings
    with stage_run("evolve", params) as run:
        lay, settings, asked = run.folder, run.settings, run.settings.evol_instruct.rounds
        retried = reopen_for_retry(lay, settings, index_of(params), run.logger) if params.retry else None
        if retried and retried["nothing_to_retry"]:
            return {**read_json(lay.summary), "retry": retried}
        # the same seeds and result-changing settings as the run's own, or a clear error before any work
        record = run_record.open_run(lay, params.seeds, settings, run.run_id, force=params.force_settings,
                                     retry=params.retry)  # a retry: the folder's own pool, no seed file read
        seeds = SeedImport(record, params.seeds, settings, run.logger)  # while the endpoint starts
        try:
            with run.endpoint(log=f"models: {settings.models.model_dump()}"):
                seeds.wait()  # the round-1 pool
                index_dir, costs = dedup_index(run, params.dedup_index), report.RoundCosts(lay.root)
                tables = [priced(evolve_round(run, r, index_dir), costs) for r in range(1, asked + 1)]
                kept = finished_rounds_after(lay, asked)  # an earlier run's later rounds stay in the datasets
                tables += [priced(round_store.round_table(lay, r), costs) for r in kept]
        finally:
            seeds.wait()  # the endpoint failed first: the import still finishes and the run is recorded with it
        if note := rounds_note(asked, kept):
            run.logger.warning("%s", note)
        rounds_done = list(range(1, asked + 1)) + kept
        counts, ledger = write_datasets(lay, rounds_done, settings.evol_instruct.batch_size)
        summary = {
            "run_id": run.run_id, "out_dir": str(lay.root), "endpoint": run.endpoint_.label,
            "seeds": str(location(params.seeds)), "rounds": tables, "rounds_requested": asked,
            "rounds_in_datasets": rounds_done, **({"rounds_note": note} if note else {}), "counts": counts,
            "gateway": run.endpoint_.gateway.stats.as_dict(),
            "cost": cost_summary(ledger, pl.from_arrow(read_parquet(lay.lineage, columns=["id", "round"]))),
            "wall_seconds": run.elapsed(), "datasets": {k: str(v) for k, v in lay.datasets().items()},
            **({"retry": retried} if retried else {})}
        run.logger.info("done: %d records in %s; cost %s; summary %s", counts["evolved"], lay.evolved,
                        summary["cost"].get("cost_usd"), lay.summary)
        return finish_stage(
            run, summary, counts={"rounds": len(rounds_done), **counts},
            plots=("Evol-Instruct plots", lambda: report.plots(summary)),
            card=({k: getattr(lay, k) for k in ("sft", "evolved", "lineage", "final_pool")},
                  report.card(summary, settings.fingerprint())),
            markdown={"evolve-summary": (report.markdown(summary), "Evol-Instruct run summary: rounds, survival, "
                                         "cost per stage and task")})


if __name__ == "__main__":
    evolve_flow()
