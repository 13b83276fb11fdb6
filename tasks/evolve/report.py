"""What an evolve run reports: each round's cost and table artifact rows, the summary's rounds, the markdown
summary, the dataset card's content and the plots. Plain functions over the round tables (storage/rounds.py
round_table) and the ledger (polars); flows/evolve.py writes them.

    RoundCosts(out)                  USD of each round, from the ledger rows new since the round before
    CostTally                        USD per task, summed incrementally from ledger rows as they arrive
    round_summary(table)             a round as summary.json lists it
    round_rows(table, cost_usd)      the `evolve-round-N` table artifact
    markdown(summary)                the `evolve-summary` artifact
    card(summary, settings)          the dataset card's content (dataset/README.md, storage/cards.py writes it)
    plots(summary)                   survival_by_operation, eliminations_by_rule, cost_tokens_by_stage (PNG bytes)

matplotlib loads when the first plot is drawn (at the end of a run), not when the flow is imported.
"""

from __future__ import annotations

from collections import defaultdict

import polars as pl

from evolforge import __version__
from evolforge.storage import rounds as round_store
from evolforge.storage.fs import AnyPath
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import LedgerTail
from evolforge.tasks.core.reporting import markdown_table, usd
from evolforge.tasks.evolve.elimination import rule_words
from evolforge.tasks.report.card import as_yaml, card_cost, card_models, common_sections

ROUND_KEYS = ("round", "attempts", "accepted", "eliminated", "errors", "survival", "by_rule", "by_operation", "calls",
              "prompt_tokens", "completion_tokens", "cost_usd")


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


class RoundCosts:
    """The cost of each round of the run at `out`, priced from the ledger rows new since the last round only
    (storage/ledger.py LedgerTail), summed per task over every round so far."""

    def __init__(self, out: str | AnyPath):
        self.layout, self.tail, self.tally = RunLayout(out), LedgerTail(out), CostTally()

    def of_round(self, round_no: int) -> float | None:
        """USD of the round's records (None: unknown, a call without a price)."""
        ids = round_store.round_lineage(self.layout, round_no).select("id").collect()["id"]
        return self.tally.add(self.tail.new_rows()).cost_of(ids)


LOW_SURVIVAL = 0.25  # under this share of accepted attempts, the run's reports say why and what to do


def rules_in_words(by_rule: dict) -> str:
    """Eliminations of a round in plain words, most frequent first: '19 copied the ...; 10 no more demanding ...'."""
    items = sorted(by_rule.items(), key=lambda kv: (-kv[1], kv[0] or ""))
    return "; ".join(f"{n} {rule_words(rule or '(no rule)')}" for rule, n in items) or "none"


def survival_note(summary: dict) -> str | None:
    """A note when few attempts survived, naming the main reason and, on the embedded model, the way out."""
    rounds = summary.get("rounds") or []
    errors = sum(r.get("errors") or 0 for r in rounds)
    attempts = sum(r["attempts"] for r in rounds) - errors
    accepted = sum(r["accepted"] for r in rounds)
    failed = (f"{errors} attempt(s) ended in an error, not an elimination (the `error` column of lineage.parquet); "
              "`evolforge retry --out DIR` redoes them." if errors else "")
    if not attempts or accepted / attempts >= LOW_SURVIVAL:
        return failed or None
    by_rule: dict[str, int] = defaultdict(int)
    for r in rounds:
        for rule, n in (r.get("by_rule") or {}).items():
            by_rule[rule] += n
    main = max(by_rule.items(), key=lambda kv: kv[1])[0] if by_rule else None
    text = (f"only {accepted} of {attempts} rewrites judged survived ({accepted / attempts:.0%})"
            + (f"; most were eliminated because the rewrite {rule_words(main)}" if main else "") + ".")
    if str(summary.get("endpoint", "")).startswith("embedded"):
        text += (" This is expected of the embedded 135M model, which proves the pipeline end to end but often "
                 "fails to rewrite; point the gateway at a real model (--base-url or [gateway] base_url) for data "
                 "worth training on.")
    return f"{failed} {text}" if failed else text


def round_summary(table: dict) -> dict:
    """A round as summary.json's `rounds` lists it (a round table with its cost_usd)."""
    return {k: table[k] for k in ROUND_KEYS}


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
        rows.append({"round": table["round"], "operation": f"eliminated: {rule_words(rule)}", "direction": "",
                     "attempts": n,
                     "accepted": "", "survival": "", "prompt_tokens": "", "completion_tokens": "", "cost_usd": ""})
    return rows


