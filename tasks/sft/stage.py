"""The SFT stage: its parameters (the Prefect UI form and the CLI flags), its input check and its descriptor
(tasks/core/stages.py). The flow: flows/sft.py; the rows: tasks/sft/data.py; the inputs and the ledger row:
tasks/sft/job.py; the trainer: tasks/sft/train.py; what it reports: tasks/sft/report.py; the files:
storage/sft_sets.py. It calls no model endpoint."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from evolforge.config.settings import Settings
from evolforge.storage.fs import is_url
from evolforge.storage.inputs import input_exists
from evolforge.storage.layout import RunLayout
from evolforge.tasks.core.checks import InputError, check_out_dir
from evolforge.tasks.core.extras import training
from evolforge.tasks.core.params import StageParams, overrides_from
from evolforge.tasks.core.stages import Deployment, Feed, Stage, Table, Trigger, register


class SFTParams(StageParams):
    """Parameters of the SFT flow ([sft] section of the config)."""

    evolve_out: str | None = Field(None, description="Output folder of a finished evolve run: its SFT view "
                                   "(dataset/sft/train.parquet) is trained on, its evolved.parquet fixes the held-out "
                                   "seed lineages.")
    tasks: str | None = Field(None, description="The synthesis stage's output folder (or its tasks table): the "
                              "verified solutions of its kept code tasks are trained on.")
    trajectories: str | None = Field(None, description="The trajectories stage's output folder (its sft.jsonl): "
                                     "every assistant turn of the successful recorded agent conversations is trained "
                                     "on (reward >= sft.trajectory_min_reward, at least --min-turns assistant turns).")
    min_turns: int | None = Field(None, ge=1, description="Fewest assistant turns a recorded conversation needs to be "
                                  "trained on (default: sft.trajectory_min_turns, 1).")
    irm_dir: str | None = Field(None, description="The reward stage's trained IRM folder (REWARD_OUT/models/irm): "
                                "with reward.select_by_irm on, its selection of the evolved pool decides which evolved "
                                "rows are trained on (the PPO stage's rule); unselected rows are skipped with the score.")
    prm_dir: str | None = Field(None, description="The reward stage's trained PRM folder (REWARD_OUT/models/prm): with "
                                "reward.prm_min_step > 0, an evolved answer is trained on only when each of its steps "
                                "scores at least that; the others are skipped with their lowest step and score.")
    out: str = Field("runs/sft", description="Output folder (data/, checkpoints/, model/); running again over it "
                     "resumes from the last checkpoint.")
    base_model: str | None = Field(None, description="transformers folder to fine-tune (default: sft.base_model, else "
                                   "the base policy converted from the embedded GGUF).")
    epochs: float | None = Field(None, gt=0, description="Passes over the rows (default: sft.epochs).")
    max_steps: int | None = Field(None, ge=0, description="Optimizer steps, overriding epochs when > 0 (default: "
                                  "sft.max_steps).")
    learning_rate: float | None = Field(None, gt=0, description="Peak learning rate (default: sft.learning_rate).")
    lora: bool | None = Field(None, description="Train a LoRA adapter (peft) and merge it (default: sft.lora).")
    retrain: bool = Field(False, description="Train again even when the output folder holds a finished model.")

    def stage_overrides(self) -> dict[str, Any]:
        own = overrides_from(self, "sft", ("base_model", "epochs", "max_steps", "learning_rate", "lora"))
        if self.min_turns is not None:
            own.setdefault("sft", {})["trajectory_min_turns"] = self.min_turns
        return own


def inputs(params: SFTParams) -> dict[str, str | None]:
    """The input tables the parameters name: the SFT view, the evolved table, the tasks table, sft.jsonl."""
    # here: storage's table modules load pyarrow, --help does not
    from evolforge.storage.synthesis_sets import SynthLayout
    from evolforge.storage.trajectory_sets import TrajectoryLayout

    run = RunLayout(params.evolve_out) if params.evolve_out else None
    tasks = params.tasks
    if tasks and not str(tasks).endswith(".parquet"):
        lay = SynthLayout(tasks)
        tasks = str(lay.tasks if input_exists(lay.tasks) or not input_exists(lay.legacy_tasks) else lay.legacy_tasks)
    return {"sft_view": str(run.sft) if run else None, "evolved": str(run.evolved) if run else None,
            "tasks": tasks, "trajectories": str(TrajectoryLayout(params.trajectories).sft) if params.trajectories else None}


def check(params: SFTParams, settings: Settings) -> None:
    """At least one input, each one there; the base model folder (when named) and peft (with LoRA) present; the
    output folder local and writable. Reads only: creates nothing."""
    if not (params.evolve_out or params.tasks or params.trajectories):
        raise InputError("nothing to train on: pass --evolve-out (an evolve run), --tasks (a synthesis run) and/or "
                         "--trajectories (a trajectories export)")
    from evolforge.storage.reward_sets import META_FILE  # here: it loads pyarrow, --help does not

    found = inputs(params)
    hints = {"sft_view": "pass the output folder of a finished evolve run (evolforge run --out)",
             "evolved": "pass the output folder of a finished evolve run (evolforge run --out)",
             "tasks": "pass the synthesis output folder or its tasks table (evolforge synthesize --out)",
             "trajectories": "pass the trajectories stage's output folder (evolforge trajectories --out)"}
    for name, path in found.items():
        if path and not input_exists(path):
            raise InputError(f"{path} not found: {hints[name]}")
    if params.irm_dir and not input_exists(f"{params.irm_dir}/{META_FILE}"):
        raise InputError(f"--irm-dir {params.irm_dir} is not a trained IRM folder (no {META_FILE}): pass the reward "
                         "stage's models/irm (evolforge train-reward --out)")
    if params.prm_dir and not input_exists(f"{params.prm_dir}/{META_FILE}"):
        raise InputError(f"--prm-dir {params.prm_dir} is not a trained PRM folder (no {META_FILE}): pass the reward "
                         "stage's models/prm (evolforge train-reward --out)")
    base = settings.sft.base_model
    if base and not (input_exists(f"{base}/config.json")):
        raise InputError(f"sft.base_model {base!r} is not a transformers model folder (no config.json)")
    if settings.sft.lora:
        try:
            import peft  # noqa: F401
        except ImportError:
            raise InputError("sft.lora needs peft: pip install 'evolforge[lora]' (or pip install peft)") from None
    if is_url(params.out):
        raise InputError(f"the SFT output folder must be a local (or mounted) folder, not {params.out}: the trainer "
                         "writes checkpoints and the model there (choose another --out)")
    check_out_dir(params.out)


STAGE = register(Stage(
    name="sft",
    help="supervised fine-tuning (TRL SFTTrainer) of the policy on step-form evolved answers, verified synthesis "
         "solutions and successful trajectories; resumes from its last checkpoint over the same --out",
    params=SFTParams,
    flow="evolforge.flows.sft:sft_flow",
    extras=training,
    section="sft",
    folder="evolforge.storage.sft_sets:SFTFolder",
    check=check,
    inputs=(
        Table("sft_view", "(--evolve-out)/dataset/sft/train.parquet", ("id", "seed_id", "domain", "messages"),
              "an evolve run's SFT view (user instruction, assistant answer); answers in step form are kept"),
        Table("evolved", "(--evolve-out)/dataset/evolved.parquet", ("id", "seed_id", "status", "instruction"),
              "the evolve run's records: with the tasks, they fix the held-out seed lineages (PPO's test split)"),
        Table("tasks", "(--tasks)", ("task_id", "seed_id", "kind", "statement", "entry_point", "solution", "tests"),
              "kept synthesized tasks: code solutions verified by their tests"),
        Table("trajectories", "(--trajectories)/sft.jsonl", ("messages", "tools", "reward", "conversation_id"),
              "recorded agent conversations; those with reward >= sft.trajectory_min_reward and at least "
              "sft.trajectory_min_turns assistant turns give one row per assistant turn"),
    ),
    outputs=(
        Table("train", "data/train.parquet", ("id", "source", "seed_id", "domain", "prompt", "completion", "tools"),
              "the rows trained on (TRL conversational prompt-completion)"),
        Table("skipped", "data/skipped.parquet", ("id", "source", "seed_id", "reason", "text"),
              "rows left out, with the reason"),
        Table("model", "model/", (), "the fine-tuned policy (transformers folder, model card, sft_meta.json)"),
        Table("train_log", "train_log.jsonl", ("step", "loss", "learning_rate", "grad_norm", "epoch"),
              "the logged optimizer steps"),
        Table("decontamination", "decontamination.json", ("table", "checked", "overlapping", "dropped"),
              "n-gram overlap of each input table with the evaluation sets"),
    ),
    feeds={"evolve_out": Feed("evolve"), "tasks": Feed("synthesize"),
           # the trained IRM: with reward.select_by_irm on, it selects the evolved rows
           "irm_dir": Feed("train-reward/models/irm"),
           # and the PRM: with reward.prm_min_step > 0, it filters the evolved answers' steps
           "prm_dir": Feed("train-reward/models/prm")},
    deployment=Deployment("Supervised fine-tuning of the policy (TRL SFTTrainer) on the forged step-form data.",
                          ("evolforge", "sft"), trigger=Trigger("train-reward")),
))
