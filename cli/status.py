"""`evolforge status --out DIR`: what a run's checkpoints say, without starting anything (no Prefect, no model).

Rounds (or stage sets) with batches done, failed and pending, records done / in the input and accepted,
and the calls, tokens and cost of the folder's ledger; a pipeline folder shows each of its stages.
"""

from __future__ import annotations

import json
import sys

STATUS_KEYS = {"kind", "root", "exists", "finished", "units", "cost", "stages"}


def _cost(c: dict) -> str:
    usd = f"unknown ({c['unpriced_calls']} unpriced calls)" if c["cost_usd"] is None else f"${c['cost_usd']:.6f}"
    return f"calls {c['calls']} ({c['failed_attempts']} failed attempts), tokens {c['tokens']}, cost {usd}"


def _print_stage(st: dict, indent: str = "") -> None:
    state = "finished" if st.get("finished") else "not finished"
    print(f"{indent}{st['kind']} {st['root']} ({state})")
    for u in st.get("units", []):
        extra = "; complete" if u.get("complete") else ""
        failed = f" {u['failed_batches'][:10]}" if u["failed_batches"] else ""
        print(f"{indent}  {u['unit']}: batches {u['done']} done, {u['failed']} failed{failed}, {u['pending']} pending "
              f"of {u['batches']}; records {u['records_done']}/{u['records']} done, {u['accepted']} accepted, "
              f"{u['errors']} errors{extra}")
        if u.get("failure"):
            print(f"{indent}    first failed batch: {u['failure']}")
    for key, value in st.items():  # what the stage's folder adds (StageFolder.status_extra: models trained, nights)
        if key not in STATUS_KEYS:
            shown = (", ".join(map(str, value)) or "none") if isinstance(value, (list, tuple)) else value
            print(f"{indent}  {key.replace('_', ' ')}: {shown}")
    if "cost" in st:
        print(f"{indent}  {_cost(st['cost'])}")
        for s in st["cost"]["by_stage"]:
            usd = "unpriced" if s["cost_usd"] is None else f"${s['cost_usd']:.6f}"
            print(f"{indent}    {s['stage']:<12} {s['calls']:>6} calls  "
                  f"{(s['prompt_tokens'] or 0) + (s['completion_tokens'] or 0):>9} tokens  {usd}")


def stage_status(out) -> dict:
    """The status of the folder at `out` (storage/status.py), its kind read from its stage.json marker and its
    units from the registered stage's folder class."""
    from evolforge.storage.status import folder_status
    from evolforge.tasks.core.stages import stages

    return folder_status(out, {s.name: s.folder_class() for s in stages() if s.folder is not None})


def cmd_status(args) -> int:
    st = stage_status(args.out)
    if args.json:
        print(json.dumps(st, indent=2, default=str))
        return 0 if st.get("kind") else 2
    if not st["exists"]:
        print(f"evolforge status: {st['root']} does not exist", file=sys.stderr)
        return 2
    if st["kind"] is None:
        print(f"evolforge status: {st['root']} holds no evolforge stage output (no stage.json marker; a folder from an "
              "evolforge before 0.2 gets one when its stage runs over it again)", file=sys.stderr)
        return 2
    if "stages" in st:
        print(f"{st['kind']} {st['root']}")
        for stage in st["stages"]:
            _print_stage(stage, "  ")
    else:
        _print_stage(st)
    return 0


def register(sub) -> None:
    p = sub.add_parser("status", help="rounds and batches done, failed and pending, records, calls and cost of the "
                       "run at --out (reads its checkpoints; starts nothing)")
    p.add_argument("--out", required=True, help="a run's output folder (any stage, or a pipeline's root)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(fn=cmd_status)
