"""One command per stage flow: dedup, synthesize, modules, pipeline, trajectories."""

from __future__ import annotations

from evolforge.cli.common import add_endpoint_args, run_flow


def cmd_modules(args) -> int:
    from evolforge.flows.modules import ModulesParams, modules_flow

    return run_flow(modules_flow, ModulesParams(input=args.input, out=args.out, max_items=args.max_items,
                                                 aggregation=args.aggregation, ablation=args.ablation,
                                                 compare=args.compare, config=args.config,
                                                 base_url=args.base_url, model=args.model))


def cmd_dedup(args) -> int:
    from evolforge.flows.dedup import DedupParams, dedup_flow

    return run_flow(dedup_flow, DedupParams(input=args.input, text_field=args.text_field, id_field=args.id_field,
                                             out=args.out, index=args.index, config=args.config))


def cmd_synthesize(args) -> int:
    from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow

    return run_flow(synthesize_flow, SynthesizeParams(seeds=args.seeds, out=args.out, config=args.config,
                                                       base_url=args.base_url, model=args.model))


def cmd_trajectories(args) -> int:
    from evolforge.flows.trajectories import TrajectoriesParams, trajectories_flow

    return run_flow(trajectories_flow, TrajectoriesParams(
        proxy_out=args.proxy_out, out=args.out, rewards=args.rewards, tokenizer=args.tokenizer,
        include_unfinished=args.include_unfinished, dedup=not args.no_dedup, tokens=not args.no_tokens,
        config=args.config))


def cmd_pipeline(args) -> int:
    from evolforge.flows.pipeline import PipelineParams, pipeline_flow

    return run_flow(pipeline_flow, PipelineParams(
        seeds=args.seeds, out=args.out, rounds=args.rounds, synthesize=not args.no_synthesize,
        reward=not args.no_reward, ppo=args.ppo, config=args.config, base_url=args.base_url, model=args.model))


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
    p.add_argument("--out", required=True, help="output folder (items.parquet, prm_steps.parquet, summary.json)")
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
    p.add_argument("--out", required=True, help="output folder (sft.jsonl, transitions.parquet, tokens.parquet, ...)")
    p.add_argument("--rewards", help="jsonl / csv / parquet with session and reward columns (wins over reward events)")
    p.add_argument("--include-unfinished", action="store_true",
                   help="also export sessions without a finish event that are not idle yet")
    p.add_argument("--tokenizer", help="model folder or GGUF for the token-level samples (default: the embedded model's)")
    p.add_argument("--no-tokens", action="store_true", help="skip the token-level samples")
    p.add_argument("--no-dedup", action="store_true", help="keep conversations whose prompt repeats another session's")
    p.add_argument("--config")
    p.set_defaults(fn=cmd_trajectories)
