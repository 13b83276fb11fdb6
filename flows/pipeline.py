"""The whole pipeline as one flow, reading like the DAG:

    seeds -> evolve (Evol-Instruct rounds, elimination, dedup every round)
          -> synthesize (verified Python tasks and math problems, cost per task)   [optional]
          -> reward data (IRM preference pairs, PRM step labels, health checks)
          -> train reward models (IRM, PRM)
          -> PPO (verl config + Ray job, local GRPO smoke run)                      [off by default]

Each stage is also a flow and a deployment of its own; here each writes to
OUT/<stage>/ and resumes there. A stage whose output is complete is skipped.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from pydantic import Field

from evolforge.config.settings import SAMPLE_SEEDS
from evolforge.flows._params import EndpointParams
from evolforge.flows._report import attach_plots
from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.flows.ppo import PPOParams, ppo_flow
from evolforge.flows.reward_data import RewardDataParams, reward_data_flow
from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow
from evolforge.flows.train_reward import TrainRewardParams, train_reward_flow
from evolforge.storage.fs import location, read_bytes
from evolforge.storage.layout import PipelineLayout
from evolforge.storage.ledger import read_ledger
from evolforge.tasks.core.reporting import cost_summary
from evolforge.tasks.report.plots import cost_and_tokens_by_stage


class PipelineParams(EndpointParams):
    """Parameters of the full pipeline (the stage switches are the UI's checkboxes)."""

    seeds: str = Field(str(SAMPLE_SEEDS), description="Seed instructions: a jsonl, parquet or csv file.")
    out: str = Field("runs/pipeline", description="Root output folder; each stage writes OUT/<stage>/.")
    rounds: int | None = Field(None, ge=1, le=64, description="Evolution rounds (default: evol_instruct.rounds).")
    synthesize: bool = Field(True, description="Synthesize verified tasks from the evolved instructions.")
    reward: bool = Field(True, description="Make reward-model data and train the IRM and PRM.")
    ppo: bool = Field(False, description="Run the PPO stage (verl config / Ray job and the local GRPO smoke run).")


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: PipelineParams = PipelineParams()) -> dict:
    logger = get_run_logger()
    lay = PipelineLayout(params.out)  # a local folder or an fsspec URL (the PPO stage needs a local one)
    common = dict(config=params.config, overrides=params.overrides)
    endpoint = dict(base_url=params.base_url, model=params.model)
    done: dict[str, Any] = {}
    tasks = None  # the synthesis stage's tasks table: verified ground truth for the PPO prompts

    plots: dict[str, dict] = {}  # stage -> its plot files, shown together on the pipeline run
    evolve = evolve_flow(EvolveParams(seeds=params.seeds, out=str(lay.evolve), rounds=params.rounds,
                                      **endpoint, **common))
    done["evolve"] = evolve["counts"]
    evolved = evolve["datasets"]["evolved"]
    plots["evolve"] = evolve.get("plots") or {}

    if params.synthesize:
        synth = synthesize_flow(SynthesizeParams(seeds=evolved, out=str(lay.synthesize), **endpoint, **common))
        done["synthesize"] = {k: synth[k] for k in ("proposed", "kept", "yield")}
        tasks = synth["datasets"]["tasks"]
        plots["synthesize"] = synth.get("plots") or {}

    if params.reward or params.ppo:
        data = reward_data_flow(RewardDataParams(evolve_out=str(lay.evolve), out=str(lay.reward),
                                                 **endpoint, **common))
        done["reward_data"] = {k: v for k, v in data.items() if k in ("irm_pairs", "prm_rows", "health")}
        trained = train_reward_flow(TrainRewardParams(data=str(lay.reward), **common))
        done["train_reward"] = {k: v for k, v in trained.items() if k in ("irm", "prm", "metrics")}
        plots["reward"] = {**(data.get("plots") or {}), **(trained.get("plots") or {})}

    if params.ppo:
        done["ppo"] = ppo_flow(PPOParams(evolved=evolved, tasks=tasks, reward_dir=str(lay.reward), out=str(lay.ppo),
                                         **common))
    attach_plots(lay, "pipeline-plots", "Pipeline plots", lambda: _pipeline_plots(lay, plots))  # OUT/plots/
    logger.info("pipeline done: %s", ", ".join(done))
    return done


def _pipeline_plots(lay: PipelineLayout, stage_plots: dict[str, dict]) -> dict[str, bytes]:
    """Tokens and cost of every model stage of the pipeline (all stages' ledgers), then each stage's own plots."""
    by_stage = []
    for folder in (lay.evolve, lay.synthesize, lay.reward):
        by_stage += cost_summary(read_ledger(folder)).get("by_stage", [])
    out = {"cost_tokens_by_stage": cost_and_tokens_by_stage(by_stage)}
    for stage, files in stage_plots.items():
        out.update({name if name.startswith(stage) else f"{stage}_{name}": read_bytes(location(path))
                    for name, path in files.items()
                    if name != "cost_tokens_by_stage"})
    return out
