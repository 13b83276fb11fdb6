"""The two reward stages: their parameters (the Prefect UI forms and the CLI flags), their input checks and
their descriptors (tasks/core/stages.py).

    reward-data    an evolve run's instructions -> IRM preference pairs, PRM step labels, data health
                   (flows/reward_data.py; folder: storage/reward_sets.RewardLayout)
    train-reward   the reward data -> health gate -> trained IRM and PRM, held-out metrics, model health
                   (flows/train_reward.py; folder: storage/reward_sets.RewardModelsFolder, by default the
                   reward-data folder itself, which keeps its reward-data stage.json)

What they report: tasks/reward/report.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from evolforge.config.settings import Settings
from evolforge.storage.inputs import input_exists
from evolforge.storage.layout import RunLayout
from evolforge.tasks.core.checks import InputError, check_endpoint, check_out_dir
from evolforge.tasks.core.extras import training
from evolforge.tasks.core.params import EndpointParams, StageParams
from evolforge.tasks.core.stages import Deployment, Feed, Stage, Table, Trigger, register


class RewardDataParams(EndpointParams):
    """Parameters of the reward-data flow ([reward] section of the config)."""

    evolve_out: str = Field(..., description="Output folder of a finished evolve run (its dataset/evolved.parquet is read).")
    out: str = Field("runs/reward", description="Output folder (IRM pairs in data/, prm_steps.parquet, health.json); "
                     "running again over it resumes.")
    method: Literal["judge", "decorl", "math_shepherd", "modules"] | None = Field(
        None, description="PRM step-label method (default: reward.step_label_method); modules: per-module "
        "contribution rewards of the module graph ([modules]).")
    max_instructions: int | None = Field(None, ge=1, description="Use at most this many instructions (default: reward.max_instructions).")
    kinds: list[Literal["irm", "prm"]] = Field(["irm", "prm"], description="Which data to make: IRM pairs (irm), PRM step labels (prm), or both (the default).")

    def stage_overrides(self) -> dict[str, Any]:
        reward: dict[str, Any] = {}
        if self.method:
            reward["step_label_method"] = self.method
        if self.max_instructions:
            reward["max_instructions"] = self.max_instructions
        return {"reward": reward} if reward else {}


class TrainRewardParams(StageParams):
    """Parameters of the reward-model training flow ([reward] section of the config)."""

    data: str = Field(..., description="Output folder of the reward-data flow (IRM pairs, prm_steps.parquet, health.json).")
    out: str | None = Field(None, description="Where models/, metrics.json and the model health go (default: the data folder).")
    models: list[Literal["irm", "prm"]] = Field(["irm", "prm"], description="Which reward models to train: irm, prm, or both (the default).")
    base_model: str | None = Field(None, description="Model folder to fine-tune (default: reward.base_model, else all-MiniLM-L6-v2).")
    override_health: bool = Field(False, description="Train even when the data health checks failed under policy 'stop'.")
    retrain: bool = Field(False, description="Train again even when a model is already in the output folder.")

    @property
    def out_dir(self) -> str:
        """The output folder: --out, else the data folder (the descriptor's `out_field`)."""
        return self.out or self.data

    def stage_overrides(self) -> dict[str, Any]:
        return {"reward": {"base_model": self.base_model}} if self.base_model else {}


def check_reward_data(params: RewardDataParams, settings: Settings) -> None:
    """The evolve run has its evolved dataset, the output folder can be written, the endpoint answers."""
    evolved = RunLayout(params.evolve_out).evolved
    if not input_exists(evolved):
        raise InputError(f"{evolved} not found: pass the output folder of a finished evolve run (evolforge run --out)")
    check_out_dir(params.out)
    check_endpoint(settings)


def check_train_reward(params: TrainRewardParams, settings: Settings) -> None:
    """The data folder holds the set of every model to train, the output folder can be written."""
    from evolforge.storage.reward_sets import RewardLayout  # here: it loads pyarrow, --help does not

    lay = RewardLayout(params.data)
    needed = {"irm": lay.irm_pairs, "prm": lay.prm_steps}
    for kind in params.models:
        if not input_exists(needed[kind]):
            raise InputError(f"{needed[kind]} not found: pass the output folder of the reward-data stage "
                             f"(evolforge reward-data --out), or leave {kind} out of --models")
    check_out_dir(params.out_dir)


# the columns of storage/reward_sets.py's IRM_PAIR_SCHEMA and PRM_COLUMNS, written out (that module loads pyarrow;
# tests/test_architecture.py checks they agree)
IRM_PAIR_COLUMNS = ("prompt", "chosen", "rejected", "margin", "instruction_id", "chosen_rank", "rejected_rank",
                    "group_size", "chosen_source", "rejected_source")
PRM_COLUMNS = ("prompt", "completions", "labels", "raw_scores", "scores", "id", "method", "reasked")

DATA_OUTPUTS = (
    Table("irm_pairs", "data/train-00000-of-00001.parquet", IRM_PAIR_COLUMNS,
          "IRM preference pairs (TRL RewardTrainer: prompt, chosen, rejected, margin)"),
    Table("irm_groups", "irm_groups.parquet", ("id", "status", "reason", "versions", "sources", "ranking",
                                               "judge_scores", "judge_model"), "every ranked group of versions"),
    Table("prm_steps", "prm_steps.parquet", PRM_COLUMNS,
          "PRM step labels (TRL stepwise supervision: prompt, completions, labels)"),
    Table("prm_rejected", "prm_rejected.parquet", ("id", "status", "reason", "prompt", "reasked"),
          "answers that could not be labelled, with the reason"),
    Table("health", "health.json", ("data", "model"), "data health checks against the RLEIF thresholds"),
)

REWARD_DATA = register(Stage(
    name="reward-data",
    help="reward-model data from an evolve run: IRM preference pairs, PRM step labels, health checks (resumes "
         "over the same --out)",
    params=RewardDataParams,
    flow="evolforge.flows.reward_data:reward_data_flow",
    section="reward",
    folder="evolforge.storage.reward_sets:RewardLayout",
    check=check_reward_data,
    models=lambda settings: tuple(settings.reward.variant_models),
    inputs=(Table("evolved", "(--evolve-out)/dataset/evolved.parquet",
                  ("id", "instruction", "answer", "domain", "reference_answer"),
                  "an evolve run's seeds and accepted evolutions, with their answers"),),
    outputs=DATA_OUTPUTS,
    feeds={"evolve_out": Feed("evolve")},
    deployment=Deployment("IRM preference pairs and PRM step labels from an evolve run, with health checks.",
                          ("evolforge", "reward"), trigger=Trigger("nightly")),  # the night's evolve run
))

TRAIN_REWARD = register(Stage(
    name="train-reward",
    help="train the IRM and PRM reward models on reward-data output (health gate, held-out metrics)",
    params=TrainRewardParams,
    flow="evolforge.flows.train_reward:train_reward_flow",
    extras=training,
    section="reward",
    folder="evolforge.storage.reward_sets:RewardModelsFolder",
    check=check_train_reward,
    out_field="out_dir",  # --out, else --data
    inputs=(
        Table("irm_pairs", "(--data)/data/train-00000-of-00001.parquet", ("prompt", "chosen", "rejected", "margin"),
              "the IRM preference pairs (for models irm)"),
        Table("prm_steps", "(--data)/prm_steps.parquet", ("prompt", "completions", "labels"),
              "the PRM step labels (for models prm)"),
        Table("health", "(--data)/health.json", ("data",), "the data health checks: the gate under policy 'stop'"),
    ),
    outputs=(
        Table("models", "models/irm, models/prm", (), "the trained reward models (reward_meta.json marks a "
              "complete one); scored by evolforge.tasks.reward.scoring"),
        Table("metrics", "metrics.json", ("models", "data", "base_model", "health"),
              "held-out pairwise / step accuracy and training time per model, health verdicts"),
        Table("health", "health.json", ("data", "model"), "the trained models' scores against the RLEIF thresholds"),
    ),
    feeds={"data": Feed("reward-data")},  # its models go into the data folder (--out, else --data)
    deployment=Deployment("Train the IRM (RewardTrainer) and the PRM (token classification at step separators).",
                          ("evolforge", "reward"), trigger=Trigger("reward-data")),
))
