"""PPO flow (RLEIF): evolved instructions + trained IRM / PRM -> prompt data, the verl PPO job, a GRPO smoke run.

Reads top to bottom like the stage it runs:
  settings and the fail-fast check (reward models present, reward stage healthy; tasks/ppo/stage.py) -> the
  reward models as local folders and the pre-flight's verdict -> verl prompt parquet (train / held-out test) ->
  the initial policy (the SFT stage's model with --sft, else the base policy: the GGUF converted to transformers)
  -> verl PPO configuration, validated and written, with its `ray job submit` command -> the Ray job (ppo.ray_job:
  the verl PPO trainer, or the GRPO smoke run) submitted through the Ray Jobs API when a cluster address is set ->
  the GRPO smoke run with the r = rI * rA reward and the in-training reward health watch (here, or on the cluster
  as that job; here its steps are live progress: the terminal's bar, the `ppo-progress-grpo` artifact), initial vs
  trained mean reward on the held-out prompts (a reward, not accuracy: `evolforge eval` measures pass@1) ->
  plots/*.png (grpo_training, held_out_reward; the `ppo-plots` artifact) -> the dataset card data/README.md (config `prompts`: train, test)
  -> summary.json, stage.json and the artifacts (`ppo-local-steps`, `ppo-training-health`, `ppo-summary`) -> the
  health policy and the job's outcome.

Two algorithms, named as they are: the verl job is PPO (critic, GAE; ppo.adv_estimator); the smoke run is GRPO
(TRL's GRPOTrainer, SmolLM2-135M on a CPU: a plumbing check, not training). Parameters and check:
tasks/ppo/stage.py; the set-up (inputs, prompt data, verl configuration, Ray job): tasks/ppo/job.py; what it
reports: tasks/ppo/report.py; the files: storage/ppo.py.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from evolforge.flows._report import progress_artifacts
from evolforge.flows._stage import finish_stage, stage_run
from evolforge.storage.ppo import PPOLayout
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.core.keys import secret_env_names
from evolforge.tasks.ppo import grpo_smoke, job, ray_jobs, report
from evolforge.tasks.ppo.stage import PPOParams

__all__ = ["PPOParams", "ppo_flow"]


@task(name="ppo-prompt-data")
def prompt_data_task(evolved: str, out_dir: str, settings_json: str, tasks: str | None = None,
                     irm: str | None = None) -> dict:
    settings = settings_from_json(settings_json)
    return job.prompt_data(evolved, PPOLayout(out_dir), settings.ppo, tasks, settings.eval,
                           Path(irm) if irm else None, settings.reward)


@task(name="ppo-initial-policy")
def initial_policy_task(params: PPOParams, out_dir: str, settings_json: str) -> dict:
    return job.initial_policy(params, settings_from_json(settings_json).ppo, PPOLayout(out_dir))


@task(name="ppo-local-grpo")
def local_grpo_task(spec: dict) -> dict:
    """The GRPO smoke run in this process (tasks/ppo/grpo_smoke.py; the same call a grpo_smoke Ray job makes)."""
    return grpo_smoke.run_smoke(spec)


@task(name="ppo-ray-job")
def ray_job_task(address: str, request: ray_jobs.JobRequest, out_dir: str, settings_json: str) -> dict:
    return job.submit(address, request, settings_from_json(settings_json).ppo, PPOLayout(out_dir))


@flow(name="ppo", log_prints=True)
def ppo_flow(params: PPOParams) -> dict:
    with stage_run("ppo", params) as run:
        lay, settings, log = run.folder, run.settings, run.logger
        cfg, evolved, irm, prm = job.resolve(params, settings.ppo)
        health = job.reward_health(params, irm, prm, log, settings.reward)
        counts = prompt_data_task(str(evolved), str(lay.root), run.settings_json, params.tasks, str(irm))
        log.info("prompt data: %d train, %d test -> %s; ground truth by source: %s", counts["train"], counts["test"],
                 lay.data_dir, counts["ground_truth_sources"])
        policy = initial_policy_task(params, str(lay.root), run.settings_json) if job.needs_local_policy(cfg) else None
        plan = job.plan(cfg, settings.reward, lay, irm, prm, policy, secret_env_names(settings))

        submitted = None
        if plan.address:
            submitted = ray_job_task(plan.address, plan.request, str(lay.root), run.settings_json)
            log.info("Ray job %s (%s) submitted to %s: %s", submitted["submission_id"], plan.kind, plan.address,
                     submitted["status"])
        else:
            print(f"no Ray cluster address (ppo.ray_address / RAY_ADDRESS); submit the {plan.kind} job with:\n"
                  f"{plan.command}")
        local = None
        if plan.smoke_on_cluster:
            local = job.job_result(lay, submitted)
        elif cfg.local_steps > 0:
            with progress_artifacts("ppo-progress", "GRPO"):  # the GRPO steps, then the held-out comparison, live
                local = {**local_grpo_task(plan.spec), "ran_on": "flow"}

        summary = report.summarize(params, evolved, health, counts, plan, submitted, local, policy, lay)
        summary = finish_stage(
            run, summary, cost=False, counts=report.counts(summary), tables=report.tables(local),
            plots=("GRPO smoke run plots", lambda: report.plots(local, lay)) if local else None,
            card=({"prompts": {"train": lay.train, "test": lay.test}},
                  report.card({"run_id": run.run_id, **summary}, settings.fingerprint(), str(irm), str(prm))),
            markdown={"ppo-summary": (report.markdown(summary), "PPO stage summary")})
        report.outcome(local, submitted, plan, settings.reward, lay, log)
        return summary
