"""`evolforge run` (Evol-Instruct rounds, resumable) and `evolforge retry` (only the failed batches)."""

from __future__ import annotations

import json
import sys
import time

from evolforge.cli.common import add_endpoint_args, failed, prefect_defaults, prefect_env, settings_or_exit


def cmd_run(args) -> int:
    from evolforge.tasks.core.checks import check_evolve

    settings = settings_or_exit(args, {"evol_instruct": {"rounds": args.rounds}} if args.rounds else None)
    check_evolve(args.seeds, args.out, settings)  # before any Prefect server starts
    return _run_with(args, overrides={})


def _run_with(args, overrides: dict) -> int:
    prefect_env()
    from evolforge.cli.progress import live_progress
    from evolforge.flows.evolve import EvolveParams, evolve_flow
    from evolforge.storage.fs import location
    from evolforge.storage.run_record import RunInputsChanged

    params = EvolveParams(seeds=str(location(args.seeds)), out=str(location(args.out)),
                          rounds=args.rounds, config=args.config, base_url=args.base_url, model=args.model,
                          overrides=overrides, force_settings=getattr(args, "force_settings", False))
    try:
        with prefect_defaults(params), live_progress():
            summary = evolve_flow(params)
    except RunInputsChanged as e:  # nothing was done: no resume hint
        print(f"\nevolforge run: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # one clear line, not a stack trace per batch; the resume hint when there is work to resume
        return failed("run", e, args.out)
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
    saved = info["settings"]
    if args.base_url:
        saved["gateway"]["base_url"] = args.base_url
    args.seeds, args.rounds, args.config, args.model = info["seeds"], saved["evol_instruct"]["rounds"], None, None
    from evolforge.tasks.core.checks import check_endpoint

    check_endpoint(settings_or_exit(args, saved))  # before anything is reopened or a Prefect server starts
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
    return _run_with(args, overrides=saved)


def register(sub) -> None:
    from evolforge.config.settings import SAMPLE_SEEDS

    p = sub.add_parser("run", help="evolve seeds through Evol-Instruct rounds (resumes over the same --out)")
    p.add_argument("--seeds", default=str(SAMPLE_SEEDS), help="jsonl, parquet or csv of seed instructions")
    p.add_argument("--out", required=True, help="output folder (checkpoints, datasets, ledger)")
    p.add_argument("--rounds", type=int, help="evolution rounds (default: evol_instruct.rounds); fewer than the run "
                   "over --out finished keeps every finished round in the datasets")
    p.add_argument("--force-settings", action="store_true",
                   help="go on over an existing --out although its seed file or result-changing settings differ "
                   "from the run's own (recorded in run.json's history)")
    add_endpoint_args(p)
    p.set_defaults(fn=cmd_run, fast_exit=True)  # the process ends without the interpreter's teardown (cli/common.py)

    p = sub.add_parser("retry", help="re-run only the failed or rejected batches of the run at --out")
    p.add_argument("--out", required=True)
    p.add_argument("--base-url", help="endpoint to use this time (default: the run's own)")
    p.set_defaults(fn=cmd_retry, fast_exit=True)
