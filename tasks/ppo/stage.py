"""The PPO stage: its parameters (the Prefect UI form and the CLI flags), its input check and its descriptor
(tasks/core/stages.py). The flow: flows/ppo.py; the files: storage/ppo.py; its set-up (inputs, verl
configuration, Ray job): tasks/ppo/job.py; what it reports: tasks/ppo/report.py. It calls no model endpoint
(the reward models are local folders)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from evolforge.config.settings import PPOSettings, Settings
from evolforge.storage.fs import AnyPath, is_url, location
from evolforge.storage.inputs import input_exists
from evolforge.storage.layout import RunLayout
from evolforge.tasks.core.checks import InputError, check_folder, check_out_dir
from evolforge.tasks.core.extras import training
from evolforge.tasks.core.params import StageParams
from evolforge.tasks.core.stages import Deployment, Feed, Stage, Table, Trigger, register


class PPOParams(StageParams):
    """Parameters of the PPO flow (the form the Prefect UI shows)."""

    evolved: str = Field(description="An evolve run's dataset/evolved.parquet, or the evolve run's output folder.")
    tasks: str | None = Field(None, description="The synthesis stage's output folder, or its tasks table (a parquet file): kept math tasks (majority-verified answers) and code tasks (their tests) become prompts with a verified ground truth.")
    reward_dir: str = Field(description="The reward-model stage's output folder: IRM and PRM folders and health.json.")
    sft: str | None = Field(None, description="The policy PPO starts from: the SFT stage's output folder (its model/) or "
                            "any transformers model folder (default: the base policy, the embedded GGUF converted to "
                            "transformers).")
    out: str = Field("runs/ppo", description="Output folder of this stage.")
    irm_dir: str | None = Field(None, description="IRM folder (default: reward_dir / ppo.irm_subdir).")
    prm_dir: str | None = Field(None, description="PRM folder (default: reward_dir / ppo.prm_subdir).")
    ignore_reward_health: bool = Field(False, description="Run even though the reward stage's health checks failed "
                                       "(reward.health_policy = \"warn\" does the same; \"stop\" refuses).")
    ray_address: str | None = Field(None, description="Ray dashboard address (Jobs API) to submit the job to, e.g. http://head:8265 (default: ppo.ray_address, else $RAY_ADDRESS; none: print the command).")
    ray_job: Literal["verl_ppo", "grpo_smoke"] | None = Field(None, description="What the Ray job runs (default: ppo.ray_job): verl_ppo, the verl PPO trainer; grpo_smoke, the GRPO smoke run on the cluster.")
    ray_wait_seconds: float | None = Field(None, ge=0, description="Wait this long for the job to finish and fetch its log (default: ppo.ray_wait_seconds; 0: submit and return).")
    local_steps: int | None = Field(None, ge=0, description="Steps of the GRPO smoke run (default: ppo.local_steps; 0 skips it).")

    def stage_overrides(self) -> dict[str, Any]:
        ppo = {k: getattr(self, k) for k in ("ray_address", "ray_job", "ray_wait_seconds", "local_steps")
               if getattr(self, k) is not None}
        return {"ppo": ppo} if ppo else {}


def reward_models(params: PPOParams, cfg: PPOSettings) -> tuple[AnyPath, AnyPath]:
    """The IRM and PRM folders the parameters name (local paths or URLs, not downloaded)."""
    reward_dir = location(params.reward_dir)
    irm = location(params.irm_dir) if params.irm_dir else reward_dir / cfg.irm_subdir
    prm = location(params.prm_dir) if params.prm_dir else reward_dir / cfg.prm_subdir
    return irm, prm


def sft_model_dir(path: str) -> Path:
    """The transformers folder an --sft value names: an SFT stage's output folder's model/, or the folder itself."""
    from evolforge.storage.sft_sets import SFTFolder

    folder = SFTFolder(path)
    return folder.model if (Path(folder.model) / "config.json").exists() else Path(path)


def check(params: PPOParams, settings: Settings) -> None:
    """The job settings agree (ppo.ray_job and local_steps, ppo.ray_address and $RAY_ADDRESS), the evolved
    instructions, the reward folder and the synthesized tasks (when given) exist, the output folder is a local
    folder that can be written, and the reward stage is healthy (its trained models are there and health.json
    passes them, unless ignore_reward_health; remote reward models are checked by the flow's pre-flight once
    downloaded). Reads only: creates nothing."""
    cfg = settings.ppo
    if cfg.ray_job == "grpo_smoke" and cfg.local_steps == 0:
        raise InputError("ppo.ray_job = 'grpo_smoke' runs the GRPO smoke run: set ppo.local_steps > 0")
    from evolforge.tasks.ppo.ray_jobs import RayJobError, job_address

    try:
        job_address(cfg.ray_address)  # a configured address the environment contradicts
    except RayJobError as e:
        raise InputError(str(e)) from None
    path = params.evolved
    if not is_url(path) and not str(path).endswith(".parquet"):
        path = str(RunLayout(path).evolved)  # an evolve run's output folder
    if not input_exists(path):
        raise InputError(f"{path} not found: pass an evolve run's dataset/evolved.parquet or its output folder")
    check_folder(params.reward_dir, "reward folder", None, " (pass the train-reward stage's output folder)")
    if params.sft and not (sft_model_dir(params.sft) / "config.json").exists():
        raise InputError(f"--sft {params.sft}: no transformers model there (pass the SFT stage's output folder, whose "
                         "model/ it trains from, or a model folder with its config.json)")
    folder = str(params.tasks).rstrip("/")
    if params.tasks and not input_exists(params.tasks) and not any(  # the tasks table, or an older tasks.parquet
            input_exists(f"{folder}/{name}") for name in ("data/train-00000-of-00001.parquet", "tasks.parquet")):
        raise InputError(f"synthesis tasks not found: {params.tasks} (pass the synthesis output folder or its tasks "
                         "table, data/train-00000-of-00001.parquet)")
    if is_url(params.out):
        raise InputError(f"the PPO output folder must be a local (or shared, mounted) folder, not {params.out}: "
                         "verl and the local trainer write policies and data files there (choose another --out)")
    check_out_dir(params.out)
    irm, prm = reward_models(params, cfg)
    if not (is_url(irm) or is_url(prm)):
        from evolforge.tasks.ppo.preflight import RewardStageUnhealthy, ignores_health, preflight

        try:
            preflight(params.reward_dir, irm, prm, ignores_health(params, settings))
        except RewardStageUnhealthy as e:
            raise InputError(str(e)) from None


STAGE = register(Stage(
    name="ppo",
    help="PPO (RLEIF): verl prompt data, PPO config and Ray job, local GRPO smoke run",
    params=PPOParams,
    flow="evolforge.flows.ppo:ppo_flow",
    extras=training,
    section="ppo",
    folder="evolforge.storage.ppo:PPOLayout",
    check=check,
    inputs=(
        Table("evolved", "(--evolved)", ("id", "parent_id", "seed_id", "status", "instruction", "answer", "domain"),
              "evolved instructions: an evolve run's dataset/evolved.parquet"),
        Table("tasks", "(--tasks)", ("task_id", "seed_id", "status", "kind", "statement", "entry_point", "solution",
                                     "tests", "answer"),
              "kept synthesized tasks: verified ground truth (optional)"),
        Table("reward models", "(--reward-dir)/models/{irm,prm}, health.json", (),
              "the trained IRM and PRM and the reward stage's health report"),
    ),
    outputs=(
        Table("prompts", "data/train.parquet, data/test.parquet",
              ("data_source", "prompt", "ability", "reward_model", "extra_info"),
              "verl RL prompt data (train / held-out test, split by seed lineage)"),
        Table("verl", "verl/ppo_config.yaml, verl/overrides.txt, verl/submit.sh", (),
              "the verl PPO configuration and its `ray job submit` command"),
        Table("grpo_steps", "local/metrics.jsonl", ("step", "reward", "kl", "loss", "step_seconds"),
              "the GRPO smoke run's steps (with local/comparison.json and local/health.json)"),
    ),
    cli_flags={"ray_wait_seconds": "--ray-wait"},
    feeds={"evolved": Feed("evolve"), "tasks": Feed("synthesize"), "reward_dir": Feed("train-reward"),
           "sft": Feed("sft")},  # PPO starts from the SFT policy when SFT ran
    deployment=Deployment("PPO stage - verl data and config, Ray job submission, local GRPO smoke run with "
                          "r = rI * rA.", ("evolforge", "ppo"), trigger=Trigger("sft")),
))
