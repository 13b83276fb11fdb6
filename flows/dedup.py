"""Dedup flow: any jsonl, parquet or csv with a text field -> kept set + dropped set with reasons.

    OUT/kept.<fmt>      the kept rows, every column, input order
    OUT/dropped.<fmt>   dropped rows + dedup_duplicate_of, dedup_method (exact | minhash | embedding),
                        dedup_similarity, dedup_matched_id, dedup_matched_similarity, dedup_detail
    OUT/summary.json    counts and per-method timings

With `index` set, records are also checked against (and then added to) a
persistent index, so a dataset can be deduplicated incrementally over time.
The same methods run inside every evolution round (see tasks/evolve/dedup_round.py).
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from pydantic import Field

from evolforge.flows._params import StageParams
from evolforge.tasks.core.checks import check_dedup
from evolforge.tasks.dedup.pipeline import dedup_file


class DedupParams(StageParams):
    """Parameters of the dedup flow."""

    input: str = Field(..., description="A jsonl, parquet or csv file.")
    text_field: str = Field("instruction", description="Column holding the text to deduplicate.")
    id_field: str | None = Field(None, description="Column with record ids (default: row numbers).")
    out: str = Field(..., description="Output folder for kept / dropped / summary.json.")
    index: str | None = Field(None, description="Persistent index folder to check against and extend (optional).")


@task(name="dedup-file")
def dedup_file_task(params_json: str) -> dict:
    p = DedupParams.model_validate_json(params_json)
    settings = p.settings()
    return dedup_file(p.input, p.text_field, p.out, settings.dedup, id_field=p.id_field, index_dir=p.index)


@flow(name="dedup", log_prints=True)
def dedup_flow(params: DedupParams) -> dict:
    logger = get_run_logger()
    params.settings()  # a bad config fails before anything is read
    check_dedup(params.input, params.text_field, params.out)  # before anything is created (tasks/core/checks.py)
    summary = dedup_file_task(params.model_dump_json())
    stats = summary["stats"]
    rows = [{"method": m, "removed": int(stats.get(f"dropped_{m}", 0))} for m in ("exact", "minhash", "embedding")]
    rows.append({"method": "kept", "removed": summary["kept"]})
    create_table_artifact(key="dedup-summary", table=rows, description=f"Dedup of {params.input}")
    logger.info("kept %d, dropped %d -> %s", summary["kept"], summary["dropped"], params.out)
    return summary
