"""PPO flow (RLEIF): evolved instructions + trained IRM / PRM -> prompt data, the verl PPO job, a GRPO smoke run.

Reads top to bottom like the stage it runs:
  settings -> pre-flight (reward models present, reward stage healthy) -> verl prompt parquet
  (train / held-out test) -> SFT policy as a transformers folder -> verl PPO configuration, validated and
  written, with its `ray job submit` command -> the Ray job (ppo.ray_job: the verl PPO trainer, or the GRPO
  smoke run) submitted through the Ray Jobs API when a cluster address is set -> the GRPO smoke run with the
  r = rI * rA reward and the in-training reward health watch (here, or on the cluster as that job; here its
  steps are live progress: the terminal's bar, the `ppo-progress-grpo` artifact), SFT vs trained on the
  held-out prompts -> plots/*.png (grpo_training, held_out_reward; the `ppo-plots` artifact) -> the dataset
  card data/README.md (config `prompts`: train, test) -> summary.json and artifacts -> the health policy and the job's outcome.

Two algorithms, named as they are: the verl job is PPO (critic, GAE; ppo.adv_estimator); the smoke run is GRPO
(TRL's GRPOTrainer, SmolLM2-135M on a CPU: a plumbing check, not training).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import Field

from evolforge.config.settings import PPOSettings, RewardSettings
from evolforge.flows._params import StageParams
from evolforge.flows._report import attach_card, attach_plots, progress_artifacts
from evolforge.storage import ppo as store
from evolforge.storage.fs import local_copy, location, write_text_atomic
from evolforge.storage.layout import OutputFolder, RunLayout
from evolforge.storage.reward_sets import META_FILE
from evolforge.tasks.core.checks import check_ppo
from evolforge.tasks.core.reporting import markdown_table
from evolforge.tasks.ppo import grpo_smoke, ray_jobs
from evolforge.tasks.ppo import local as ppo_local
from evolforge.tasks.ppo import verl as ppo_verl
from evolforge.tasks.ppo.data import build_prompt_rows
from evolforge.tasks.ppo.preflight import preflight
from evolforge.tasks.ppo.training_health import health_markdown
from evolforge.tasks.report.card import ppo_card
from evolforge.tasks.report.plots import ppo_plots
from evolforge.tasks.reward.health import enforce


class PPOParams(StageParams):
    """Parameters of the PPO flow (the form the Prefect UI shows)."""

    evolved: str = Field(description="An evolve run's dataset/evolved.parquet, or the evolve run's output folder.")
    tasks: str | None = Field(None, description="The synthesis stage's output folder, or its tasks table (a parquet file): kept math tasks (majority-verified answers) and code tasks (their tests) become prompts with a verified ground truth.")
    reward_dir: str = Field(description="The reward-model stage's output folder: IRM and PRM folders and health.json.")
    out: str = Field("runs/ppo", description="Output folder of this stage.")
    irm_dir: str | None = Field(None, description="IRM folder (default: reward_dir / ppo.irm_subdir).")
    prm_dir: str | None = Field(None, description="PRM folder (default: reward_dir / ppo.prm_subdir).")
    ignore_reward_health: bool = Field(False, description="Run even though the reward stage's health checks failed.")
    ray_address: str | None = Field(None, description="Ray dashboard address (Jobs API) to submit the job to, e.g. http://head:8265 (default: ppo.ray_address, else $RAY_ADDRESS; none: print the command).")
    ray_job: Literal["verl_ppo", "grpo_smoke"] | None = Field(None, description="What the Ray job runs (default: ppo.ray_job): verl_ppo, the verl PPO trainer; grpo_smoke, the GRPO smoke run on the cluster.")
    ray_wait_seconds: float | None = Field(None, ge=0, description="Wait this long for the job to finish and fetch its log (default: ppo.ray_wait_seconds; 0: submit and return).")
    local_steps: int | None = Field(None, ge=0, description="Steps of the GRPO smoke run (default: ppo.local_steps; 0 skips it).")

    def stage_overrides(self) -> dict[str, Any]:
        ppo = {k: getattr(self, k) for k in ("ray_address", "ray_job", "ray_wait_seconds", "local_steps")
               if getattr(self, k) is not None}
        return {"ppo": ppo} if ppo else {}


def resolve(p: PPOParams) -> tuple[PPOSettings, Any, Path, Path]:
    cfg = p.settings().ppo
    evolved = location(p.evolved)
    if evolved.is_dir():
        evolved = RunLayout(evolved).evolved
    reward_dir = location(p.reward_dir)
    irm = location(p.irm_dir) if p.irm_dir else reward_dir / cfg.irm_subdir
    prm = location(p.prm_dir) if p.prm_dir else reward_dir / cfg.prm_subdir
    # the trainers and the reward function load models from local folders: remote ones are downloaded (cached)
    return cfg, evolved, local_copy(irm, marker=META_FILE), local_copy(prm, marker=META_FILE)


@task(name="ppo-prompt-data")
def prompt_data_task(evolved: str, train: str, test: str, test_fraction: float, split_seed: int,
                     answer_in_steps: bool, tasks: str | None = None,
                     unverified_ground_truth: str = "exclude") -> dict:
    train_rows, test_rows, counts = build_prompt_rows(
        store.read_evolved(evolved), test_fraction, split_seed, answer_in_steps,
        tasks=store.read_tasks(tasks) if tasks else None, unverified_ground_truth=unverified_ground_truth)
    if not train_rows:
        raise ValueError(f"{evolved} yields no training prompts ({counts})")
    store.write_prompt_parquet(train_rows, Path(train))
    store.write_prompt_parquet(test_rows, Path(test))
    return counts


@task(name="ppo-sft-policy")
def sft_policy_task(policy_gguf: str, dest: str) -> str:
    return str(ppo_local.prepare_policy(ppo_local.find_policy_gguf(policy_gguf), Path(dest)))


@task(name="ppo-local-grpo")
def local_grpo_task(spec: dict) -> dict:
    """The GRPO smoke run in this process (tasks/ppo/grpo_smoke.py; the same call a grpo_smoke Ray job makes)."""
    return grpo_smoke.run_smoke(spec)


@task(name="ppo-ray-job")
def ray_job_task(address: str, request: ray_jobs.JobRequest, wait_seconds: float, log_path: str) -> dict:
    """Submit through the Ray Jobs API; when waiting, the job's log goes to ray_job.log (not into the summary)."""
    record = ray_jobs.run(address, request, wait_seconds)
    if "log" in record:
        write_text_atomic(Path(log_path), record.pop("log"))
        record["log_path"] = log_path
    return record


