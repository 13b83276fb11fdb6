"""The evolve stage and the nightly stage: their parameters (the Prefect UI forms and the CLI flags), their input
checks, what `evolforge run` prints, and their descriptors (tasks/core/stages.py).

    evolve   (CLI `evolforge run`, and `evolforge retry` = the same flow with retry=true; cli/run.py)
             flow: flows/evolve.py; folder: storage/layout.py RunLayout (rounds: storage/rounds.py; run.json:
             storage/run_record.py); what it reports: tasks/evolve/report.py
    nightly  (on the [schedule] cron) each night evolves the survivors of the last night one round further
             flow: flows/nightly.py; folder: the dataset, storage/nights.py NightlyFolder

Light to import (no Prefect, no polars): the CLI builds its commands and runs the checks with it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

from pydantic import Field

from evolforge.config.settings import SAMPLE_SEEDS, Settings, deep_merge
from evolforge.storage.folder import read_marker
from evolforge.storage.fs import exists, location, read_json
from evolforge.storage.layout import RunLayout
from evolforge.storage.nights import NightlyFolder
from evolforge.storage.run_record import open_run, recorded_overrides
from evolforge.tasks.core.checks import InputError, check_endpoint, check_out_dir, check_rows
from evolforge.tasks.core.extras import sentence_embeddings
from evolforge.tasks.core.params import EndpointParams, overrides_from
from evolforge.tasks.core.stages import Deployment, Stage, Table, register

# ----------------------------------------------------------------- evolve


class EvolveParams(EndpointParams):
    """Parameters of the evolve flow (the form the Prefect UI shows)."""

    seeds: str = Field(str(SAMPLE_SEEDS), description="Seed instructions: a jsonl, parquet or csv file.")
    out: str = Field("runs/evolve", description="Output folder or fsspec URL (s3://bucket/run): checkpoints, datasets, "
                     "ledger; running again over it resumes the run.")
    rounds: int | None = Field(None, ge=1, le=64, description="Evolution rounds (default: evol_instruct.rounds); fewer "
                               "than the run over the output folder finished keeps every finished round in the "
                               "datasets.")
    dedup_index: str | None = Field(None, description="Persistent dedup index folder (default: OUT/dedup_index; "
                                    "the nightly flow shares one per dataset so every night is checked against all "
                                    "earlier ones). Never taken from the output folder: a run over a folder that "
                                    "was deduplicated against another index (its dedup_run.json) stops, naming both.")
    force_settings: bool = Field(False, description="Go on over an existing output folder although the seed file or "
                                 "settings that change results differ from the run's own (the change is recorded in "
                                 "run.json's history). Without it such a run stops and names the change.")
    retry: bool = Field(False, description="Re-run only the failed or rejected batches of the run at `out`, with the "
                        "run's own seed file and result-changing settings (its run.json): the failed batches are "
                        "reopened, this run's entries for the reopened round are rolled back out of the dedup index "
                        "`dedup_index` names, then the run resumes (`evolforge retry`). The endpoint, key handling "
                        "and index come from your settings and parameters, never from the folder: where its record "
                        "names others, the retry stops and names both unless `base_url` / `dedup_index` are given.")

    # what `evolforge retry` takes from its flags (cli/run.py): the user's own config, endpoint and index
    retry_params: ClassVar[tuple[str, ...]] = ("config", "base_url", "dedup_index")

    def stage_overrides(self) -> dict[str, Any]:
        return {"evol_instruct": {"rounds": self.rounds}} if self.rounds is not None else {}


def index_of(params: EvolveParams) -> str:
    """The dedup index the parameters name: `dedup_index`, else OUT/dedup_index (never one from the folder)."""
    return str(location(params.dedup_index)) if params.dedup_index else str(RunLayout(params.out).dedup_index)


def run_to_retry(params: EvolveParams) -> EvolveParams:
    """The parameters a retry of the run at `params.out` resumes it with: the run's seed file, rounds and
    result-changing settings from its run.json (storage/run_record.py `recorded_overrides`), everything else from
    the user's config, environment and parameters. A folder is data: it never chooses the endpoint the key goes
    to, the key's transport or the dedup index a retry rolls back. Where its record names another endpoint than
    the user's settings (and `base_url` is not given), or another dedup index (dedup_run.json) than `dedup_index`
    / OUT/dedup_index, an InputError names both. A folder without run.json holds no run to retry."""
    layout = RunLayout(params.out)
    info = read_json(layout.run_info)
    if not info:
        raise InputError(f"no run in {layout.root} (run.json missing)")
    recorded = info.get("settings") or {}
    retry = EvolveParams(seeds=info["seeds"], out=params.out, rounds=(recorded.get("evol_instruct") or {}).get("rounds"),
                         config=params.config, base_url=params.base_url,
                         overrides=deep_merge(params.overrides, recorded_overrides(recorded)),
                         dedup_index=params.dedup_index, force_settings=params.force_settings, retry=True)
    if params.base_url is None:
        _same_endpoint(layout, (recorded.get("gateway") or {}).get("base_url") or "", retry.settings())
    _same_index(layout, retry)
    return retry


def _endpoint_name(url: str) -> str:
    return url if url else "the embedded model (gateway.base_url empty)"


def _same_endpoint(layout: RunLayout, recorded: str, settings: Settings) -> None:
    mine = settings.gateway.base_url
    if recorded.rstrip("/") != mine.rstrip("/"):
        raise InputError(
            f"{layout.run_info} records the endpoint {_endpoint_name(recorded)}, but your settings give "
            f"{_endpoint_name(mine)} (config, EVOLFORGE__GATEWAY__BASE_URL): a retry takes the endpoint its key goes "
            f"to from you, never from the folder; pass --base-url (flow parameter base_url) with the one to use")


def _same_index(layout: RunLayout, params: EvolveParams) -> None:
    recorded = layout.recorded_indexes()  # an index outside the folder by its old path or where it moved with it
    mine = index_of(params)
    if recorded and mine not in recorded:
        given = "--dedup-index" if params.dedup_index else "your settings (the default OUT/dedup_index)"
        raise InputError(
            f"{layout.dedup_run} records the dedup index {recorded[-1]}, but {given} name {mine}: a run over the "
            f"folder (a retry's rollback included) uses only the index you name, and the run's seeds and earlier "
            f"rounds are in the recorded one; pass --dedup-index {recorded[-1]} (flow parameter dedup_index) if that "
            "is the index you mean, or use a new output folder")


def check(params: EvolveParams, settings: Settings) -> None:
    """The seed file holds a usable instruction, the output folder can be written, the dedup index named is the
    one a run over the folder used (dedup_run.json), the endpoint answers and accepts the key. A retry: the folder holds a run (its run.json) whose recorded endpoint and dedup index are
    the ones the user names (`run_to_retry`), and the user's endpoint answers (its seeds are imported already)."""
    if params.retry:
        check_endpoint(run_to_retry(params).settings())
        return
    check_rows(params.seeds, settings.input.instruction_field, "seed file", settings.input.max_chars)
    check_out_dir(params.out)
    _same_index(RunLayout(params.out), params)  # a resumed run: the index it names is the one it used
    if exists(RunLayout(params.out).run_info):  # a resumed run: its own seeds and result-changing settings
        open_run(RunLayout(params.out), params.seeds, settings, "check", force=params.force_settings)  # reads only
    check_endpoint(settings)


