"""The local GRPO smoke run in one call: in the flow's process, or as a Ray job on a cluster.

    job_spec(ppo, reward, ...)      what the run needs: the [ppo] and [reward] settings and paths (no credentials:
                                    neither section holds any), written to PPO_OUT/local/grpo_job.json
    run_smoke(spec)                 GRPO steps with the reward health watch, then (unless the watch stopped
                                    training) initial (SFT or base) vs trained on held-out prompts; writes local/metrics.jsonl,
                                    health.json, comparison.json and run.json (the result the flow reports)
    entrypoint(spec_path)           `python3 -m evolforge.tasks.ppo.grpo_smoke SPEC`: the Ray job's command

As a job it needs evolforge installed on the cluster and PPO_OUT, the initial policy and the reward models on a
filesystem the cluster shares (the paths in the spec). The job exits 1 (the Ray job FAILED) when the health
checks fail under reward.health_policy 'stop', after writing its figures; any other error fails it with a traceback.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from evolforge.config.settings import PPOSettings, RewardSettings
from evolforge.storage import ppo as store
from evolforge.tasks.core.health import RewardHealthError, enforce
from evolforge.tasks.core.progress import StepProgress, counting
from evolforge.tasks.ppo import local
from evolforge.tasks.ppo.reward import load_reward
from evolforge.tasks.ppo.training_health import TrainingHealth

MODULE = "evolforge.tasks.ppo.grpo_smoke"
COMPARISON_KEYS = ("n_prompts", "delta", "identical_completions", "eval_split", "initial_policy")


def job_spec(ppo: PPOSettings, reward: RewardSettings, *, policy: dict, root: str | Path, irm: str | Path,
             prm: str | Path, job_id: str) -> dict[str, Any]:
    """`policy`: {"path", "kind"} of the initial policy (kind "sft": the SFT stage's model; "base": the GGUF)."""
    return {"job_id": job_id, "ppo": ppo.model_dump(mode="json"), "reward": reward.model_dump(mode="json"),
            "policy_dir": str(policy["path"]), "policy_kind": policy["kind"], "root": str(root), "irm": str(irm),
            "prm": str(prm)}


def entrypoint(spec_path: str | Path, python: str = "python3") -> list[str]:
    return [python, "-m", MODULE, str(spec_path)]


def run_smoke(spec: dict[str, Any]) -> dict[str, Any]:
    cfg = PPOSettings.model_validate(spec["ppo"])
    reward_cfg = RewardSettings.model_validate(spec["reward"])
    lay = store.PPOLayout(spec["root"])
    lay.local_dir.mkdir(parents=True, exist_ok=True)
    local.use_threads(cfg.local_torch_threads)
    reward = load_reward(spec["irm"], spec["prm"], cfg.aggregation, cfg.answer_weight)
    health = TrainingHealth(cfg, reward_cfg, reward.aggregation, reward.answer_weight) if cfg.health_steps else None
    progress = StepProgress("GRPO", cfg.local_steps, "steps")  # live progress (the CLI bar, the flow's artifact)
    run = local.grpo_train(
        Path(spec["policy_dir"]), lay.train, reward, lay.local_dir, steps=cfg.local_steps,
        prompts_per_step=cfg.local_prompts_per_step, num_generations=cfg.local_num_generations,
        max_completion_length=cfg.local_max_completion_length, learning_rate=cfg.local_learning_rate,
        beta=cfg.kl_coef, clip_ratio=cfg.clip_ratio, temperature=cfg.local_temperature,
        max_prompts=cfg.local_train_prompts, seed=cfg.local_seed, health=health, progress=progress,
        save_steps=cfg.local_save_steps)
    progress.finish("stopped by the reward health watch" if run["stopped_early"] else None)
    store.write_jsonl(lay.metrics, run["steps"])
    if run["health"] is not None:
        store.write_json(lay.local_health, run["health"])
    comparison = None
    if not run["stopped_early"]:  # a run the health watch stopped has nothing worth comparing
        held_out, eval_split = store.read_prompt_rows(lay.test, cfg.local_eval_prompts), "test"
        if not held_out:  # a single seed lineage cannot be split: compare on training prompts, and say so
            held_out, eval_split = store.read_prompt_rows(lay.train, cfg.local_eval_prompts), "train (no held-out prompts)"
        with counting("GRPO held-out comparison", 2, "policies") as p:
            full = local.compare_policies(Path(spec["policy_dir"]), Path(run["policy_dir"]), held_out, reward,
                                          cfg.local_eval_max_new_tokens, on_policy=lambda: p.update(advance=1),
                                          initial_kind=spec["policy_kind"])
        full["eval_split"] = eval_split
        store.write_json(lay.comparison, full)
        comparison = {k: full[k] for k in COMPARISON_KEYS} | {"initial_mean_reward": full["initial"]["mean_reward"],
                                                               "trained_mean_reward": full["trained"]["mean_reward"]}
    result = {**run, "comparison": comparison, "job_id": spec.get("job_id"), "host": socket.gethostname(),
              "pid": os.getpid()}
    store.write_json(lay.local_run, result)
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {MODULE} PPO_OUT/local/grpo_job.json", file=sys.stderr)
        return 2
    spec = store.read_json(Path(args[0]))
    result = run_smoke(spec)
    rewards = [s["reward"] for s in result["steps"] if "reward" in s]
    health = result["health"]
    print(f"GRPO smoke run {result['job_id']}: {len(result['steps'])} steps on {result['host']}, "
          f"reward per step {[round(r, 4) for r in rewards]}, health "
          f"{'off' if health is None else 'passed' if health['passed'] else 'FAILED'}"
          + (f", stopped at step {health['stopped_at_step']}" if result["stopped_early"] else "")
          + f"; result in {store.PPOLayout(spec['root']).local_run}", flush=True)
    try:
        warning = enforce(health, RewardSettings.model_validate(spec["reward"]).health_policy)
    except RewardHealthError as e:
        print(str(e), file=sys.stderr, flush=True)
        return 1
    if warning:
        print(f"WARNING: {warning}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
