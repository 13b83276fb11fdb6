"""What a synthesis run reports: cost per task, the summary figures, the plots, the dataset card and the
markdown summary. Plain functions over the tasks table and the ledger (polars); flows/synthesize.py writes them.

    cost_per_task(ledger, tasks)  one row per task: calls, tokens and USD per phase, wall and sandbox seconds
    summarize(tasks, costs)       yield, rejections, USD and minutes per kept task (summary.json)
    plots(tasks, by_stage)        task_difficulty, cost_tokens_by_stage (PNG bytes)
    card(summary, settings, cost) the dataset card's content (storage/cards.py writes it)
    markdown(summary, run_id)     the `synthesis-summary` artifact
"""

from __future__ import annotations

import polars as pl

from evolforge import __version__
from evolforge.storage.ledger import known_sum
from evolforge.tasks.core.reporting import usd
from evolforge.tasks.report.card import as_yaml, card_cost, card_models, common_sections
from evolforge.tasks.report.plots import COLORS, cost_and_tokens_by_stage, empty_plot, plt, png

# ledger stage -> cost phase: the proposal, and the validator's repairs and final check (`validate`; folders written
# before the validator charged them to `repair` and `solver`)
PHASES = {"synthesize": "proposal", "validate": "validate", "repair": "validate", "solver": "validate"}
DIFFICULTIES = ("easy", "medium", "hard")


def cost_per_task(ledger: pl.DataFrame, tasks: pl.DataFrame) -> pl.DataFrame:
    """One row per task: calls, tokens and USD per phase (proposal; validate: the repairs and the final solver
    check), the repairs made, wall and sandbox seconds."""
    led = ledger.with_columns(pl.col("stage").replace(PHASES).alias("phase"))
    per = led.group_by("task_id", "phase").agg(
        pl.len().alias("calls"), (pl.col("prompt_tokens").fill_null(0) + pl.col("completion_tokens").fill_null(0)).sum().alias("tokens"),
        known_sum("cost_usd").alias("usd"))
    wide = tasks.select("task_id", "kind", "status", "reject_reason", "difficulty", "repairs", "wall_seconds",
                        "sandbox_seconds")
    for ph in ("proposal", "validate"):
        part = per.filter(pl.col("phase") == ph).select(
            "task_id", pl.col("calls").alias(f"{ph}_calls"), pl.col("tokens").alias(f"{ph}_tokens"),
            pl.col("usd").alias(f"{ph}_usd"))
        wide = wide.join(part, on="task_id", how="left")
    totals = led.group_by("task_id").agg(pl.len().alias("calls"), known_sum("cost_usd").alias("usd"),
                                         pl.col("cost_usd").is_null().sum().alias("unpriced_calls"))
    out = wide.join(totals, on="task_id", how="left")
    # a task without calls cost nothing; a task with an unpriced call has an unknown cost (null), never 0
    no_calls = pl.col("calls").is_null()
    return out.with_columns(
        *[pl.when(no_calls).then(0).otherwise(pl.col(c).fill_null(0)).alias(c)
          for c in out.columns if c.endswith(("_calls", "_tokens")) or c in ("calls", "unpriced_calls")],
        *[pl.when(no_calls | pl.col(c.replace("_usd", "_calls")).is_null()).then(0.0).otherwise(pl.col(c)).alias(c)
          for c in out.columns if c.endswith("_usd")],
        pl.when(no_calls).then(0.0).otherwise(pl.col("usd")).alias("usd"),
    ).sort("task_id")


def summarize(table: pl.DataFrame, costs: pl.DataFrame, models: dict | None = None) -> dict:
    """Yield, kinds, difficulties, rejections, repairs, what a kept task cost (USD, minutes, sandbox seconds, USD
    by phase) and `models`: which model proposed and which validated (tasks/synthesis/synthesize.py roles)."""
    kept = costs.filter(pl.col("status") == "kept")
    reasons = table.filter(pl.col("status") != "kept").group_by("reject_reason").len().sort("len", descending=True)
    n = table.height
    return {
        "proposed": n, "kept": kept.height, "yield": round(kept.height / n, 4) if n else 0.0,
        **({"models": models} if models else {}),
        "repairs_per_task": {"mean": _f(costs["repairs"].mean()) if n else None,
                             "kept_mean": _f(kept["repairs"].mean()) if kept.height else None,
                             "total": int(costs["repairs"].sum()) if n else 0},
        "by_kind": table.group_by("kind", "status").len().to_dicts(),
        "by_difficulty": kept.group_by("difficulty").len().to_dicts() if kept.height else [],
        "rejections": {r["reject_reason"]: r["len"] for r in reasons.to_dicts()},
        "total_usd": _known(costs["usd"], costs["usd"].sum()), "unpriced_calls": int(costs["unpriced_calls"].sum()),
        "usd_per_kept_task": {"mean": _known(kept["usd"], kept["usd"].mean()),
                              "median": _known(kept["usd"], kept["usd"].median())},
        "minutes_per_kept_task": {"mean": _f(kept["wall_seconds"].mean(), 60), "median": _f(kept["wall_seconds"].median(), 60)},
        "sandbox_seconds": float(costs["sandbox_seconds"].sum()),
        # all model calls and sandbox time, divided over the kept tasks (what a kept task really costs)
        "usd_per_kept_task_all_in": _known(costs["usd"], costs["usd"].sum() / kept.height) if kept.height else None,
        # every task's calls by phase (ledger stage synthesize -> proposal, validate -> validate), per task
        "usd_per_task_by_phase": {ph: _known(costs[f"{ph}_usd"], costs[f"{ph}_usd"].mean()) if n else None
                                  for ph in ("proposal", "validate")},
    }