def markdown(summary: dict) -> str:
    """The `evolve-summary` artifact: rounds, cost per stage and per task, datasets (and the rounds note)."""
    lines = [f"# evolforge run `{summary['run_id']}`", "",
             f"Output folder: `{summary['out_dir']}`  ", f"Endpoint: `{summary['endpoint']}`", "",
             "## Rounds", ""]
    lines += markdown_table(
        ["round", "attempts", "accepted", "eliminated", "errors", "survival", "eliminated because the rewrite"],
        [[r["round"], r["attempts"], r["accepted"], r["eliminated"], r["errors"], f"{r['survival']:.1%}",
          rules_in_words(r["by_rule"])] for r in summary["rounds"]])
    if note := survival_note(summary):
        lines += ["", f"**Survival:** {note}"]
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
    text = "\n".join(lines)
    return text + (f"\n\n**Note:** {summary['rounds_note']}" if summary.get("rounds_note") else "")


def card(summary: dict, settings: dict) -> dict:
    """The card of an evolve run's dataset/ folder (summary.json and the run's settings fingerprint)."""
    evo = settings.get("evol_instruct", {})
    facts = {
        "stage": "evolve", "evolforge_version": __version__, "run_id": summary["run_id"],
        "lineage": {"seeds": str(summary.get("seeds")), "rounds": summary.get("rounds_in_datasets"),
                    "counts": summary.get("counts")},
        "generation": {"evol_instruct": evo, "models": settings.get("models", {})},
        "models": card_models(summary["cost"]), "cost": card_cost(summary["cost"]),
    }
    rounds = ["| round | attempts | accepted | survival | eliminated because the rewrite |", "|---|---|---|---|---|"] + [
        f"| {r['round']} | {r['attempts']} | {r['accepted']} | {r['survival']:.1%} | {rules_in_words(r['by_rule'])} |"
        for r in summary["rounds"]]
    if note := survival_note(summary):
        rounds += ["", f"Survival: {note}"]
    sections = {
        "Lineage": [f"Seeds: `{summary.get('seeds')}`, evolved over {len(summary['rounds'])} Evol-Instruct round(s) "
                    "(in-depth and in-breadth operations, each attempt judged and eliminated by rule). Every record "
                    "keeps `parent_id`, `seed_id`, `round`, `operation` and `direction`; the `lineage` config holds "
                    "every attempt, eliminated ones with their `elimination_rule`.", "", *rounds],
        "Generation settings": ["```yaml", *as_yaml(evo).splitlines(), "```"],
        **common_sections(facts),
    }
    return {"title": "evolforge evolved instructions",
            "description": "Instructions evolved from seed instructions with Evol-Instruct by evolforge, with answers. "
                           "`sft` is the SFT view (TRL SFTTrainer `messages`: user instruction, assistant answer); "
                           "`evolved` the seeds and accepted evolutions; `lineage` every attempt; `final_pool` what "
                           "the next round would evolve.",
            "sections": sections, "facts": facts, "default": "sft"}


# ----------------------------------------------------------------- plots (matplotlib loads on the first one)

def _label(row: dict) -> str:
    op, direction = row.get("operation") or "?", row.get("direction")
    return f"{op} ({direction})" if direction else op


BAR_INCHES = 0.2        # height per bar of the survival plot: its count (7 pt) fits beside it, with room between
GROUP_GAP = 0.7         # space between two operations' groups, in bars
COUNT_POINTS = 7        # the counts' font size; drawn only when a bar's pitch is at least 1.3 times it
MAX_PLOT_INCHES = 40.0  # the figure stops growing here (about 170 bars): beyond it bars are thinner


