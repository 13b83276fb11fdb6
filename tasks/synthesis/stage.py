"""The synthesis stage: its parameters (the Prefect UI form and the CLI flags), its input check and its
descriptor (tasks/core/stages.py). The flow: flows/synthesize.py; the files: storage/synthesis_sets.py."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from evolforge.config.settings import Settings
from evolforge.tasks.core.checks import check_endpoint, check_out_dir, check_priced, check_rows
from evolforge.tasks.core.params import EndpointParams
from evolforge.tasks.core.stages import Deployment, Feed, Stage, Table, register


class SynthesizeParams(EndpointParams):
    """Parameters of the synthesis flow ([synthesis] and [sandbox] sections of the config)."""

    seeds: str = Field(..., description="Instructions to draw tasks from: an evolve run's dataset/evolved.parquet "
                       "or any jsonl / parquet / csv file.")
    out: str = Field("runs/synthesize", description="Output folder; running again over it resumes.")
    validator: str | None = Field(None, description="Model that repairs the tasks and runs their final check "
                                  "(models.validator; empty: the proposer, with a warning).")

    def stage_overrides(self) -> dict[str, Any]:
        return {"models": {"validator": self.validator}} if self.validator else {}


ROLES = ("synthesize", "validator", "solver")  # the [models] roles the stage calls


def check_budget(settings: Settings) -> None:
    """With a USD budget per task, the stage's models have a price (else every task is over the budget)."""
    check_priced(settings, ROLES, settings.synthesis.budget_usd_per_task, "synthesis.budget_usd_per_task")


def check(params: SynthesizeParams, settings: Settings) -> None:
    """The seed file holds a usable instruction, the output folder can be written, the stage's models have a price
    when a task has a USD budget, the endpoint answers."""
    check_rows(params.seeds, settings.input.instruction_field, "seed file", settings.input.max_chars)
    check_out_dir(params.out)
    check_budget(settings)
    check_endpoint(settings)


STAGE = register(Stage(
    name="synthesize",
    help="verified task synthesis from instructions (sandboxed tests, repair loop, solver check, cost per task)",
    params=SynthesizeParams,
    flow="evolforge.flows.synthesize:synthesize_flow",
    section="synthesis",
    folder="evolforge.storage.synthesis_sets:SynthLayout",
    check=check,
    settings_check=check_budget,
    inputs=(Table("seeds", "(--seeds)", ("instruction", "id", "domain"), "instructions to draw tasks from"),),
    outputs=(
        Table("tasks", "data/train-00000-of-00001.parquet",
              ("task_id", "seed_id", "kind", "statement", "entry_point", "solution", "tests", "answer", "difficulty",
               "pass_rate"), "kept tasks, verified in the sandbox"),
        Table("rejected", "rejected.parquet", ("task_id", "reject_reason", "attempts"), "rejected tasks and why"),
        Table("cost_per_task", "cost_per_task.parquet", ("task_id", "calls", "tokens", "usd", "wall_seconds",
                                                          "sandbox_seconds"), "what each task cost, by phase"),
    ),
    kept="kept",
    feeds={"seeds": Feed("evolve/dataset/evolved.parquet")},  # the evolved instructions
    deployment=Deployment("Verified task synthesis (sandboxed test-and-repair loop, solver check, cost per task).",
                          ("evolforge", "synthesize")),
))