def _known(values: pl.Series, stat) -> float | None:
    """A cost statistic, or None (unknown) when any task in it has an unpriced call."""
    return None if values.null_count() else _f(stat)


def _f(v, div: float = 1.0):
    return None if v is None else round(float(v) / div, 6)


def task_difficulty(tasks: list[dict]) -> bytes:
    """Kept synthesized tasks by difficulty (solver pass rate: easy > 2/3, hard < 1/3), one bar group per kind."""
    title = "Difficulty of synthesized tasks (kept)"
    kept = [t for t in tasks if t.get("status") == "kept"]
    if not kept:
        return empty_plot(title, f"no kept tasks ({len(tasks)} proposed)")
    kinds = sorted({t.get("kind") or "?" for t in kept})
    levels = list(DIFFICULTIES) + sorted({t.get("difficulty") or "unknown" for t in kept} - set(DIFFICULTIES))
    width = 0.8 / len(kinds)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for k, kind in enumerate(kinds):
        n = [sum(1 for t in kept if (t.get("kind") or "?") == kind and (t.get("difficulty") or "unknown") == lv)
             for lv in levels]
        bars = ax.bar([i - 0.4 + width * (k + 0.5) for i in range(len(levels))], n, width=width * 0.95,
                      color=COLORS[k % 10], label=kind)
        ax.bar_label(bars, fontsize=8, padding=2)
    ax.set_xticks(range(len(levels)), levels)
    ax.set_ylabel("tasks")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.set_title(f"{title}: {len(kept)} of {len(tasks)} proposed", pad=22)
    ax.legend(fontsize=8, ncols=len(kinds), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return png(fig)


def plots(tasks: list[dict], by_stage: list[dict]) -> dict[str, bytes]:
    """task_difficulty (every proposed task's kind, status, difficulty) and cost_tokens_by_stage."""
    return {"task_difficulty": task_difficulty(tasks), "cost_tokens_by_stage": cost_and_tokens_by_stage(by_stage)}


def card(summary: dict, settings: dict, cost: dict) -> dict:
    """The dataset card's content of a synthesis folder (summary.json, the settings fingerprint, the cost)."""
    syn = {k: settings.get(k, {}) for k in ("synthesis", "sandbox")}
    facts = {"stage": "synthesize", "evolforge_version": __version__, "run_id": summary["run_id"],
             "lineage": {"proposed": summary["proposed"], "kept": summary["kept"], "yield": summary["yield"],
                         "rejections": summary["rejections"]},
             "generation": {"synthesis": syn["synthesis"], "models": settings.get("models", {})},
             "models": card_models(cost), "cost": card_cost(cost)}
    if summary.get("models"):
        facts["validation"] = summary["models"]
    sections = {
        "Lineage": [f"{summary['kept']} tasks kept of {summary['proposed']} proposed from the seed instructions "
                    f"(yield {summary['yield']:.0%}); each proposal was checked by running its tests in the sandbox, "
                    "repaired when they failed, and rated by solver attempts (difficulty from the pass rate). "
                    "Rejections: " + (", ".join(f"{k}: {v}" for k, v in summary["rejections"].items()) or "none") + "."],
        **({"Proposer and validator": [_who(summary["models"])]} if summary.get("models") else {}),
        **({"No task kept": [
            "No task was kept, so there is no `tasks` config and no `train` split (`datasets` cannot load a table "
            "of 0 rows). `load_dataset(\"parquet\", data_dir=...)` loads the rejected tasks as split `rejected` "
            "(`data/rejected-00000-of-00001.parquet`), each with its `reject_reason`; the card's default config is "
            "`rejected`."]} if not summary["kept"] else {}),
        "Generation settings": ["```yaml", *as_yaml(syn["synthesis"]).splitlines(), "```"],
        **common_sections(facts),
    }
    return {"title": "evolforge synthesized tasks",
            "description": "Verified Python tasks (statement, entry point, reference solution, tests) and math "
                           "problems (answer) synthesized by evolforge. `tasks` are the kept tasks; `rejected` the "
                           "rest with the reason; `cost_per_task` the calls, tokens and USD each task took.",
            "sections": sections, "facts": facts, "default": "tasks"}


def _who(models: dict) -> str:
    line = (f"Proposed by `{models['proposer']}`; repaired and validated by `{models['validator']}`; the final "
            f"solver check by `{models['solver']}`.")
    return line + (" The proposer validated its own tasks (no independent validator was set)."
                   if models.get("same_model") else "")


def markdown(summary: dict, run_id: str) -> str:
    """The `synthesis-summary` artifact: yield, cost and minutes per kept task, rejections."""
    return "\n".join([
        f"# Task synthesis `{run_id}`", "",
        f"Yield: {summary['kept']} kept / {summary['proposed']} proposed ({summary['yield']:.0%})", "",
        *([_who(summary["models"]), ""] if summary.get("models") else []),
        f"Per kept task: mean {usd(summary['usd_per_kept_task']['mean'])}, median "
        f"{usd(summary['usd_per_kept_task']['median'])}; mean {summary['minutes_per_kept_task']['mean'] or 0:.2f} min",
        f"Sandbox seconds: {summary['sandbox_seconds']:.1f}; unpriced calls: {summary['unpriced_calls']}", "",
        "## Rejections", ""] + [f"- {k}: {v}" for k, v in summary["rejections"].items()])