def survival_figure(rounds: list[dict]):
    """The survival plot as a matplotlib Figure (None: no attempts): one horizontal bar per operation and round,
    grouped by operation, labelled by its operation (and round), its `accepted/attempts` beside it. The figure
    grows with the bars (BAR_INCHES each, up to MAX_PLOT_INCHES), so labels and counts never overlap at 60 or
    600 bars; counts are drawn only when a bar's pitch holds them."""
    from evolforge.tasks.report.plots import COLORS, plt

    cells = {(_label(r), t["round"]): r for t in rounds for r in t.get("by_operation", [])}
    if not cells:
        return None
    ops = sorted({op for op, _ in cells})
    round_nos = sorted({r for _, r in cells})
    several = len(round_nos) > 1
    bars: list[tuple[float, str, int, dict]] = []  # (y, label, round's index, row), top to bottom
    y = 0.0
    for op in ops:
        for k, rno in enumerate(round_nos):
            row = cells.get((op, rno))
            if row is not None:
                bars.append((y, f"{op} \u00b7 round {rno}" if several else op, k, row))
                y += 1.0
        y += GROUP_GAP
    span = y - GROUP_GAP  # in bars, gaps included
    margins = 1.5 + (0.35 if several and len(round_nos) <= 10 else 0.0)  # title, x axis (and the legend)
    height = min(MAX_PLOT_INCHES, margins + BAR_INCHES * span)
    pitch_points = (height - margins) / max(span, 1.0) * 72
    fig, ax = plt.subplots(figsize=(8.0, height))
    ys = [b[0] for b in bars]
    ax.barh(ys, [float(b[3]["survival"] or 0.0) for b in bars], height=0.8,
            color=[COLORS[b[2] % 10] for b in bars])
    if pitch_points >= 1.3 * COUNT_POINTS:
        for yy, _, _, row in bars:
            ax.text(float(row["survival"] or 0.0) + 0.01, yy, f"{row['accepted']}/{row['attempts']}",
                    va="center", ha="left", fontsize=COUNT_POINTS)
    ax.set_yticks(ys, [b[1] for b in bars], fontsize=min(8.0, max(3.0, pitch_points / 1.3)))
    ax.set_ylim(span - 0.5, -0.5)  # the first operation on top
    ax.set_xlim(0, 1.18)  # room for a count beside a full bar
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xlabel("accepted / attempts")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("Survival by operation and round", pad=22 if several and len(round_nos) <= 10 else 6)
    if several and len(round_nos) <= 10:  # more rounds repeat the colours: each bar's label names its round
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=COLORS[k], label=f"round {rno}") for k, rno in enumerate(round_nos)],
                  fontsize=8, ncols=min(6, len(round_nos)), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                  frameon=False)
    return fig


def survival_by_operation(rounds: list[dict]) -> bytes:
    """Share of attempts accepted, per evolution operation and round, with counts (survival_figure) as PNG."""
    from evolforge.tasks.report.plots import empty_plot, png

    fig = survival_figure(rounds)
    return empty_plot("Survival by operation and round", "no evolution attempts") if fig is None else png(fig)


def _wrap(text: str, width: int = 34) -> str:
    """A rule's words on lines of about `width` characters (a bar label)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def eliminations_by_rule(rounds: list[dict]) -> bytes:
    """Attempts eliminated per rule, stacked by round (horizontal bars: rule names stay readable)."""
    from evolforge.tasks.report.plots import COLORS, empty_plot, plt, png

    title = "Eliminations by rule"
    counts: dict[str, dict[int, int]] = defaultdict(dict)
    for t in rounds:
        for rule, n in (t.get("by_rule") or {}).items():
            counts[_wrap(rule_words(rule or "(no rule)"))][t["round"]] = n
    if not counts:
        return empty_plot(title, "nothing was eliminated")
    rules = sorted(counts, key=lambda r: sum(counts[r].values()))
    round_nos = sorted({r for c in counts.values() for r in c})
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.6 * len(rules)))
    left = [0] * len(rules)
    for k, rno in enumerate(round_nos):
        vals = [counts[rule].get(rno, 0) for rule in rules]
        ax.barh(rules, vals, left=left, color=COLORS[k % 10], label=f"round {rno}")
        left = [a + b for a, b in zip(left, vals)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total}", va="center", fontsize=8)
    ax.set_xlim(0, max(left) * 1.15 + 1)
    ax.set_xlabel("eliminated attempts")
    ax.set_title(title, pad=22)
    ax.legend(fontsize=8, ncols=min(6, len(round_nos)), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return png(fig)


def plots(summary: dict) -> dict[str, bytes]:
    """survival_by_operation, eliminations_by_rule, cost_tokens_by_stage from an evolve run's summary.json."""
    from evolforge.tasks.report.plots import cost_and_tokens_by_stage

    return {"survival_by_operation": survival_by_operation(summary["rounds"]),
            "eliminations_by_rule": eliminations_by_rule(summary["rounds"]),
            "cost_tokens_by_stage": cost_and_tokens_by_stage(summary["cost"].get("by_stage", []))}
