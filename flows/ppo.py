"""PPO flow (RLEIF): evolved instructions + trained IRM / PRM -> prompt data, verl job, local GRPO smoke run.

Reads top to bottom like the stage it runs:
  settings -> pre-flight (reward models present, reward stage healthy) -> verl prompt parquet
  (train / held-out test) -> SFT policy as a transformers folder -> verl PPO configuration, validated,
  written, and submitted as a Ray job (or the exact command printed) -> local GRPO steps with the
  r = rI * rA reward, SFT vs trained on the held-out prompts -> summary.json and artifacts.

The local run is a smoke test on a 135M policy and a CPU; the verl job is the real training path.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from pydantic import Field

from evolforge.config.settings import PPOSettings
from evolforge.flows._params import StageParams
from evolforge.storage import ppo as store
from evolforge.storage.fs import local_copy, location, write_text_atomic
from evolforge.storage.layout import RunLayout
from evolforge.storage.reward_sets import META_FILE
from evolforge.tasks.core.reporting import markdown_table
from evolforge.tasks.ppo import local as ppo_local
from evolforge.tasks.ppo import verl as ppo_verl
from evolforge.tasks.ppo.data import build_prompt_rows
from evolforge.tasks.ppo.preflight import preflight
from evolforge.tasks.ppo.reward import load_reward


class PPOParams(StageParams):
    """Parameters of the PPO flow (the form the Prefect UI shows)."""

    evolved: str = Field(description="An evolve run's dataset/evolved.parquet, or the evolve run's output folder.")
    tasks: str | None = Field(None, description="The synthesis stage's tasks.parquet, or its output folder: kept math tasks (majority-verified answers) and code tasks (their tests) become prompts with a verified ground truth.")
    reward_dir: str = Field(description="The reward-model stage's output folder: IRM and PRM folders and health.json.")
    out: str = Field("runs/ppo", description="Output folder of this stage.")
    irm_dir: str | None = Field(None, description="IRM folder (default: reward_dir / ppo.irm_subdir).")
    prm_dir: str | None = Field(None, description="PRM folder (default: reward_dir / ppo.prm_subdir).")
    ignore_reward_health: bool = Field(False, description="Run even though the reward stage's health checks failed.")
    ray_address: str | None = Field(None, description="Ray dashboard address to submit the verl job to (default: ppo.ray_address; empty: print the command).")
    local_steps: int | None = Field(None, ge=0, description="GRPO steps of the local smoke run (default: ppo.local_steps; 0 skips it).")

    def stage_overrides(self) -> dict[str, Any]:
        ppo: dict[str, Any] = {}
        if self.ray_address is not None:
            ppo["ray_address"] = self.ray_address
        if self.local_steps is not None:
            ppo["local_steps"] = self.local_steps
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
def local_grpo_task(cfg_json: str, sft_dir: str, layout_root: str, irm: str, prm: str) -> dict:
    cfg = PPOSettings.model_validate_json(cfg_json)
    lay = store.PPOLayout(layout_root)
    ppo_local.use_threads(cfg.local_torch_threads)
    reward = load_reward(irm, prm, cfg.aggregation, cfg.answer_weight)
    run = ppo_local.grpo_train(
        Path(sft_dir), lay.train, reward, lay.local_dir, steps=cfg.local_steps, prompts_per_step=cfg.local_prompts_per_step,
        num_generations=cfg.local_num_generations, max_completion_length=cfg.local_max_completion_length,
        learning_rate=cfg.local_learning_rate, beta=cfg.kl_coef, clip_ratio=cfg.clip_ratio,
        temperature=cfg.local_temperature, max_prompts=cfg.local_train_prompts, seed=cfg.local_seed)
    store.write_jsonl(lay.metrics, run["steps"])
    held_out = store.read_prompt_rows(lay.test, cfg.local_eval_prompts)
    eval_split = "test"
    if not held_out:  # a single seed lineage cannot be split: compare on training prompts, and say so
        held_out, eval_split = store.read_prompt_rows(lay.train, cfg.local_eval_prompts), "train (no held-out prompts)"
    comparison = ppo_local.compare_policies(Path(sft_dir), Path(run["policy_dir"]), held_out, reward,
                                            cfg.local_eval_max_new_tokens)
    comparison["eval_split"] = eval_split
    store.write_json(lay.comparison, comparison)
    keys = ("n_prompts", "delta", "beats_sft_by_3_points", "identical_completions", "eval_split")
    return {**run, "comparison": {k: comparison[k] for k in keys}
            | {"sft_mean_reward": comparison["sft"]["mean_reward"],
               "trained_mean_reward": comparison["trained"]["mean_reward"]}}


def _verl_job(cfg: PPOSettings, lay: store.PPOLayout, policy: str, irm: Path, prm: Path, logger) -> dict:
    overrides = ppo_verl.verl_overrides(cfg, train_files=str(lay.train), val_files=str(lay.test), policy_path=policy,
                                        irm_dir=str(irm), prm_dir=str(prm))
    ppo_verl.validate_config(overrides)  # the documented schema; invalid settings stop the run here
    submission_id = f"evolforge-ppo-{int(time.time())}"
    cmd = ppo_verl.ray_submit_command(overrides, cfg.ray_address, submission_id, cfg.ray_working_dir)
    line = ppo_verl.shell_line(cmd)
    store.write_yaml(lay.verl_config, ppo_verl.nested(overrides),
                     header="# verl PPO configuration written by evolforge (keys of verl.trainer.main_ppo)\n")
    store.write_lines(lay.verl_overrides, ppo_verl.hydra_args(overrides))
    write_text_atomic(lay.submit_script, "#!/bin/sh\n# RAY_ADDRESS: the cluster's dashboard, e.g. "
                            "http://head:8265\nset -e\n" + line + "\n", permissions=0o755)
    job = {"address": cfg.ray_address, "submission_id": None, "command": line, "config": str(lay.verl_config)}
    if cfg.ray_address:
        job.update(ppo_verl.submit(cmd))
        store.write_json(lay.submission, job)
        logger.info("verl PPO job %s submitted to %s", job["submission_id"], cfg.ray_address)
    else:
        print(f"no ray_address configured; submit the verl PPO job with:\n{line}")
    return job


def _markdown(summary: dict) -> str:
    lines = ["# PPO stage", "", f"Prompts: {summary['data']['train']} train, {summary['data']['test']} held-out "
             f"({summary['data']['with_ground_truth']} with a ground truth; by source: "
             + ", ".join(f"{k} {v}" for k, v in summary["ground_truth_sources"].items()) + ").",
             f"Reward health: {'healthy' if summary['preflight']['healthy'] else 'UNHEALTHY (overridden)'}.",
             f"verl job: {summary['verl']['submission_id'] or 'not submitted'}; command in `{summary['paths']['submit']}`."]
    local = summary.get("local")
    if local:
        c = local["comparison"]
        lines += ["", "## Local GRPO smoke run (SmolLM2-135M, CPU: a plumbing check, not training)", ""]
        nan = float("nan")
        lines += markdown_table(["step", "reward", "kl", "loss", "seconds"],
                                [[s["step"], f"{s.get('reward', nan):.4f}", f"{s.get('kl', nan):.5f}",
                                  f"{s.get('loss', nan):.6f}", f"{s.get('step_seconds', nan):.1f}"]
                                 for s in local["steps"]])
        lines += ["", f"Mean reward on {c['n_prompts']} {c['eval_split']} prompts: SFT {c['sft_mean_reward']:.4f}, "
                  f"trained {c['trained_mean_reward']:.4f} (delta {c['delta']:+.4f}; RLEIF's bar is +0.03: "
                  f"{'met' if c['beats_sft_by_3_points'] else 'not met'})."]
    return "\n".join(lines)


@flow(name="ppo", log_prints=True)
def ppo_flow(params: PPOParams) -> dict:
    logger = get_run_logger()
    t0 = time.time()
    cfg, evolved, irm, prm = resolve(params)
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
    job = _verl_job(cfg, lay, cfg.policy_path or str(sft_dir), irm, prm, logger)

    local = None
    if cfg.local_steps > 0:
        local = local_grpo_task(cfg.model_dump_json(), sft_dir, str(lay.root), str(irm), str(prm))
        create_table_artifact(key="ppo-local-steps", table=local["steps"],
                              description="Local GRPO smoke run: reward, KL, loss and seconds per step")

    summary = {
        "run_id": flow_run.id or f"local-{int(t0)}", "evolved": str(evolved), "tasks": params.tasks,
        "preflight": health, "data": counts, "ground_truth_sources": counts["ground_truth_sources"],
        "verl": job, "local": local, "wall_seconds": round(time.time() - t0, 2),
        "paths": {"train": str(lay.train), "test": str(lay.test), "verl_config": str(lay.verl_config),
                  "submit": str(lay.submit_script), "sft_policy": sft_dir,
                  "policy": local["policy_dir"] if local else None, "metrics": str(lay.metrics) if local else None},
    }
    store.write_json(lay.summary, summary)
    create_markdown_artifact(key="ppo-summary", markdown=_markdown(summary), description="PPO stage summary")
    return summary
