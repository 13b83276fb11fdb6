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


class CostTally:
    """USD per task, summed incrementally from ledger rows as they arrive (memory: one entry per task)."""

    def __init__(self):
        self.by_task = pl.DataFrame(schema={"task_id": pl.Utf8, "cost_usd": pl.Float64, "calls": pl.UInt32,
                                            "priced": pl.UInt32})

    def add(self, rows: pl.DataFrame) -> "CostTally":
        if rows.height:
            new = rows.group_by("task_id").agg(pl.col("cost_usd").sum(), pl.len().cast(pl.UInt32).alias("calls"),
                                               pl.col("cost_usd").is_not_null().sum().cast(pl.UInt32).alias("priced"))
            self.by_task = (pl.concat([self.by_task, new]).group_by("task_id")
                            .agg(pl.col("cost_usd").sum(), pl.col("calls").sum(), pl.col("priced").sum()))
        return self

    def cost_of(self, task_ids: pl.Series) -> float | None:
        """Total USD of these tasks; None (unknown) when any of their calls has no price."""
        rows = self.by_task.filter(pl.col("task_id").is_in(task_ids.implode()))
        if rows.is_empty() or rows["priced"].sum() < rows["calls"].sum():
            return None
        return float(rows["cost_usd"].sum())


def round_rows(table: dict, cost_usd: float | None = None) -> list[dict]:
    """Rows of the per-round table artifact: survival by operation, then the round total with tokens and cost."""
    rows = [
        {"round": table["round"], "operation": r["operation"], "direction": r["direction"],
         "attempts": r["attempts"], "accepted": r["accepted"], "survival": r["survival"],
         "prompt_tokens": "", "completion_tokens": "", "cost_usd": ""}
        for r in table["by_operation"]
    ]
    rows.append({"round": table["round"], "operation": "ALL", "direction": "",
                 "attempts": table["attempts"], "accepted": table["accepted"], "survival": table["survival"],
                 "prompt_tokens": table["prompt_tokens"], "completion_tokens": table["completion_tokens"],
                 "cost_usd": "unpriced" if cost_usd is None else round(cost_usd, 6)})
    for rule, n in sorted(table["by_rule"].items()):
        rows.append({"round": table["round"], "operation": f"eliminated: {rule}", "direction": "", "attempts": n,
                     "accepted": "", "survival": "", "prompt_tokens": "", "completion_tokens": "", "cost_usd": ""})
    return rows


def markdown_table(headers: list[str], rows: list[list]) -> list[str]:
    """A markdown table as lines: every run report of the project builds its tables with this."""
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + \
        ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def markdown_summary(summary: dict) -> str:
    lines = [f"# evolforge run `{summary['run_id']}`", "",
             f"Output folder: `{summary['out_dir']}`  ", f"Endpoint: `{summary['endpoint']}`", "",
             "## Rounds", ""]
    lines += markdown_table(
        ["round", "attempts", "accepted", "eliminated", "errors", "survival", "removed by rule"],
        [[r["round"], r["attempts"], r["accepted"], r["eliminated"], r["errors"], f"{r['survival']:.1%}",
          ", ".join(f"{k}: {v}" for k, v in sorted(r["by_rule"].items())) or "-"] for r in summary["rounds"]])
    cost = summary["cost"]
    lines += ["", "## Cost per stage", "", f"Total: {usd(cost.get('cost_usd'))} over {cost.get('attempts', 0)} attempts "
              f"({cost.get('failed_attempts', 0)} failed); prices from: {', '.join(cost.get('price_sources', [])) or '-'}",
              ""]
    lines += markdown_table(
        ["stage", "model", "calls", "failed", "prompt tok", "completion tok", "USD", "seconds"],
        [[s["stage"], s["model"], s["calls"], s["failed_attempts"], s["prompt_tokens"], s["completion_tokens"],
          "n/a" if s["cost_usd"] is None or s["unpriced_calls"] else f"{s['cost_usd']:.6f}",
          f"{s['model_seconds']:.1f}"] for s in cost.get("by_stage", [])])
    pt = cost.get("per_task") or {}
    if pt:
        lines += ["", "## Cost per task (per evolved record)", "",
                  f"{pt['tasks']} tasks; mean {usd(pt['mean_cost_usd'])}, median {usd(pt['median_cost_usd'])}, "
                  f"max {usd(pt['max_cost_usd'])}; mean {pt['mean_calls'] or 0:.2f} calls and "
                  f"{pt['mean_model_seconds'] or 0:.2f} model seconds per task. "
                  "Full table: `cost_ledger.parquet` (group by task_id)."]
    lines += ["", "## Datasets", ""] + [f"- {k}: `{v}`" for k, v in summary["datasets"].items()]
    return "\n".join(lines)