def retry_lines(retried: dict) -> list[str]:
    """What a retry reopened and rolled back, as `evolforge retry` prints it (the flow logs the same lines)."""
    if not retried.get("batches"):
        return []
    r = retried["round"]
    lines = [f"round {r}: redoing batches {retried['batches']}; "
             f"later rounds superseded: {retried['superseded_rounds'] or '-'}"]
    lines += [f"dedup index {done['index']}: rolled back this run's rounds >= {r} "
              f"({done['records']} records in {done['segments']} segments)" for done in retried.get("index_rollback", [])]
    if retried.get("index_locked"):
        lines.append(f"evolforge: {retried['index_locked']}; the index is rolled back when round {r}'s dedup step runs")
    return lines


def present(summary: dict, params: EvolveParams) -> str:
    """What `evolforge run` (and `evolforge retry`) prints when the run is done: rounds, datasets, cost per stage."""
    from evolforge.tasks.evolve.elimination import rule_words
    from evolforge.tasks.evolve.report import survival_note

    retried = summary.get("retry") or {}
    if retried.get("nothing_to_retry"):
        return f"nothing to retry in {RunLayout(params.out).root}: every batch finished without errors"
    cost = summary["cost"].get("cost_usd")
    lines = [*retry_lines(retried), "", "== evolforge run complete =="]
    for r in summary["rounds"]:
        lines.append(f"round {r['round']}: {r['accepted']}/{r['attempts']} accepted (survival {r['survival']:.0%})")
        lines += [f"  {n:>4} eliminated: {rule_words(rule)}"
                  for rule, n in sorted(r["by_rule"].items(), key=lambda kv: (-kv[1], kv[0] or ""))]
        if r.get("errors"):
            lines.append(f"  {r['errors']:>4} ended in an error, not judged (`evolforge retry` redoes them)")
    if note := survival_note(summary):
        lines.append(f"note: {note}")
    if summary.get("rounds_note"):
        lines.append(f"note: {summary['rounds_note']}")
    lines += [
        f"records (seeds + accepted evolutions): {summary['counts']['evolved']} -> {summary['datasets']['evolved']}",
        f"lineage of every attempt:              {summary['datasets']['lineage']}",
        f"cost ledger ({summary['cost'].get('attempts', 0)} calls): {summary['datasets']['cost_ledger']}  "
        f"total: {'unknown (unpriced model)' if cost is None else f'${cost:.6f}'}"]
    for st in summary["cost"].get("by_stage", []):
        usd = "unpriced" if st["cost_usd"] is None or st["unpriced_calls"] else f"${st['cost_usd']:.6f}"
        lines.append(f"  stage {st['stage']:<10} {st['model']:<28} {st['calls']:>6} calls ({st['failed_attempts']} "
                     f"failed) {(st['prompt_tokens'] or 0) + (st['completion_tokens'] or 0):>9} tokens  {usd}")
    lines += [f"summary:                               {summary['out_dir'].rstrip('/')}/summary.json",
              f"per-stage costs: evolforge costs --out {params.out} --by stage"]
    return "\n".join(lines)


