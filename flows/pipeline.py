"""The whole pipeline as one flow, reading like the DAG:

    seeds -> evolve (Evol-Instruct rounds, elimination, dedup every round)
          -> synthesize (verified Python tasks and math problems, cost per task)   [optional]
          -> reward data (IRM preference pairs, PRM step labels, health checks)
          -> train reward models (IRM, PRM)
          -> SFT (the policy fine-tuned on the evolved rows and verified tasks)     [off by default]
          -> PPO (verl config + Ray job, local GRPO smoke run; from the SFT policy) [off by default]
          -> eval (the SFT policy, else the endpoint's model, on held-out lineages)  [off by default]

Each stage is also a flow and a deployment of its own; here each writes to its folder OUT/<stage>/ (the two
reward stages share OUT/reward/; storage/pipeline_sets.py) and resumes there. Then OUT/plots/ (every stage's
tokens and cost, and each stage's own plots; the `pipeline-plots` artifact), OUT/summary.json and OUT/stage.json.
The flow returns what each stage did (tasks/pipeline/report.py `done`). Parameters and check:
tasks/pipeline/stage.py.
"""

from __future__ import annotations

from prefect import flow

from evolforge.flows._stage import finish_stage, stage_run
from evolforge.flows.eval import EvalParams, eval_flow
from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.flows.ppo import PPOParams, ppo_flow
from evolforge.flows.reward_data import RewardDataParams, reward_data_flow
from evolforge.flows.sft import SFTParams, sft_flow
from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow
from evolforge.flows.train_reward import TrainRewardParams, train_reward_flow
from evolforge.tasks.pipeline import report
from evolforge.tasks.pipeline.stage import PipelineParams

__all__ = ["PipelineParams", "pipeline_flow"]


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: PipelineParams = PipelineParams()) -> dict:
    with stage_run("pipeline", params) as run:
        lay = run.folder  # a local folder or an fsspec URL (the PPO stage needs a local one)
        common = dict(config=params.config, overrides=params.overrides)
        endpoint = dict(base_url=params.base_url, model=params.model)
        ran: dict[str, dict] = {}  # stage -> its summary, in the order the stages ran

        ran["evolve"] = evolve_flow(EvolveParams(seeds=params.seeds, out=str(lay.stage("evolve")),
                                                 rounds=params.rounds, **endpoint, **common))
        evolved = ran["evolve"]["datasets"]["evolved"]
        tasks = None  # the synthesis stage's tasks table: verified ground truth for the PPO prompts
        if params.synthesize:
            ran["synthesize"] = synthesize_flow(SynthesizeParams(seeds=evolved, out=str(lay.stage("synthesize")),
                                                                 validator=params.validator, **endpoint, **common))
            tasks = ran["synthesize"]["datasets"]["tasks"]
        if params.reward or params.ppo:
            ran["reward-data"] = reward_data_flow(RewardDataParams(
                evolve_out=str(lay.stage("evolve")), out=str(lay.stage("reward-data")), **endpoint, **common))
            ran["train-reward"] = train_reward_flow(TrainRewardParams(data=str(lay.stage("reward-data")), **common))
        sft = None  # the SFT stage's folder: PPO starts from its model, eval evaluates it
        if params.sft:
            trained = lay.reward_models() if "train-reward" in ran else {}  # their IRM and PRM filters, if on
            ran["sft"] = sft_flow(SFTParams(evolve_out=str(lay.stage("evolve")), tasks=tasks,
                                            out=str(lay.stage("sft")), **trained, **common))
            sft = str(lay.stage("sft"))
        if params.ppo:
            ran["ppo"] = ppo_flow(PPOParams(evolved=evolved, tasks=tasks, reward_dir=str(lay.stage("train-reward")),
                                            sft=sft, out=str(lay.stage("ppo")),
                                            ignore_reward_health=params.ignore_reward_health, **common))
        if params.eval:
            policy = str(lay.stage("sft") / "model") if sft else None  # else the endpoint's model
            ran["eval"] = eval_flow(EvalParams(policy=policy, tasks=tasks, evolve_out=str(lay.stage("evolve")),
                                               out=str(lay.stage("eval")),
                                               training=[str(lay.stage("evolve")), *([sft] if sft else [])],
                                               **(endpoint if not sft else {}), **common))

        done, ledgers = report.done(ran), report.ledgers(lay, ran)
        finish_stage(run, report.summarize(lay, ran, done, ledgers), cost=False, counts={"stages": len(ran)},
                     plots=("Pipeline plots", lambda: report.plots(lay, ran, ledgers)))
        run.logger.info("pipeline done: %s", ", ".join(done))
        return done
