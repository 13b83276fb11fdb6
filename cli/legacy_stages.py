"""One command per stage flow: dedup, synthesize, modules, pipeline, trajectories, reward-data, train-reward, ppo.

Each checks its inputs first (tasks/core/checks.py: files, output folder, endpoint and key), before any
Prefect server starts, then runs its flow with live progress (cli/progress.py); running again over the same
--out resumes, and `evolforge status --out DIR` shows what is done.
"""

from __future__ import annotations

from evolforge.cli.common import add_endpoint_args, run_flow, settings_or_exit
from evolforge.tasks.core import checks


def _endpoint(args) -> dict:
    return dict(config=args.config, base_url=args.base_url, model=args.model)


def cmd_modules(args) -> int:
    stage = dict(max_items=args.max_items, aggregation=args.aggregation, ablation=args.ablation, compare=args.compare)
    settings = settings_or_exit(args, {"modules": {k: v for k, v in stage.items() if v}})
    checks.check_modules(args.input, args.out, settings)
    from evolforge.flows.modules import ModulesParams, modules_flow

    return run_flow(modules_flow, ModulesParams(input=args.input, out=args.out, **stage, **_endpoint(args)), args.out)


def cmd_dedup(args) -> int:
    settings_or_exit(args)
    checks.check_dedup(args.input, args.text_field, args.out)
    from evolforge.flows.dedup import DedupParams, dedup_flow

    return run_flow(dedup_flow, DedupParams(input=args.input, text_field=args.text_field, id_field=args.id_field,
                                             out=args.out, index=args.index, config=args.config))


def cmd_synthesize(args) -> int:
    checks.check_synthesize(args.seeds, args.out, settings_or_exit(args))
    from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow

    return run_flow(synthesize_flow, SynthesizeParams(seeds=args.seeds, out=args.out, **_endpoint(args)), args.out)


def cmd_trajectories(args) -> int:
    settings_or_exit(args)
    checks.check_trajectories(args.proxy_out, args.out, args.rewards)
    from evolforge.flows.trajectories import TrajectoriesParams, trajectories_flow

    return run_flow(trajectories_flow, TrajectoriesParams(
        proxy_out=args.proxy_out, out=args.out, rewards=args.rewards, tokenizer=args.tokenizer,
        include_unfinished=args.include_unfinished, dedup=not args.no_dedup, tokens=not args.no_tokens,
        config=args.config))


def cmd_pipeline(args) -> int:
    settings = settings_or_exit(args, {"evol_instruct": {"rounds": args.rounds}} if args.rounds else None)
    checks.check_evolve(args.seeds, args.out, settings)
    from evolforge.flows.pipeline import PipelineParams, pipeline_flow

    return run_flow(pipeline_flow, PipelineParams(
        seeds=args.seeds, out=args.out, rounds=args.rounds, synthesize=not args.no_synthesize,
        reward=not args.no_reward, ppo=args.ppo, **_endpoint(args)), args.out)


def cmd_reward_data(args) -> int:
    from evolforge.flows.reward_data import RewardDataParams, reward_data_flow

    kinds = args.kinds.split(",") if args.kinds else ["irm", "prm"]
    stage = {k: v for k, v in (("step_label_method", args.method), ("max_instructions", args.max_instructions)) if v}
    checks.check_reward_data(args.evolve_out, args.out, settings_or_exit(args, {"reward": stage} if stage else None))
    return run_flow(reward_data_flow, RewardDataParams(
        evolve_out=args.evolve_out, out=args.out, method=args.method, max_instructions=args.max_instructions,
        kinds=kinds, **_endpoint(args)), args.out)


def cmd_train_reward(args) -> int:
    models = args.models.split(",") if args.models else ["irm", "prm"]
    settings_or_exit(args)
    checks.check_train_reward(args.data, args.out, models)
    from evolforge.flows.train_reward import TrainRewardParams, train_reward_flow

    return run_flow(train_reward_flow, TrainRewardParams(
        data=args.data, out=args.out, models=models, base_model=args.base_model,
        override_health=args.override_health, retrain=args.retrain, config=args.config), args.out or args.data)


