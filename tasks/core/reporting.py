"""Run reports: summary.json content, the cost tables and the markdown the Prefect UI shows.

Plain functions over the ledger (polars) and the round tables; the flow turns
them into artifacts and files.
"""

from __future__ import annotations

import polars as pl

from evolforge.storage.ledger import known_sum, totals


def cost_summary(ledger: pl.DataFrame, lineage: pl.DataFrame | None = None) -> dict:
    """Totals of a run's ledger. An unknown cost is never summed as 0: any total, mean or median over a call
    without a price is None ("unknown"), and `unpriced_attempts` says how many calls lack one."""
    if ledger.is_empty():
        return {"calls": 0, "attempts": 0, "cost_usd": 0.0, "by_stage": [], "per_task": {}}
    by_stage = totals(ledger, ["stage", "model"]).to_dicts()
    per_task = totals(ledger, ["task_id"])
    all_priced = ledger["cost_usd"].null_count() == 0
    tasks_priced = per_task["cost_usd"].null_count() == 0
    out = {
        "attempts": ledger.height,
        "failed_attempts": int((ledger["outcome"] != "ok").sum()),
        "prompt_tokens": int(ledger["prompt_tokens"].sum() or 0),
        "completion_tokens": int(ledger["completion_tokens"].sum() or 0),
        "cost_usd": float(ledger["cost_usd"].sum()) if all_priced else None,
        "unpriced_attempts": int(ledger["cost_usd"].null_count()),
        "price_sources": sorted(s for s in ledger["price_source"].unique().to_list() if s),
        "by_stage": by_stage,
        "per_task": {
            "tasks": per_task.height,
            "unpriced_tasks": int(per_task["cost_usd"].null_count()),
            "mean_cost_usd": _f(per_task["cost_usd"].mean()) if tasks_priced else None,
            "median_cost_usd": _f(per_task["cost_usd"].median()) if tasks_priced else None,
            "max_cost_usd": _f(per_task["cost_usd"].max()) if tasks_priced else None,
            "mean_calls": _f(per_task["calls"].mean()),
            "mean_model_seconds": _f(per_task["model_seconds"].mean()),
        },
    }
    if lineage is not None and not lineage.is_empty():
        by_round = (
            ledger.join(lineage.select(pl.col("id").alias("task_id"), "round"), on="task_id", how="inner")
            .group_by("round").agg(known_sum("cost_usd").alias("cost_usd"), pl.len().alias("attempts"))
            .sort("round")
        )
        out["by_round"] = by_round.to_dicts()
    return out


def usd(value: float | None) -> str:
    """A cost as reports show it: unknown when any call behind it has no price."""
    return "unknown (unpriced model)" if value is None else f"${value:.6f}"


def _f(v) -> float | None:
    return None if v is None else round(float(v), 8)


def markdown_table(headers: list[str], rows: list[list]) -> list[str]:
    """A markdown table as lines: every run report of the project builds its tables with this."""
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + \
        ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


