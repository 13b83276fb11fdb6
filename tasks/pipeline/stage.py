"""The pipeline: its parameters (the Prefect UI form, the stage switches its checkboxes, and the CLI flags), its
input check and its descriptor (tasks/core/stages.py). The flow: flows/pipeline.py; its stages and what each is
given: tasks/pipeline/plan.py; the files: storage/pipeline_sets.py; what it reports: tasks/pipeline/report.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from evolforge.config.settings import SAMPLE_SEEDS, Settings
from evolforge.storage.fs import is_url
from evolforge.tasks.core.checks import InputError, check_endpoint, check_out_dir, check_rows
from evolforge.tasks.core.extras import sentence_embeddings, training
from evolforge.tasks.core.params import EndpointParams
from evolforge.tasks.core.stages import Deployment, Stage, Table, register
from evolforge.tasks.pipeline.plan import stages_of

THROUGH = ("evolve", "synthesize", "reward", "sft", "ppo", "eval")  # the pipeline's stages in order (--through)


class PipelineParams(EndpointParams):
    """Parameters of the full pipeline (the stage switches are the UI's checkboxes)."""

    seeds: str = Field(str(SAMPLE_SEEDS), description="Seed instructions: a jsonl, parquet or csv file.")
    out: str = Field("runs/pipeline", description="Root output folder; each stage writes OUT/<stage>/.")
    rounds: int | None = Field(None, ge=1, le=64, description="Evolution rounds (default: evol_instruct.rounds).")
    synthesize: bool = Field(True, description="Synthesize verified tasks from the evolved instructions.")
    validator: str | None = Field(None, description="Model that repairs the synthesized tasks and runs their final "
                                  "check (models.validator; empty: the proposer, with a warning).")
    reward: bool = Field(True, description="Make reward-model data and train the IRM and PRM (the PPO stage needs "
                         "them: they run with it).")
    sft: bool = Field(False, description="Fine-tune the policy (the SFT stage) on the evolved rows and the verified "
                      "tasks; the PPO stage then starts from it.")
    ppo: bool = Field(False, description="Run the PPO stage (verl config / Ray job and the local GRPO smoke run).")
    eval: bool = Field(False, description="Evaluate (the eval stage) the last policy trained (the PPO stage's GRPO "
                       "policy, else the SFT policy), else the endpoint's model, on the held-out seed lineages' tasks "
                       "and the configured benchmarks.")
    ignore_reward_health: bool = Field(False, description="The PPO stage runs even though the trained reward models "
                                       "fail the reward stage's health checks (as reward.health_policy = \"warn\").")
    through: Literal["evolve", "synthesize", "reward", "sft", "ppo", "eval"] | None = Field(
        None, description="Run every stage up to and including this one and none after it (sets the stage switches: "
        "--through eval runs evolve, synthesize, reward, sft, ppo and eval); a switch given with it must agree.")

    @model_validator(mode="after")
    def _through(self) -> "PipelineParams":
        if self.through is None:
            return self
        order = [s for s in THROUGH if s != "evolve"]
        upto = THROUGH.index(self.through)
        for switch in order:
            on = THROUGH.index(switch) <= upto
            given = getattr(self, switch)
            if switch in self.model_fields_set and given != on:
                raise ValueError(f"--through {self.through} {'runs' if on else 'does not run'} the {switch} stage: "
                                 f"leave out --{'' if given else 'no-'}{switch}")
            setattr(self, switch, on)
        return self

    def stage_overrides(self) -> dict[str, Any]:
        own: dict[str, Any] = {"evol_instruct": {"rounds": self.rounds}} if self.rounds is not None else {}
        return {**own, "models": {"validator": self.validator}} if self.validator else own


def check(params: PipelineParams, settings: Settings) -> None:
    """The first stage's check (the seed file holds a usable instruction, the output folder can be written, the
    endpoint answers) and the settings checks of every stage it will run (Stage.settings_check: the synthesis
    budget's prices); with the SFT or PPO stage on, the output folder is a local one (verl and the trainers write
    there). The later stages check their inputs when they start, once the earlier stages made them."""
    check_rows(params.seeds, settings.input.instruction_field, "seed file", settings.input.max_chars)
    check_out_dir(params.out)
    for stage in stages_of(params):
        if stage.settings_check is not None:
            stage.settings_check(settings)
    local = [name for name, on in (("SFT", params.sft), ("PPO", params.ppo)) if on]
    if local and is_url(params.out):
        raise InputError(f"the {' and '.join(local)} stage needs a local (or shared, mounted) output folder, not "
                         f"{params.out}: choose another --out, or leave the {' and '.join(local)} stage off")
    check_endpoint(settings)


STAGE = register(Stage(
    name="pipeline",
    help="evolve -> synthesize -> reward data -> reward models [-> SFT] [-> PPO] [-> eval]",
    params=PipelineParams,
    flow="evolforge.flows.pipeline:pipeline_flow",
    extras=lambda params, settings: sentence_embeddings(settings.dedup) + training(),
    folder="evolforge.storage.pipeline_sets:PipelineLayout",
    check=check,
    inputs=(Table("seeds", "(--seeds)", ("instruction", "id", "domain"), "seed instructions"),),
    outputs=(
        Table("stage folders", "evolve/, synthesize/, reward/, sft/, ppo/, eval/", (),
              "each stage's own output folder (reward-data and train-reward share reward/)"),
        Table("plots", "plots/*.png", (), "tokens and cost of every stage, then each stage's own plots"),
    ),
    deployment=Deployment("The whole chain - evolve, synthesize, reward data, reward models (SFT, PPO and eval off by "
                          "default).",
                          ("evolforge", "pipeline"), concurrency_limit=1),
))
