"""One batch of one evolution round, described for the batch runtime (tasks/core/batch.py).

`run_evolve_batch` is the plain function (tests call it directly); the Prefect task that wraps it is in
flows/evolve.py. Resume, journal replay, the atomic part and the error classification are the runtime's:
a record whose request the endpoint rejects (HTTP 400/422) is kept with status `error`.
"""

from __future__ import annotations

from pathlib import Path

from evolforge.config.settings import EvolInstructSettings, Settings
from evolforge.storage import parts
from evolforge.storage.layout import RunLayout
from evolforge.storage.schemas import LINEAGE_SCHEMA
from evolforge.tasks.core.batch import BatchSpec, Progress, run_batch
from evolforge.tasks.core.gateway import Gateway, GatewayError
from evolforge.tasks.evolve.evolution import Evolution, choose_operation, evolution_id, evolve_record
from evolforge.tasks.evolve.prompts import DIRECTION


def _rejected(row: dict, round_no: int, model: str, settings: Settings, err: GatewayError) -> dict:
    """The endpoint rejected this record's request (400/422): kept, visibly, as an error."""
    op = choose_operation(settings.evol_instruct, row["id"], row.get("domain") or "general", round_no)
    return Evolution(
        id=evolution_id(row["id"], round_no, op), parent_id=row["id"], seed_id=row["seed_id"], round=round_no,
        operation=op, direction=DIRECTION[op], model=model, status="error",
        elimination_rule=None, instruction="", answer=None, judge_verdict=None,
        domain=row.get("domain") or "general", generation=int(row.get("generation") or 0) + 1, error=str(err)[:500],
    ).to_row()


def _counts(statuses: list[str]) -> dict:
    return {"accepted": statuses.count("accepted"), "eliminated": statuses.count("eliminated"),
            "errors": statuses.count("error")}


def equal_judge_resolved(settings: Settings) -> EvolInstructSettings:
    """The evolve settings with `equal_judge = 'auto'` made 'words' (embedded model) or 'model' (any other)."""
    cfg = settings.evol_instruct
    if cfg.equal_judge != "auto":
        return cfg
    return cfg.model_copy(update={"equal_judge": "words" if settings.uses_embedded_model else "model"})


def evolve_batch_spec(out_dir: str | Path, round_no: int, batch_index: int, settings: Settings) -> BatchSpec:
    layout = RunLayout(out_dir)
    cfg = equal_judge_resolved(settings)
    model = settings.models.for_stage("evolve")

    def work(row: dict, gw: Gateway, journal) -> dict:
        return evolve_record(row, round_no, gw, cfg, journal).to_row()

    return BatchSpec(
        name=f"r{round_no}b{batch_index}", part=layout.part(round_no, batch_index),
        journal=layout.journal(round_no, batch_index), schema=LINEAGE_SCHEMA,
        load_rows=lambda: parts.read_row_group(layout.round_input(round_no), batch_index).to_pylist(),
        work=work, on_rejected=lambda row, err: _rejected(row, round_no, model, settings, err),
        concurrency=cfg.concurrency, extra_stats=_counts)


def run_evolve_batch(
    out_dir: str | Path, round_no: int, batch_index: int, settings: Settings, base_url: str, run_id: str,
    progress: Progress | None = None,
) -> dict:
    return run_batch(evolve_batch_spec(out_dir, round_no, batch_index, settings), settings, base_url, run_id,
                     out_dir, progress)