def _verl_config(cfg: PPOSettings, lay: store.PPOLayout, policy: str, irm: Path, prm: Path,
                 submission_id: str) -> dict:
    """The verl PPO configuration, validated and written, with the `ray job submit` line in verl/submit.sh."""
    overrides = ppo_verl.verl_overrides(cfg, train_files=str(lay.train), val_files=str(lay.test), policy_path=policy,
                                        irm_dir=str(irm), prm_dir=str(prm))
    ppo_verl.validate_config(overrides)  # the documented schema; invalid settings stop the run here
    checked_by = "evolforge's schema of verl's keys"
    if cfg.verl_python:  # verl's own Hydra compose and validate_config, as main_ppo runs them
        verdict = ppo_verl.check_with_verl(overrides, python=cfg.verl_python)
        if verdict["problems"]:
            raise ValueError(f"verl {verdict['verl']} refuses the PPO configuration: " + "; ".join(verdict["problems"]))
        checked_by = f"verl {verdict['verl']} (Hydra compose + validate_config)"
    line = ppo_verl.shell_line(ppo_verl.ray_submit_command(overrides, cfg.ray_address, submission_id,
                                                           cfg.ray_working_dir))
    store.write_yaml(lay.verl_config, ppo_verl.nested(overrides),
                     header="# verl PPO configuration written by evolforge (keys of verl.trainer.main_ppo)\n")
    store.write_lines(lay.verl_overrides, ppo_verl.hydra_args(overrides))
    write_text_atomic(lay.submit_script, "#!/bin/sh\n# RAY_ADDRESS: the cluster's dashboard, e.g. "
                            "http://head:8265\nset -e\n" + line + "\n", permissions=0o755)
    algorithm = "PPO (critic, GAE)" if cfg.adv_estimator == "gae" else f"{cfg.adv_estimator} (verl)"
    return {"algorithm": algorithm, "checked_by": checked_by, "command": line, "config": str(lay.verl_config),
            "entrypoint": ppo_verl.main_ppo_command(overrides)}