LINEAGE_COLUMNS = ("id", "parent_id", "seed_id", "round", "operation", "direction", "model", "status",
                   "elimination_rule", "instruction", "answer", "judge_verdict", "domain", "generation", "error",
                   "calls", "prompt_tokens", "completion_tokens", "duplicate_of", "dedup_similarity")

STAGE = register(Stage(
    name="evolve",
    command="run",
    help="evolve seeds through Evol-Instruct rounds (resumes over the same --out)",
    params=EvolveParams,
    flow="evolforge.flows.evolve:evolve_flow",
    extras=lambda params, settings: sentence_embeddings(settings.dedup),  # none with [dedup] embedding = false
    section="evol_instruct",
    folder=RunLayout,
    check=check,
    inputs=(Table("seeds", "(--seeds)", ("instruction", "id", "domain"),
                  "seed instructions (the column names: input.instruction_field, id_field, domain_field)"),),
    outputs=(
        Table("sft", "dataset/sft/train.parquet", ("id", "seed_id", "round", "domain", "messages"),
              "the evolved records with an answer as TRL SFTTrainer conversations (user / assistant)"),
        Table("evolved", "dataset/evolved.parquet", LINEAGE_COLUMNS, "seeds and every accepted evolution"),
        Table("lineage", "dataset/lineage.parquet", LINEAGE_COLUMNS,
              "every evolution attempt with its lineage, status and elimination rule"),
        Table("final_pool", "dataset/final_pool.parquet", ("id", "seed_id", "instruction", "domain", "generation"),
              "the pool after the last round (what a next round or night evolves)"),
        Table("cost_ledger", "cost_ledger.parquet", ("ts", "run_id", "stage", "task_id", "model", "attempt",
                                                     "outcome", "prompt_tokens", "completion_tokens", "cost_usd"),
              "one row per model call attempt (task_id: the evolved record)"),
        Table("rejects", "rejects.jsonl", ("source", "line", "reason", "row"),
              "seed rows that could not be used, with the reason"),
    ),
    cli_hidden=("retry",),  # `evolforge retry` (cli/run.py)
    fast_exit=True,
    present=present,
    deployment=Deployment("Evol-Instruct rounds over any seed dataset (resumes over the same output folder).",
                          ("evolforge", "evolve")),
))

# ----------------------------------------------------------------- nightly


