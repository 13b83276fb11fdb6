"""The dedup stage: its parameters (the Prefect UI form and the CLI flags), its input check and its descriptor
(tasks/core/stages.py). The flow: flows/dedup.py; the files: storage/dedup_sets.py; what it reports:
tasks/dedup/report.py. It makes no model calls ([dedup] section of the config)."""

from __future__ import annotations

from pydantic import Field

from evolforge.config.settings import Settings
from evolforge.tasks.core.checks import check_out_dir, check_rows
from evolforge.tasks.core.extras import sentence_embeddings
from evolforge.tasks.core.params import StageParams
from evolforge.tasks.core.stages import Deployment, Stage, Table, register

DROPPED_COLUMNS = ("dedup_duplicate_of", "dedup_method", "dedup_similarity", "dedup_matched_id",
                   "dedup_matched_similarity", "dedup_detail")


class DedupParams(StageParams):
    """Parameters of the dedup flow ([dedup] section of the config)."""

    input: str = Field(..., description="A jsonl, parquet or csv file.")
    text_field: str = Field("instruction", description="Column holding the text to deduplicate.")
    id_field: str | None = Field(None, description="Column with record ids (default: row numbers).")
    out: str = Field(..., description="Output folder for kept / dropped / summary.json.")
    index: str | None = Field(None, description="Persistent index folder to check against and extend (optional).")


def check(params: DedupParams, settings: Settings) -> None:
    """The input holds a usable text in its text field and the output folder can be written."""
    check_rows(params.input, params.text_field, "input file",
               field_fix="pass --text-field with the column that holds the text")
    check_out_dir(params.out)


STAGE = register(Stage(
    name="dedup",
    help="dedup any jsonl / parquet / csv file: kept set + dropped set with reasons",
    params=DedupParams,
    flow="evolforge.flows.dedup:dedup_flow",
    extras=lambda params, settings: sentence_embeddings(settings.dedup),
    section="dedup",
    folder="evolforge.storage.dedup_sets:DedupOutLayout",
    check=check,
    inputs=(Table("input", "(--input)", ("<text_field>", "<id_field>"), "any jsonl / parquet / csv file"),
            Table("index", "(--index)/manifest.json", (), "a persistent dedup index to check against and extend")),
    outputs=(
        Table("kept", "kept.<fmt>", ("<every input column>",), "the kept rows, in input order, in the input's format"),
        Table("dropped", "dropped.<fmt>", ("<every input column>", *DROPPED_COLUMNS),
              "the dropped rows and why (exact | minhash | embedding, what they duplicate, how similar)"),
    ),
    deployment=Deployment("Exact, MinHash+LSH and embedding dedup of any jsonl / parquet / csv file.",
                          ("evolforge", "dedup")),
))