def _job_request(cfg: PPOSettings, submission_id: str, entrypoint: list[str], smoke: bool) -> ray_jobs.JobRequest:
    env = {"PYTHONUNBUFFERED": "1", **cfg.ray_env_vars}
    if smoke:
        env.setdefault("OMP_NUM_THREADS", str(cfg.local_torch_threads))
    return ray_jobs.JobRequest(entrypoint=entrypoint, submission_id=submission_id, working_dir=cfg.ray_working_dir,
                               env_vars=env, entrypoint_num_cpus=1 if smoke else None)


def _job_result(lay: store.PPOLayout, job: dict) -> dict | None:
    """The smoke run's result as the grpo_smoke job wrote it (None if this job did not write it: still running,
    or failed before the end)."""
    if not lay.local_run.exists():
        return None
    result = store.read_json(lay.local_run)
    return result if result.get("job_id") == job["submission_id"] else None


def _markdown(summary: dict) -> str:
    job = summary["ray_job"]
    lines = ["# PPO stage (verl PPO job, GRPO smoke run)", "",
             f"Prompts: {summary['data']['train']} train, {summary['data']['test']} held-out "
             f"({summary['data']['with_ground_truth']} with a ground truth; by source: "
             + ", ".join(f"{k} {v}" for k, v in summary["ground_truth_sources"].items()) + ").",
             f"Reward stage health: {'healthy' if summary['preflight']['healthy'] else 'UNHEALTHY (overridden)'}.",
             f"verl {summary['verl']['algorithm']}: configuration `{summary['verl']['config']}`, command in "
             f"`{summary['paths']['submit']}`.",
             (f"Ray job ({job['kind']}): {job['submission_id']} at {job['address']}, {job['status']}"
              + (f" ({job['message']})" if job.get("message") else "") + "." if job else
              f"Ray job: not submitted (no cluster address); command: `{summary['job_command']}`.")]
    local = summary.get("local_grpo")
    if local:
        c = local["comparison"]
        where = f"Ray job {local['job_id']} on {local['host']}" if local["ran_on"] == "ray_job" else "this machine"
        lines += ["", f"## GRPO smoke run (SmolLM2-135M, CPU, on {where}: a plumbing check, not training)", ""]
        nan = float("nan")
        lines += markdown_table(["step", "reward", "kl", "loss", "seconds"],
                                [[s["step"], f"{s.get('reward', nan):.4f}", f"{s.get('kl', nan):.5f}",
                                  f"{s.get('loss', nan):.6f}", f"{s.get('step_seconds', nan):.1f}"]
                                 for s in local["steps"]])
        if c:
            lines += ["", f"Mean reward on {c['n_prompts']} {c['eval_split']} prompts: SFT {c['sft_mean_reward']:.4f}, "
                      f"trained {c['trained_mean_reward']:.4f} (delta {c['delta']:+.4f}; RLEIF's bar is +0.03: "
                      f"{'met' if c['beats_sft_by_3_points'] else 'not met'})."]
        if summary["training_health"]:
            lines += ["", "## Reward health during training", ""] + health_markdown(summary["training_health"])
    return "\n".join(lines)