class NightlyParams(EndpointParams):
    """Parameters of the nightly flow (defaults continue the same dataset)."""

    dataset: str | None = Field(None, description="Dataset folder to continue (default: schedule.dataset).")
    seeds: str = Field(str(SAMPLE_SEEDS), description="Seeds of the first night only; later nights continue the pool.")
    rounds_per_night: int | None = Field(None, ge=1, le=16, description="Default: schedule.rounds_per_night.")
    night: str | None = Field(None, description="Night label YYYY-MM-DD (default: today in schedule.timezone).")
    force_settings: bool = Field(False, description="Resume a night although its seeds (the last night's pool) or "
                                 "result-changing settings changed since it started (recorded in its run.json).")
    new: bool | None = Field(None, description="Start a new dataset in `dataset` (its first night evolves `seeds`). "
                             "The CLI refuses a --dataset that is not a nightly dataset yet unless --new is given (a "
                             "mistyped path would start a new chain); a flow run started otherwise (the schedule) "
                             "leaves it unset and starts a dataset where there is none.")

    def stage_overrides(self) -> dict[str, Any]:
        return overrides_from(self, "schedule", ("dataset", "rounds_per_night"))


def with_dataset(params: NightlyParams) -> NightlyParams:
    """The parameters with their dataset folder named: `dataset`, else the settings' schedule.dataset."""
    return params if params.dataset else params.model_copy(update={"dataset": params.settings().schedule.dataset})


def night_of(params: NightlyParams, settings: Settings) -> str:
    """The night's label: `night`, else today in schedule.timezone; not a date YYYY-MM-DD is an InputError."""
    night = params.night or dt.datetime.now(ZoneInfo(settings.schedule.timezone)).date().isoformat()
    try:
        dt.date.fromisoformat(night)
    except ValueError:
        raise InputError(f"night {night!r} is not a date YYYY-MM-DD") from None
    return night


def night_params(params: NightlyParams, settings: Settings, folder: NightlyFolder, night: str, previous: str | None,
                 seeds: str) -> EvolveParams:
    """The evolve run of a night: into its dated folder, against the dataset's one dedup index."""
    overrides = params.overrides
    if previous:  # a pool written by evolforge: its own column names, whatever the first seeds used
        overrides = deep_merge(overrides, {"input": {"instruction_field": "instruction", "id_field": "id",
                                                     "domain_field": "domain"}})
    return EvolveParams(
        seeds=seeds, out=str(folder.night_dir(night)), rounds=settings.schedule.rounds_per_night,
        config=params.config, base_url=params.base_url, model=params.model, overrides=overrides,
        dedup_index=str(folder.dedup_index),  # one index per dataset: every night checked against all earlier
        force_settings=params.force_settings,  # a resumed night is checked against its run.json like any run
    )


def check_nightly(params: NightlyParams, settings: Settings) -> None:
    """The night label is a date, the dataset folder can be written, the first night's seed file holds a usable
    instruction (later nights evolve the last night's pool), the endpoint answers and accepts the key."""
    night = night_of(params, settings)
    dataset = params.dataset or settings.schedule.dataset
    check_out_dir(dataset, "--dataset")
    if params.new is False and (read_marker(dataset) or {}).get("kind") != "nightly":
        raise InputError(f"--dataset {location(dataset)} is not a nightly dataset (no stage.json of the nightly "
                         "stage): check the path, or pass --new to start a new dataset there (its first night "
                         "evolves --seeds)")
    if NightlyFolder(dataset).last_finished(before=night) is None:
        check_rows(params.seeds, settings.input.instruction_field, "seed file", settings.input.max_chars)
    check_endpoint(settings)


NIGHTLY = register(Stage(
    name="nightly",
    help="evolve the survivors of the dataset's last night one round further, into a new dated folder",
    params=NightlyParams,
    flow="evolforge.flows.nightly:nightly_flow",
    extras=lambda params, settings: sentence_embeddings(settings.dedup),  # none with [dedup] embedding = false
    section="schedule",
    folder=NightlyFolder,
    check=check_nightly,
    out_field="dataset",
    cli_defaults={"new": False},  # the command refuses a folder that is not a dataset unless --new
    inputs=(Table("seeds", "(--seeds)", ("instruction", "id", "domain"), "the first night's seed instructions"),
            Table("last_pool", "nights/<last night>/dataset/final_pool.parquet",
                  ("id", "seed_id", "instruction", "domain", "generation"), "what every later night evolves")),
    outputs=(
        Table("nights", "nights.json", ("night", "seeds", "previous", "rounds", "total_rounds", "evolved",
                                        "cost_usd", "out"), "one entry per finished night"),
        Table("night", "nights/YYYY-MM-DD/", (), "each night's evolve output folder (the evolve stage's tables)"),
    ),
    deployment=Deployment("Each night evolves the survivors of the last night one round further, into a new dated "
                          "folder.", ("evolforge", "nightly"), schedule=True, concurrency_limit=1,
                          parameters={"params": {"dataset": "{{ $EVOLFORGE_DATASET }}"}}),
))
