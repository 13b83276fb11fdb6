"""The modules stage (module-DAG reasoning, DeCoRL): its parameters (the Prefect UI form and the CLI flags), its
input check and its descriptor (tasks/core/stages.py). The flow: flows/modules.py; the files:
storage/module_sets.py; what it reports: tasks/modules/report.py (and the comparison, tasks/modules/compare.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from evolforge.config.settings import Settings
from evolforge.tasks.core.checks import check_endpoint, check_out_dir, check_rows
from evolforge.tasks.core.params import EndpointParams
from evolforge.tasks.core.stages import Deployment, Stage, Table, register

STAGE_FIELDS = ("max_items", "aggregation", "ablation", "compare")  # the [modules] keys the parameters set


class ModulesParams(EndpointParams):
    """Parameters of the modules flow ([modules] section of the config)."""

    input: str = Field(..., description="Questions: jsonl / csv / parquet with a `question` field (modules.question_field; "
                       "else `instruction`, so an evolve run's dataset/evolved.parquet works).")
    out: str = Field("runs/modules", description="Output folder (items in data/, prm_steps.parquet, summary.json); "
                     "running again over it resumes.")
    max_items: int | None = Field(None, ge=1, description="Use at most this many questions (default: modules.max_items).")
    aggregation: Literal["integrate", "concat"] | None = Field(None, description="Φ: the answer the judge scores (default: modules.aggregation).")
    ablation: Literal["mask", "recompute"] | None = Field(None, description="What the dependants of a removed module see (default: modules.ablation).")
    compare: bool = Field(False, description="Also answer every question single-shot and judge both answers with the "
                          "same judge: graph win rate overall and by difficulty (comparison.parquet, summary.json; "
                          "true here or modules.compare).")

    def stage_overrides(self) -> dict[str, Any]:
        """The [modules] keys this run sets: those given (compare only when true, so modules.compare = true in the
        config is kept)."""
        mods = {key: getattr(self, key) for key in STAGE_FIELDS if getattr(self, key)}
        return {"modules": mods} if mods else {}


def check(params: ModulesParams, settings: Settings) -> None:
    """The question file holds a usable question, the output folder can be written, the endpoint answers."""
    check_rows(params.input, settings.modules.question_field, "question file", fallback_field="instruction",
               field_fix="set modules.question_field to the column that holds the question")
    check_out_dir(params.out)
    check_endpoint(settings)


def models(settings: Settings) -> tuple[str, ...]:
    """The models the stage calls beyond the [models] roles: the judge, every module's, the single-shot one."""
    from evolforge.tasks.modules.batch import endpoint_models  # the module graph loads when asked

    return endpoint_models(settings)


STAGE = register(Stage(
    name="modules",
    help="module-DAG reasoning (DeCoRL): questions through a graph of modules, per-module contribution rewards "
         "and PRM rows (resumes over the same --out)",
    params=ModulesParams,
    flow="evolforge.flows.modules:modules_flow",
    section="modules",
    folder="evolforge.storage.module_sets:ModulesLayout",
    check=check,
    models=models,
    inputs=(Table("questions", "(--input)", ("question", "id", "difficulty", "generation"),
                  "questions (or an evolve run's instructions); difficulty / generation only for the comparison"),),
    outputs=(
        Table("items", "data/train-00000-of-00001.parquet",
              ("id", "question", "status", "reason", "final_answer", "answer", "judge_full", "modules",
               "module_calls", "judge_calls", "wall_s"),
              "every question: module outputs, final answer, per-module contributions and latencies"),
        Table("prm_steps", "prm_steps.parquet", ("prompt", "completions", "labels", "raw_scores", "scores", "id",
                                                      "method", "reasked"),
              "TRL stepwise supervision, one step per non-exit module"),
        Table("prm_rejected", "prm_rejected.parquet", ("id", "status", "reason", "prompt"),
              "questions without PRM rows, with the reason"),
        Table("comparison", "comparison.parquet",
              ("id", "difficulty", "single_answer", "graph_score", "single_score", "winner"),
              "`compare` only: graph vs single-shot answer, same judge"),
        Table("graph", "graph.md", (), "the Mermaid graph with mean latency and mean contribution per module"),
    ),
    deployment=Deployment("Module-DAG reasoning (DeCoRL) - modules along a dependency graph, per-module "
                          "contribution, PRM rows.", ("evolforge", "modules")),
))