@flow(name="ppo", log_prints=True)
def ppo_flow(params: PPOParams) -> dict:
    logger = get_run_logger()
    t0 = time.time()
    check_ppo(params.evolved, params.reward_dir, params.out, params.tasks)  # before anything is created (tasks/core/checks.py)
    cfg, evolved, irm, prm = resolve(params)
    reward_cfg: RewardSettings = params.settings().reward
    address = ray_jobs.job_address(cfg.ray_address)
    smoke_on_cluster = bool(address) and cfg.ray_job == "grpo_smoke"
    if cfg.ray_job == "grpo_smoke" and cfg.local_steps == 0:
        raise ValueError("ppo.ray_job = 'grpo_smoke' runs the GRPO smoke run: set ppo.local_steps > 0")
    health = preflight(params.reward_dir, irm, prm, params.ignore_reward_health)
    if health["overridden"]:
        logger.warning("reward stage NOT healthy, running anyway (ignore_reward_health): %s", health["reason"])
    lay = store.PPOLayout(params.out).ensure()

    counts = prompt_data_task(str(evolved), str(lay.train), str(lay.test), cfg.test_fraction, cfg.split_seed,
                              cfg.answer_in_steps, params.tasks, cfg.unverified_ground_truth)
    logger.info("prompt data: %d train, %d test -> %s; ground truth by source: %s", counts["train"], counts["test"],
                lay.data_dir, counts["ground_truth_sources"])

    needs_sft = cfg.local_steps > 0 or not cfg.policy_path
    sft_dir = sft_policy_task(cfg.policy_gguf, str(lay.sft_policy)) if needs_sft else None
    submission_id = f"evolforge-{cfg.ray_job.replace('_', '-')}-{int(time.time())}-{uuid.uuid4().hex[:6]}"
    verl = _verl_config(cfg, lay, cfg.policy_path or str(sft_dir), irm, prm, submission_id)
    spec = grpo_smoke.job_spec(cfg, reward_cfg, sft_dir=sft_dir, root=lay.root, irm=irm, prm=prm,
                               job_id=submission_id) if cfg.local_steps > 0 else None
    if cfg.ray_job == "grpo_smoke":
        store.write_json(lay.grpo_job_spec, spec)
    entrypoint = grpo_smoke.entrypoint(lay.grpo_job_spec) if cfg.ray_job == "grpo_smoke" else verl["entrypoint"]
    request = _job_request(cfg, submission_id, entrypoint, smoke=cfg.ray_job == "grpo_smoke")
    job_command = ppo_verl.shell_line(ray_jobs.submit_command(address, request))

    job = None
    if address:
        job = {"kind": cfg.ray_job, **ray_job_task(address, request, cfg.ray_wait_seconds, str(lay.ray_job_log))}
        store.write_json(lay.submission, job)
        logger.info("Ray job %s (%s) submitted to %s: %s", job["submission_id"], cfg.ray_job, address, job["status"])
    else:
        print(f"no Ray cluster address (ppo.ray_address / RAY_ADDRESS); submit the {cfg.ray_job} job with:\n"
              f"{job_command}")

    local = None
    if smoke_on_cluster:
        local = _job_result(lay, job)
        if local:
            local["ran_on"] = "ray_job"
    elif cfg.local_steps > 0:
        with progress_artifacts("ppo-progress", "GRPO"):  # the GRPO steps, then the held-out comparison, live
            local = {**local_grpo_task(spec), "ran_on": "flow"}
    if local:
        create_table_artifact(key="ppo-local-steps", table=local["steps"],
                              description="GRPO smoke run: reward, KL, loss and seconds per step")
        if local.get("health"):
            create_table_artifact(key="ppo-training-health", table=local["health"]["checks"],
                                  description="Reward health during the GRPO steps: share of rA < 0.5, reward drift")

    summary = {
        "run_id": flow_run.id or f"local-{int(t0)}", "evolved": str(evolved), "tasks": params.tasks,
        "preflight": health, "data": counts, "ground_truth_sources": counts["ground_truth_sources"],
        "verl": {k: v for k, v in verl.items() if k != "entrypoint"}, "ray_job": job, "job_command": job_command,
        "local_grpo": {k: v for k, v in local.items() if k != "health"} if local else None,
        "training_health": local.get("health") if local else None,
        "wall_seconds": round(time.time() - t0, 2),
        "paths": {"train": str(lay.train), "test": str(lay.test), "verl_config": str(lay.verl_config),
                  "submit": str(lay.submit_script), "sft_policy": sft_dir,
                  "policy": local["policy_dir"] if local else None, "metrics": str(lay.metrics) if local else None,
                  "training_health": str(lay.local_health) if local and local.get("health") else None},
    }
    # the dataset card of data/: the prompts as one config with its train and test splits
    if local:  # reward, KL, loss and the health watch per GRPO step; SFT vs trained on held-out prompts
        summary["plots"] = attach_plots(OutputFolder(lay.root), "ppo-plots", "GRPO smoke run plots", lambda: ppo_plots(
            local["steps"], local.get("health"),
            store.read_json(lay.comparison) if local.get("comparison") and lay.comparison.exists() else None))
    summary["card"] = attach_card(lay.data_dir, {"prompts": {"train": lay.train, "test": lay.test}},
                                  ppo_card(summary, params.settings().fingerprint(), str(irm), str(prm)))
    store.write_json(lay.summary, summary)
    create_markdown_artifact(key="ppo-summary", markdown=_markdown(summary), description="PPO stage summary")
    if local and local.get("health"):
        warning = enforce(local["health"], reward_cfg.health_policy)  # raises under policy 'stop'
        if warning:
            logger.warning("%s (policy warn: the run went on)", warning)
    if job:
        ray_jobs.raise_for_status(job)
        if smoke_on_cluster and job["status"] == "SUCCEEDED" and local is None:
            raise ray_jobs.RayJobError(f"Ray job {job['submission_id']} succeeded but {lay.local_run} is not its "
                                       "result: does the cluster share this filesystem?")
    return summary
