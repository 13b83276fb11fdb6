"""`evolforge costs`: totals from a run's cost ledger."""

from __future__ import annotations

import sys


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


def register(sub) -> None:
    p = sub.add_parser("costs", help="cost totals from the ledger of an output folder")
    p.add_argument("--out", required=True)
    p.add_argument("--by", default="stage,model", help="comma-separated columns: stage, model, task_id, run_id, outcome")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(fn=cmd_costs)
