"""The whole pipeline as one flow, reading like the DAG:

    seeds -> evolve (Evol-Instruct rounds, elimination, dedup every round)
          -> synthesize (verified Python tasks and math problems, cost per task)   [optional]
          -> reward data (IRM preference pairs, PRM step labels, health checks)
          -> train reward models (IRM, PRM)
          -> SFT (the policy fine-tuned on the evolved rows and verified tasks)     [off by default]
          -> PPO (verl config + Ray job, local GRPO smoke run; from the SFT policy) [off by default]
          -> eval (the last policy trained, else the endpoint's model, on held-out lineages)  [off by default]

Each stage is also a flow and a deployment of its own; here each writes to its folder OUT/<stage>/ (the two
reward stages share OUT/reward/; storage/pipeline_sets.py) and resumes there. What each stage is given comes from
the stage registry (each descriptor's feeds: which earlier stage's folder fills which parameter; the nightly chain
reads the same declarations), composed by tasks/pipeline/plan.py. Then OUT/plots/ (every stage's tokens and cost,
and each stage's own plots; the `pipeline-plots` artifact), OUT/summary.json and OUT/stage.json. The flow returns
what each stage did (tasks/pipeline/report.py `done`). Parameters, stages and check: tasks/pipeline/stage.py.
"""

from __future__ import annotations

from prefect import flow

from evolforge.flows._stage import finish_stage, stage_run
from evolforge.tasks.pipeline import plan, report
from evolforge.tasks.pipeline.stage import PipelineParams

__all__ = ["PipelineParams", "pipeline_flow"]


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: PipelineParams = PipelineParams()) -> dict:
    with stage_run("pipeline", params) as run:
        lay = run.folder  # a local folder or an fsspec URL (the SFT and PPO stages need a local one)
        ran: dict[str, dict] = {}  # stage -> its summary, in the order the stages ran
        for stage in plan.stages_of(params):  # evolve [-> synthesize] [-> reward] [-> sft] [-> ppo] [-> eval]
            ran[stage.name] = stage.load_flow()(plan.params_of(stage, params, lay, ran))

        done, ledgers = report.done(ran), report.ledgers(lay, ran)
        finish_stage(run, report.summarize(lay, ran, done, ledgers), cost=False, counts={"stages": len(ran)},
                     plots=("Pipeline plots", lambda: report.plots(lay, ran, ledgers)))
        run.logger.info("pipeline done: %s", ", ".join(done))
        return done