def cmd_ppo(args) -> int:
    settings_or_exit(args)
    checks.check_ppo(args.evolved, args.reward_dir, args.out, args.tasks)
    from evolforge.flows.ppo import PPOParams, ppo_flow

    return run_flow(ppo_flow, PPOParams(
        evolved=args.evolved, tasks=args.tasks, reward_dir=args.reward_dir, out=args.out, irm_dir=args.irm_dir,
        prm_dir=args.prm_dir, ignore_reward_health=args.ignore_reward_health, ray_address=args.ray_address,
        ray_job=args.ray_job, ray_wait_seconds=args.ray_wait, local_steps=args.local_steps, config=args.config),
        args.out)


def _choices(allowed: tuple[str, ...]):
    def parse(value: str) -> str:
        bad = [v for v in value.split(",") if v not in allowed]
        if bad:
            import argparse

            raise argparse.ArgumentTypeError(f"{', '.join(bad)} not one of {', '.join(allowed)}")
        return value
    return parse


def register(sub) -> None:
    from evolforge.config.settings import SAMPLE_SEEDS

    p = sub.add_parser("dedup", help="dedup any jsonl / parquet / csv file: kept set + dropped set with reasons")
    p.add_argument("--input", required=True)
    p.add_argument("--text-field", default="instruction")
    p.add_argument("--id-field")
    p.add_argument("--out", required=True)
    p.add_argument("--index", help="persistent index folder to check against and extend")
    p.add_argument("--config")
    p.set_defaults(fn=cmd_dedup)

    p = sub.add_parser("synthesize", help="verified task synthesis from instructions (sandboxed tests, repair loop)")
    p.add_argument("--seeds", required=True, help="e.g. an evolve run's dataset/evolved.parquet")
    p.add_argument("--out", required=True)
    add_endpoint_args(p)
    p.set_defaults(fn=cmd_synthesize)

    p = sub.add_parser("modules", help="module-DAG reasoning (DeCoRL): questions through a graph of modules, "
                       "per-module contribution rewards and PRM rows (resumes over the same --out)")
    p.add_argument("--input", required=True, help="jsonl / csv / parquet with a question (or instruction) field")
    p.add_argument("--out", required=True, help="output folder (items in data/, prm_steps.parquet, summary.json)")
    p.add_argument("--max-items", type=int, help="use at most this many questions (default: modules.max_items)")
    p.add_argument("--aggregation", choices=["integrate", "concat"], help="default: modules.aggregation")
    p.add_argument("--ablation", choices=["mask", "recompute"], help="default: modules.ablation")
    p.add_argument("--compare", action="store_true", help="also answer each question single-shot and judge both with "
                   "the same judge: graph win rate overall and by difficulty (comparison.parquet, summary.json)")
    add_endpoint_args(p)
    p.set_defaults(fn=cmd_modules)

    p = sub.add_parser("pipeline", help="evolve -> synthesize -> reward data -> reward models [-> PPO]")
    p.add_argument("--seeds", default=str(SAMPLE_SEEDS))
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int)
    p.add_argument("--no-synthesize", action="store_true")
    p.add_argument("--no-reward", action="store_true")
    p.add_argument("--ppo", action="store_true", help="also run the PPO stage")
    add_endpoint_args(p)
    p.set_defaults(fn=cmd_pipeline)

    p = sub.add_parser("trajectories", help="agent traffic recorded by the proxy -> SFT conversations, "
                       "per-call transitions and token-level samples")
    p.add_argument("--proxy-out", required=True, help="the recording proxy's folder (evolforge proxy --out)")
    p.add_argument("--out", required=True, help="output folder (sft.jsonl, transitions in data/, tokens.parquet, ...)")
    p.add_argument("--rewards", help="jsonl / csv / parquet with session and reward columns (wins over reward events)")
    p.add_argument("--include-unfinished", action="store_true",
                   help="also export sessions without a finish event that are not idle yet")
    p.add_argument("--tokenizer", help="model folder or GGUF for the token-level samples (default: the embedded model's)")
    p.add_argument("--no-tokens", action="store_true", help="skip the token-level samples")
    p.add_argument("--no-dedup", action="store_true", help="keep conversations whose prompt repeats another session's")
    p.add_argument("--config")
    p.set_defaults(fn=cmd_trajectories)

    p = sub.add_parser("reward-data", help="reward-model data from an evolve run: IRM preference pairs, PRM step "
                       "labels, health checks (resumes over the same --out)")
    p.add_argument("--evolve-out", required=True, help="output folder of a finished evolve run (evolforge run --out)")
    p.add_argument("--out", required=True, help="output folder (IRM pairs in data/, prm_steps.parquet, health.json)")
    p.add_argument("--method", choices=["judge", "decorl", "math_shepherd", "modules"],
                   help="PRM step-label method (default: reward.step_label_method)")
    p.add_argument("--max-instructions", type=int, help="use at most this many instructions (default: "
                   "reward.max_instructions)")
    p.add_argument("--kinds", type=_choices(("irm", "prm")), help="comma-separated: irm, prm (default: both)")
    add_endpoint_args(p)
    p.set_defaults(fn=cmd_reward_data)

    p = sub.add_parser("train-reward", help="train the IRM and PRM reward models on reward-data output "
                       "(health gate, held-out metrics)")
    p.add_argument("--data", required=True, help="the reward-data stage's output folder")
    p.add_argument("--out", help="where models/, metrics.json and the model health go (default: --data)")
    p.add_argument("--models", type=_choices(("irm", "prm")), help="comma-separated: irm, prm (default: both)")
    p.add_argument("--base-model", help="model folder to fine-tune (default: reward.base_model)")
    p.add_argument("--override-health", action="store_true", help="train although the data health checks "
                   "failed under policy 'stop'")
    p.add_argument("--retrain", action="store_true", help="train again although a model is in the output folder")
    p.add_argument("--config")
    p.set_defaults(fn=cmd_train_reward)

    p = sub.add_parser("ppo", help="PPO (RLEIF): verl prompt data, PPO config and Ray job, local GRPO smoke run")
    p.add_argument("--evolved", required=True, help="an evolve run's output folder or its dataset/evolved.parquet")
    p.add_argument("--reward-dir", required=True, help="the train-reward stage's output folder")
    p.add_argument("--out", required=True, help="output folder (data/, verl/, local/, summary.json)")
    p.add_argument("--tasks", help="the synthesis stage's output folder or its tasks table (verified ground truth)")
    p.add_argument("--irm-dir", help="IRM folder (default: REWARD_DIR / ppo.irm_subdir)")
    p.add_argument("--prm-dir", help="PRM folder (default: REWARD_DIR / ppo.prm_subdir)")
    p.add_argument("--ignore-reward-health", action="store_true", help="run although the reward stage is unhealthy")
    p.add_argument("--ray-address", help="Ray dashboard address (Jobs API) to submit the job to, e.g. http://head:8265 "
                   "(default: ppo.ray_address, else $RAY_ADDRESS)")
    p.add_argument("--ray-job", choices=["verl_ppo", "grpo_smoke"],
                   help="what the Ray job runs: the verl PPO trainer, or the GRPO smoke run (default: ppo.ray_job)")
    p.add_argument("--ray-wait", type=float, metavar="SECONDS",
                   help="wait for the job to finish and fetch its log (default: ppo.ray_wait_seconds; 0: don't)")
    p.add_argument("--local-steps", type=int, help="GRPO steps of the local smoke run (0 skips it)")
    p.add_argument("--config")
    p.set_defaults(fn=cmd_ppo)
