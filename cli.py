"""The `evolforge` command line.

    evolforge run --seeds PATH --out DIR [--rounds N] [--base-url URL] [--model NAME] [--config FILE]
                  [--force-settings]
    evolforge serve-model [--port N]          # the embedded model in the foreground
    evolforge preflight [--base-url URL]      # one minimal request per configured model
    evolforge costs --out DIR [--by stage]    # totals from the cost ledger

The API key comes from EVOLFORGE_API_KEY, falling back to OPENAI_API_KEY.
Running `run` again over the same --out resumes it, with the run's own seed file and result-changing
settings (a change is an error naming it; --force-settings accepts it, or use a new --out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _settings(args, extra: dict | None = None):
    """Settings from --config, --base-url, --model and `extra`, merged as every flow merges them."""
    from evolforge.config.settings import ConfigError
    from evolforge.flows._params import EndpointParams

    try:
        return EndpointParams(config=getattr(args, "config", None), base_url=getattr(args, "base_url", None) or None,
                              model=getattr(args, "model", None), overrides=extra or {}).settings()
    except ConfigError as e:
        print(f"evolforge: {e}", file=sys.stderr)
        sys.exit(2)


def cmd_run(args) -> int:
    _settings(args, {"evol_instruct": {"rounds": args.rounds}} if args.rounds else None)  # fail early on bad config
    return _run_with(args, overrides={})


def _run_with(args, overrides: dict) -> int:
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from evolforge.flows.evolve import EvolveParams, evolve_flow
    from evolforge.storage.fs import location
    from evolforge.storage.run_record import RunInputsChanged

    params = EvolveParams(seeds=str(location(args.seeds)), out=str(location(args.out)),
                          rounds=args.rounds, config=args.config, base_url=args.base_url, model=args.model,
                          overrides=overrides, force_settings=getattr(args, "force_settings", False))
    try:
        summary = evolve_flow(params)
    except RunInputsChanged as e:  # nothing was done: no resume hint
        print(f"\nevolforge run: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # one clear line, not a stack trace per batch
        print(f"\nevolforge run failed: {e}", file=sys.stderr)
        print(f"Checkpoints are kept in {args.out}; run the same command again to resume.", file=sys.stderr)
        return 1
    cost = summary["cost"].get("cost_usd")
    print("\n== evolforge run complete ==")
    for r in summary["rounds"]:
        print(f"round {r['round']}: {r['accepted']}/{r['attempts']} accepted (survival {r['survival']:.0%}), "
              f"eliminated by rule: {r['by_rule'] or '-'}")
    if summary.get("rounds_note"):
        print(f"note: {summary['rounds_note']}")
    print(f"records (seeds + accepted evolutions): {summary['counts']['evolved']} -> {summary['datasets']['evolved']}")
    print(f"lineage of every attempt:              {summary['datasets']['lineage']}")
    print(f"cost ledger ({summary['cost'].get('attempts', 0)} calls): {summary['datasets']['cost_ledger']}  "
          f"total: {'unknown (unpriced model)' if cost is None else f'${cost:.6f}'}")
    for st in summary["cost"].get("by_stage", []):
        usd = "unpriced" if st["cost_usd"] is None or st["unpriced_calls"] else f"${st['cost_usd']:.6f}"
        print(f"  stage {st['stage']:<10} {st['model']:<28} {st['calls']:>6} calls ({st['failed_attempts']} failed) "
              f"{(st['prompt_tokens'] or 0) + (st['completion_tokens'] or 0):>9} tokens  {usd}")
    print(f"summary:                               {summary['out_dir'].rstrip('/')}/summary.json")
    print(f"per-stage costs: evolforge costs --out {args.out} --by stage")
    return 0


def cmd_retry(args) -> int:
    """Re-run only the batches that failed or hold rejected (error) records in the run at --out.

    The reopened round's dedup step is redone over all its accepted records, and what this run put in
    its dedup index for that round and the superseded later ones is rolled back first (other runs'
    and nights' entries in a shared index stay)."""
    from pydantic import ValidationError

    from evolforge.config.sections.dedup import DedupSettings
    from evolforge.storage.fs import exists, read_text
    from evolforge.storage.layout import RunLayout
    from evolforge.storage.rounds import reopen_failed_batches
    from evolforge.tasks.dedup.index import IndexLocked
    from evolforge.tasks.evolve.dedup_round import rollback_run

    layout = RunLayout(args.out)
    if not exists(layout.run_info):
        print(f"evolforge: no run in {layout.root} (run.json missing)", file=sys.stderr)
        return 2
    info = json.loads(read_text(layout.run_info))
    reopened = reopen_failed_batches(layout, time.strftime("%Y%m%dT%H%M%S"))
    if not reopened["batches"] and exists(layout.summary):
        print(f"nothing to retry in {layout.root}: every batch finished without errors")
        return 0
    if reopened["batches"]:
        r = reopened["round"]
        print(f"round {r}: redoing batches {reopened['batches']}; "
              f"later rounds superseded: {reopened['superseded_rounds'] or '-'}")
        try:
            dedup_settings = DedupSettings.model_validate(info["settings"].get("dedup") or {})
        except ValidationError:
            dedup_settings = DedupSettings()
        try:
            for done in rollback_run(layout, r, dedup_settings):
                print(f"dedup index {done['index']}: rolled back this run's rounds >= {r} "
                      f"({done['records']} records in {done['segments']} segments)")
        except IndexLocked as e:  # the redone dedup step rolls it back too, once it gets the lock
            print(f"evolforge: {e}; the index is rolled back when round {r}'s dedup step runs", file=sys.stderr)
    saved = info["settings"]
    if args.base_url:
        saved["gateway"]["base_url"] = args.base_url
    args.seeds, args.rounds, args.config, args.model = info["seeds"], saved["evol_instruct"]["rounds"], None, None
    return _run_with(args, overrides=saved)


def _run_flow(fn, params) -> int:
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        result = fn(params)
    except Exception as e:  # one clear line
        print(f"\nevolforge: {fn.name} failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, default=str)[:6000])
    return 0


def cmd_modules(args) -> int:
    from evolforge.flows.modules import ModulesParams, modules_flow

    return _run_flow(modules_flow, ModulesParams(input=args.input, out=args.out, max_items=args.max_items,
                                                 aggregation=args.aggregation, ablation=args.ablation,
                                                 compare=args.compare, config=args.config,
                                                 base_url=args.base_url, model=args.model))


def cmd_dedup(args) -> int:
    from evolforge.flows.dedup import DedupParams, dedup_flow

    return _run_flow(dedup_flow, DedupParams(input=args.input, text_field=args.text_field, id_field=args.id_field,
                                             out=args.out, index=args.index, config=args.config))


def cmd_synthesize(args) -> int:
    from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow

    return _run_flow(synthesize_flow, SynthesizeParams(seeds=args.seeds, out=args.out, config=args.config,
                                                       base_url=args.base_url, model=args.model))


def cmd_trajectories(args) -> int:
    from evolforge.flows.trajectories import TrajectoriesParams, trajectories_flow

    return _run_flow(trajectories_flow, TrajectoriesParams(
        proxy_out=args.proxy_out, out=args.out, rewards=args.rewards, tokenizer=args.tokenizer,
        include_unfinished=args.include_unfinished, dedup=not args.no_dedup, tokens=not args.no_tokens,
        config=args.config))


def cmd_pipeline(args) -> int:
    from evolforge.flows.pipeline import PipelineParams, pipeline_flow

    return _run_flow(pipeline_flow, PipelineParams(
        seeds=args.seeds, out=args.out, rounds=args.rounds, synthesize=not args.no_synthesize,
        reward=not args.no_reward, ppo=args.ppo, config=args.config, base_url=args.base_url, model=args.model))


def cmd_deploy(args) -> int:
    settings = _settings(args)
    from evolforge.deployments.deploy import deploy

    return deploy(settings, pool=args.pool, schedule_active=False if args.no_schedule else None)


def cmd_serve_model(args) -> int:
    settings = _settings(args)
    from evolforge.tasks.core.embedded_model import EmbeddedModelError, server_command

    cfg = settings.embedded
    port = args.port or cfg.port or 8080
    try:
        cmd = server_command(cfg, port)
    except EmbeddedModelError as e:
        print(f"evolforge: {e}", file=sys.stderr)
        return 2
    print(f"serving {cfg.alias} on http://{cfg.host}:{port}/v1  "
          f"(use: EVOLFORGE__GATEWAY__BASE_URL=http://{cfg.host}:{port}/v1)", flush=True)
    os.execv(cmd[0], cmd)
    return 0  # pragma: no cover


def preflight(settings, base_url: str, embedded: bool) -> list[dict]:
    """One minimal completion per distinct model of every stage, the reward stage's variant models and the
    module graph's models (its judge included)."""
    from evolforge.tasks.core.gateway import Gateway

    gw = Gateway(settings.model_copy(update={"gateway": settings.gateway.model_copy(update={"max_retries": 0})}),
                 base_url=base_url, run_id="preflight",
                 embedded_models={settings.embedded.alias} if embedded else set())
    from evolforge.tasks.modules.run import judge_model, module_models

    extra = (*settings.reward.variant_models, judge_model(settings), *module_models(settings).values())
    try:
        return gw.check_models(["evolve", "answer", "judge", "synthesize", "solver"], tuple(dict.fromkeys(extra)))
    finally:
        gw.close()


def cmd_preflight(args) -> int:
    settings = _settings(args)
    import contextlib

    from evolforge.tasks.core.embedded_model import embedded_server
    from evolforge.tasks.core.gateway import InsecureKeyTransport, mask_secret, read_api_key

    ctx = embedded_server(settings.embedded) if settings.uses_embedded_model else contextlib.nullcontext(
        settings.gateway.base_url)
    with ctx as base_url:
        print(f"endpoint: {base_url}  key: {mask_secret(read_api_key())}")
        try:
            report = preflight(settings, base_url, settings.uses_embedded_model)
        except InsecureKeyTransport as e:
            print(f"evolforge: {e}", file=sys.stderr)
            return 2
    ok = True
    for r in report:
        if r["ok"]:
            print(f"  OK    {r['model']:<40} {r['latency_s']:.2f}s  stages={','.join(r['stages'])}")
        else:
            ok = False
            print(f"  FAIL  {r['model']:<40} stages={','.join(r['stages'])}\n        {r['error']}")
    return 0 if ok else 1


def cmd_proxy(args) -> int:
    """Serve the recording proxy (foreground, no Prefect needed), or --check it once."""
    import contextlib

    from evolforge.tasks.core.embedded_model import embedded_server
    from evolforge.tasks.proxy.app import ProxyConfigError
    from evolforge.tasks.proxy.server import check, serve

    proxy_overrides = {k: v for k, v in (("upstream", args.upstream), ("host", args.host), ("port", args.port))
                       if v is not None}
    settings = _settings(args, {"proxy": proxy_overrides})
    upstream = settings.proxy.upstream
    embedded = not upstream
    ctx = embedded_server(settings.embedded) if embedded else contextlib.nullcontext(upstream)
    try:
        with ctx as url:
            models = {settings.embedded.alias} if embedded else set()
            if args.check:
                res = check(settings, url, args.out, args.model or settings.models.default)
                if res["ok"]:
                    print(f"OK  {res['latency_s']:.3f}s through the proxy to {url}")
                    return 0
                print(f"FAIL HTTP {res.get('status', '-')}: {res['error']}\n     fix: {res['fix']}", file=sys.stderr)
                return 1
            cfg = settings.proxy
            print(f"recording proxy on http://{cfg.host}:{cfg.port}/v1 -> {url}; records in {args.out}\n"
                  f"  agents: set the base URL to http://{cfg.host}:{cfg.port}/s/SESSION/v1", flush=True)
            serve(settings, url, args.out, models)
    except ProxyConfigError as e:
        print(f"evolforge: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_costs(args) -> int:
    from evolforge.storage.ledger import read_ledger, totals

    df = read_ledger(args.out)
    if df.is_empty():
        print(f"no ledger rows in {args.out}/ledger", file=sys.stderr)
        return 1
    by = [c.strip() for c in args.by.split(",")]
    import polars as pl

    with pl.Config(tbl_rows=args.limit, tbl_cols=20, tbl_width_chars=200):
        print(totals(df, by).sort("cost_usd", descending=True, nulls_last=True).head(args.limit))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="evolforge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--config", help="TOML config file (default: config/default.toml)")
        p.add_argument("--base-url", help="OpenAI-compatible endpoint (default: the embedded model)")
        p.add_argument("--model", help="model for every stage without its own model in the config")

    p = sub.add_parser("run", help="evolve seeds through Evol-Instruct rounds (resumes over the same --out)")
    from evolforge.config.settings import SAMPLE_SEEDS

    p.add_argument("--seeds", default=str(SAMPLE_SEEDS), help="jsonl, parquet or csv of seed instructions")
    p.add_argument("--out", required=True, help="output folder (checkpoints, datasets, ledger)")
    p.add_argument("--rounds", type=int, help="evolution rounds (default: evol_instruct.rounds); fewer than the run "
                   "over --out finished keeps every finished round in the datasets")
    p.add_argument("--force-settings", action="store_true",
                   help="go on over an existing --out although its seed file or result-changing settings differ "
                   "from the run's own (recorded in run.json's history)")
    common(p)
    p.set_defaults(fn=cmd_run)

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
    common(p)
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
    common(p)
    p.set_defaults(fn=cmd_modules)

    p = sub.add_parser("pipeline", help="evolve -> synthesize -> reward data -> reward models [-> PPO]")
    p.add_argument("--seeds", default=str(SAMPLE_SEEDS))
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int)
    p.add_argument("--no-synthesize", action="store_true")
    p.add_argument("--no-reward", action="store_true")
    p.add_argument("--ppo", action="store_true", help="also run the PPO stage")
    common(p)
    p.set_defaults(fn=cmd_pipeline)

    p = sub.add_parser("retry", help="re-run only the failed or rejected batches of the run at --out")
    p.add_argument("--out", required=True)
    p.add_argument("--base-url", help="endpoint to use this time (default: the run's own)")
    p.set_defaults(fn=cmd_retry)

    p = sub.add_parser("deploy", help="deploy every flow to a Prefect process work pool (schedule from config)")
    p.add_argument("--config")
    p.add_argument("--pool", help="work pool name (default: schedule.work_pool)")
    p.add_argument("--no-schedule", action="store_true", help="deploy the nightly schedule switched off")
    p.set_defaults(fn=cmd_deploy)

    p = sub.add_parser("serve-model", help="serve the embedded model (foreground) for the UI and deployments")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--config")
    p.set_defaults(fn=cmd_serve_model)

    p = sub.add_parser("preflight", help="send one minimal request per configured model")
    common(p)
    p.set_defaults(fn=cmd_preflight)

    p = sub.add_parser("proxy", help="the recording proxy: an OpenAI-compatible endpoint that records agent traffic")
    p.add_argument("--upstream", help="model endpoint to forward to (default: proxy.upstream; empty: embedded model)")
    p.add_argument("--host", help="bind address (default: proxy.host, loopback)")
    p.add_argument("--port", type=int, help="port (default: proxy.port)")
    p.add_argument("--out", default="runs/proxy", help="folder the records, session events and ledger go to")
    p.add_argument("--check", action="store_true", help="send one call through the proxy to the upstream and exit")
    p.add_argument("--config")
    p.add_argument("--model", help="model for --check (default: models.default)")
    p.set_defaults(fn=cmd_proxy)

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

    p = sub.add_parser("costs", help="cost totals from the ledger of an output folder")
    p.add_argument("--out", required=True)
    p.add_argument("--by", default="stage,model", help="comma-separated columns: stage, model, task_id, run_id, outcome")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(fn=cmd_costs)

    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
