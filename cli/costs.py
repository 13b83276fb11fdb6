"""`evolforge costs`: totals from a run's cost ledger (a pipeline folder: the ledgers of all its stages)."""

from __future__ import annotations

import sys

LEDGER_GROUPS = ("stage", "model", "task_id", "run_id", "outcome", "price_source", "http_status")


def ledger_of(out):
    """Every ledger row of the folder at `out` and of the stage folders inside it (a pipeline run's, whose
    `status` shows each stage), as one frame."""
    import polars as pl

    from evolforge.storage.folder import read_marker
    from evolforge.storage.fs import list_files, location
    from evolforge.storage.ledger import read_ledger

    root = location(out)
    frames = [read_ledger(root)] + [ledger_of(sub) for sub in list_files(root, "*") if read_marker(sub) is not None]
    frames = [f for f in frames if not f.is_empty()]
    return pl.concat(frames, how="diagonal_relaxed") if frames else read_ledger(root)


def cmd_costs(args) -> int:
    from evolforge.storage.fs import exists, location
    from evolforge.tasks.core.checks import InputError

    by = [c.strip() for c in args.by.split(",") if c.strip()]
    unknown = [c for c in by if c not in LEDGER_GROUPS]
    if unknown or not by:
        raise InputError(f"--by {args.by}: {', '.join(unknown) or 'no column'} is not a ledger column; give one or "
                         f"more of {', '.join(LEDGER_GROUPS)}, comma-separated")
    if not exists(location(args.out)):
        raise InputError(f"{location(args.out)} does not exist (pass a run's output folder with --out)")
    df = ledger_of(args.out)
    if df.is_empty():
        print(f"evolforge costs: no ledger rows in {args.out} (no model call was made there)", file=sys.stderr)
        return 1
    import polars as pl

    from evolforge.storage.ledger import totals

    with pl.Config(tbl_rows=args.limit, tbl_cols=20, tbl_width_chars=200):
        print(totals(df, by).sort("cost_usd", descending=True, nulls_last=True).head(args.limit))
    return 0


def register(sub) -> None:
    p = sub.add_parser("costs", help="cost totals from the ledger of an output folder (a pipeline's: every stage)")
    p.add_argument("--out", required=True)
    p.add_argument("--by", default="stage,model", help=f"comma-separated columns: {', '.join(LEDGER_GROUPS)}")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(fn=cmd_costs)
