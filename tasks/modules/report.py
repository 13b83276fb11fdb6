"""What a modules run reports: per-module statistics, the Mermaid graph, the summary figures, the plots, the
dataset card and the artifacts' tables. Plain functions; tasks/modules/batch.py `assemble` writes the statistics
and graph.md, flows/modules.py the rest (the comparison's figures: tasks/modules/compare.py).

    module_stats(items, graph)        one row per module: outcomes, re-asks, latency, contribution, local reward
                                      (mean, own checks failed, 0 despite a positive contribution; summary.json)
    mermaid(graph, stats)             the graph annotated with mean latency and mean contribution
    summary_markdown(summary)         graph.md and the `modules-graph` artifact
    batch_totals(batches)             summary.json `batches` (replayed calls of the comparison included)
    datasets(layout, compare)         summary.json `datasets`; card_tables(layout, compare): the card's tables
    status_rows(by_status)            the `modules-counts` artifact
    contributions_by_module(...)      every measured contribution per module (the contribution plot)
    plots(contributions, stats, by_stage)   module_contributions, module_schema_pass, cost_tokens_by_stage (PNG);
                                      run_plots(layout, summary): the same for a finished run
    card(summary, settings)           the dataset card's content (storage/cards.py writes it)
"""

from __future__ import annotations

from statistics import mean

from evolforge import __version__
from evolforge.config.settings import Settings
from evolforge.storage.fs import AnyPath
from evolforge.storage.module_sets import ModulesLayout, read_items
from evolforge.tasks.core.reporting import markdown_table
from evolforge.tasks.modules.graph import ModuleGraph
from evolforge.tasks.report.card import as_yaml, card_cost, card_models, common_sections
from evolforge.tasks.report.plots import COLORS, cost_and_tokens_by_stage, empty_plot, finite, integer_ticks, plt, png


def _reason_key(reason: str) -> str:
    return " ".join(str(reason).split()[:6])


def module_stats(items: list[dict], graph: ModuleGraph) -> list[dict]:
    """One row per module: runs, outcomes, re-asks, truncations, mean latency, mean contribution, how often it
    had the question's lowest contribution, and its failure reasons (grouped by their first words)."""
    lowest: dict[str, int] = {m: 0 for m in graph.order}
    for it in items:
        contrib = {m["id"]: m["contribution"] for m in it["modules"] or [] if m["contribution"] is not None}
        if it["status"] == "ok" and contrib:
            low = min(contrib.values())
            at = [m for m, c in contrib.items() if c == low]
            if len(at) == 1:
                lowest[at[0]] = lowest.get(at[0], 0) + 1
    rows = []
    for m, spec in graph.specs.items():
        recs = [r for it in items for r in it["modules"] or [] if r["id"] == m]
        contributions = [r["contribution"] for r in recs if r["contribution"] is not None]
        local = [r.get("local_reward") for r in recs if r.get("local_reward") is not None]
        own = [(r.get("local_parts") or {}).get("own") for r in recs]
        reasons: dict[str, int] = {}
        for r in recs:
            if r["status"] != "ok":
                key = _reason_key(r["reason"])
                reasons[key] = reasons.get(key, 0) + 1
        by_status = {s: sum(1 for r in recs if r["status"] == s) for s in ("ok", "invalid", "truncated", "error")}
        rows.append({
            "id": m, "output_type": spec.output, "dependencies": list(spec.dependencies), "exit": m == graph.exit,
            "runs": len(recs), **by_status,
            "valid_share": round(by_status["ok"] / len(recs), 4) if recs else None,
            "reasks": sum(r["reasks"] for r in recs), "truncations": sum(r["truncations"] for r in recs),
            "calls": sum(r["calls"] for r in recs),
            "mean_latency_s": round(mean(r["latency_s"] for r in recs), 4) if recs else None,
            "mean_contribution": round(mean(contributions), 4) if contributions else None,
            "mean_local_reward": round(mean(local), 4) if local else None,
            "own_checked": sum(1 for o in own if o is not None), "own_failed": sum(1 for o in own if o == 0.0),
            "local_zero_positive_contribution": sum(1 for r in recs if r.get("local_reward") == 0.0
                                                    and (r["contribution"] or 0) > 0),
            "lowest_contribution_items": lowest.get(m, 0) if m != graph.exit else None,
            "failure_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:5]),
        })
    return rows


def mermaid(graph: ModuleGraph, stats: list[dict]) -> str:
    """The module graph as Mermaid, each module annotated with its mean latency and mean contribution."""
    by_id = {s["id"]: s for s in stats}
    lines = ["flowchart TD"]
    for m, spec in graph.specs.items():
        s = by_id.get(m) or {}
        lat = f"{s['mean_latency_s']:.3f} s" if s.get("mean_latency_s") is not None else "n/a"
        if m == graph.exit:
            label = f"{m} · {spec.output} · exit<br/>latency {lat}"
            lines.append(f'    {m}(["{label}"])')
        else:
            c = s.get("mean_contribution")
            label = f"{m} · {spec.output}<br/>latency {lat}<br/>contribution {c:+.2f}" if c is not None \
                else f"{m} · {spec.output}<br/>latency {lat}<br/>contribution n/a"
            lines.append(f'    {m}["{label}"]')
    for m in graph.order:
        for d in graph.deps(m):
            lines.append(f"    {d} --> {m}")
    return "\n".join(lines)


def summary_markdown(summary: dict) -> str:
    """The run's markdown: the annotated graph, the per-module table, the counts."""
    out = ["# Module-DAG reasoning (DeCoRL)", "",
           f"{summary['items']} questions: " + ", ".join(f"{k} {v}" for k, v in summary["by_status"].items())
           + f"; {summary['prm']['rows']} PRM rows; aggregation {summary['aggregation']}, ablation "
           f"{summary['ablation']}, judge {summary['judge_model']}.", "",
           "```mermaid", summary["mermaid"], "```", ""]
    rows = [[s["id"], s["output_type"], ", ".join(s["dependencies"]) or "-", s["runs"], s["valid_share"],
             s["reasks"], s["truncations"], s["mean_latency_s"], s["mean_contribution"],
             s["lowest_contribution_items"], s.get("mean_local_reward"),
             f"{s.get('own_failed', 0)}/{s.get('own_checked', 0)}", s.get("local_zero_positive_contribution")]
            for s in summary["modules"]]
    out += markdown_table(["module", "output", "depends on", "runs", "valid", "re-asks", "truncations",
                           "mean latency s", "mean contribution", "lowest in items", "mean local reward",
                           "own check failed", "local 0, contribution > 0"], rows)
    lr = summary.get("local_reward")
    if lr:
        out += ["", f"Local reward (weight {lr['weight']} on the own check): mean {lr['mean']} over {lr['outputs']} "
                f"module outputs; {lr['zero_with_positive_contribution']} got 0 despite a positive contribution."]
    t = summary["timing"]
    out += ["", f"Mean per question: wall {t['mean_wall_s']} s, module graph {t['mean_forward_s']} s, longest "
            f"dependency chain {t['mean_chain_s']} s, level-by-level sum {t['mean_levels_s']} s."]
    return "\n".join(out) + "\n"


def contributions_by_module(items: list[dict], order: list[str], exit_module: str) -> dict[str, list[float]]:
    """Every measured contribution reward per module (dependency order, the exit module left out: it has none)."""
    out: dict[str, list[float]] = {m: [] for m in order if m != exit_module}
    for it in items:
        for m in it["modules"] or []:
            if m["contribution"] is not None and m["id"] in out:
                out[m["id"]].append(float(m["contribution"]))
    return out


def describe(settings: Settings) -> str:
    """The run's graph and options, for the log line after the endpoint's pre-flight."""
    cfg = settings.modules
    return (f"{len(cfg.graph)} modules, exit {cfg.exit_module.id}, aggregation {cfg.aggregation}, "
            f"ablation {cfg.ablation}")


def batch_totals(batches: list[dict]) -> dict:
    """summary.json `batches`: total, skipped (finished by an earlier run) and replayed calls, the comparison's
    (`compare`, run in the same batch task) included."""
    return {"total": len(batches), "skipped": sum(1 for b in batches if b["skipped"]),
            "replayed_calls": sum(b.get("replayed_calls", 0) + b.get("compare", {}).get("replayed_calls", 0)
                                  for b in batches)}


def datasets(layout: ModulesLayout, compare: bool) -> dict[str, str]:
    """summary.json `datasets`: where the run's tables and graph.md are."""
    out = {"items": str(layout.items), "prm_steps": str(layout.prm_steps), "prm_rejected": str(layout.prm_rejected),
           "graph": str(layout.graph_md)}
    return {**out, "comparison": str(layout.comparison)} if compare else out


def card_tables(layout: ModulesLayout, compare: bool) -> dict[str, AnyPath]:
    """The card's configs: items, prm_steps, prm_rejected, and comparison when it ran."""
    tables = {"items": layout.items, "prm_steps": layout.prm_steps, "prm_rejected": layout.prm_rejected}
    return {**tables, "comparison": layout.comparison} if compare else tables


def status_rows(by_status: dict[str, int]) -> list[dict]:
    """The `modules-counts` table: questions by status."""
    return [{"status": k, "questions": v} for k, v in by_status.items()]


def done_line(summary: dict) -> str:
    return (f"{summary['items']} questions ({', '.join(f'{k} {v}' for k, v in summary['by_status'].items())}), "
            f"{summary['prm']['rows']} PRM rows")


def comparison_line(comparison: dict) -> str:
    o = comparison["overall"]
    return (f"graph wins {o['graph_wins']}, single-shot wins {o['single_shot_wins']}, ties {o['ties']} of {o['n']} "
            f"(win rate {o['win_rate']})")


# ------------------------------------------------------------------------------------------------- the plots
def module_contributions(contributions: dict[str, list[float]]) -> bytes:
    """Per module (dependency order), its contribution rewards (judge score of the full answer minus the score
    without the module, 0-10 judge points): one histogram per module on a shared axis."""
    title = "Per-module contribution rewards (judge points: full - without the module)"
    mods = [m for m, v in contributions.items()]
    if not mods or not any(finite(v) for v in contributions.values()):
        return empty_plot(title, "no contribution was measured (no judged question)")
    cols = min(3, len(mods))
    rows = -(-len(mods) // cols)
    allv = [v for vs in contributions.values() for v in finite(vs)]
    lo, hi = min(min(allv), -1.0), max(max(allv), 1.0)
    fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols + 0.6, 2.4 * rows + 0.9), squeeze=False, sharex=True)
    for k, m in enumerate(mods):
        ax = axes[k // cols][k % cols]
        vals = finite(contributions[m])
        ax.axvline(0, color="gray", lw=0.8, ls=":")
        if vals:
            ax.hist(vals, bins=20, range=(lo, hi), color=COLORS[k % 10], edgecolor="white")
            mean_ = sum(vals) / len(vals)
            ax.axvline(mean_, color="black", lw=1.2, ls="--")
            ax.set_title(f"{m[:28]} (n={len(vals)}, mean {mean_:+.2f})", fontsize=9)
        else:
            ax.text(0.5, 0.5, "no contribution", ha="center", va="center", transform=ax.transAxes, color="gray")
            ax.set_title(f"{m[:28]} (n=0)", fontsize=9)
        integer_ticks(ax.yaxis)
        ax.grid(axis="y", alpha=0.3)
    for k in range(len(mods), rows * cols):
        axes[k // cols][k % cols].set_axis_off()
    for c in range(min(cols, len(mods))):  # the x axis under the lowest drawn panel of each column
        last = axes[(len(mods) - 1 - c) // cols][c]
        last.tick_params(labelbottom=True)
        last.set_xlabel("contribution")
    fig.suptitle(title)
    return png(fig)


MODULE_OUTCOMES = (("ok", "valid (schema passed)"), ("invalid", "invalid"), ("truncated", "truncated"),
                   ("error", "endpoint error"))


def module_schema_pass(stats: list[dict]) -> bytes:
    """Per module: share of runs whose output passed its JSON schema (ok) vs invalid / truncated / error, with the
    schema re-asks it took (`module_stats` rows)."""
    title = "Module outputs: schema pass rate"
    rows = [s for s in stats if s.get("runs")]
    if not rows:
        return empty_plot(title, "no module ran")
    rows = rows[::-1]  # dependency order, top to bottom
    names = [str(s["id"])[:28] for s in rows]
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.42 * len(rows)))
    left = [0.0] * len(rows)
    for k, (key, label) in enumerate(MODULE_OUTCOMES):
        vals = [(s.get(key) or 0) / s["runs"] for s in rows]
        ax.barh(names, vals, left=left, color=("tab:green", "tab:orange", "tab:purple", "tab:red")[k], label=label)
        left = [a + b for a, b in zip(left, vals)]
    for y, s in enumerate(rows):
        ax.text(1.01, y, f"{s.get('ok') or 0}/{s['runs']}, {s.get('reasks') or 0} re-asks", va="center", fontsize=8)
    ax.set_xlim(0, 1.35)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xlabel("share of runs")
    ax.set_title(title, pad=22)
    ax.legend(fontsize=8, ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return png(fig)


def plots(contributions: dict[str, list[float]], stats: list[dict], by_stage: list[dict]) -> dict[str, bytes]:
    """module_contributions, module_schema_pass and cost_tokens_by_stage of a modules run."""
    return {"module_contributions": module_contributions(contributions), "module_schema_pass": module_schema_pass(stats),
            "cost_tokens_by_stage": cost_and_tokens_by_stage(by_stage)}


def run_plots(layout: ModulesLayout, summary: dict) -> dict[str, bytes]:
    """`plots` of a finished run: the contributions from its items table, the per-module rows and the cost by
    stage from its summary."""
    items = read_items(layout.items).to_dicts()
    graph = summary["graph"]
    return plots(contributions_by_module(items, graph["modules"], graph["exit"]), summary["modules"],
                 summary["cost"].get("by_stage", []))


# -------------------------------------------------------------------------------------------------- the card
def card(summary: dict, settings: dict) -> dict:
    """The card of a module-DAG (DeCoRL) folder: items, PRM steps, and the single-shot comparison when run
    (summary.json, the settings fingerprint)."""
    mods = settings.get("modules", {})
    facts = {"stage": "modules", "evolforge_version": __version__, "run_id": summary["run_id"],
             "lineage": {"input": summary.get("input"), "items": summary.get("items"),
                         "by_status": summary.get("by_status"), "prm_rows": (summary.get("prm") or {}).get("rows"),
                         "comparison": (summary.get("comparison") or {}).get("overall")},
             "generation": {"modules": mods, "models": settings.get("models", {})},
             "models": card_models(summary["cost"]), "cost": card_cost(summary["cost"])}
    graph = ["| module | output | depends on |", "|---|---|---|"] + [
        f"| {m.get('id')}{' (exit)' if m.get('exit') else ''} | {m.get('output')} | "
        f"{', '.join(m.get('dependencies') or []) or '-'} |" for m in mods.get("graph", [])]
    sections = {
        "Lineage": [f"{summary.get('items')} questions from `{summary.get('input')}` answered by a graph of "
                    f"{len(mods.get('graph', []))} modules along their dependencies (aggregation "
                    f"`{mods.get('aggregation')}`, ablation `{mods.get('ablation')}`); a judge scored the answer "
                    "with and without each module, so each module step carries its contribution and PRM label. "
                    "By status: " + ", ".join(f"{k} {v}" for k, v in (summary.get("by_status") or {}).items()) + ".",
                    "", *graph],
        "Generation settings": ["```yaml", *as_yaml({k: v for k, v in mods.items() if k != "graph"}).splitlines(),
                                "```"],
        **common_sections(facts),
    }
    return {"title": "evolforge module-DAG reasoning",
            "description": "Module-DAG reasoning data (DeCoRL) made by evolforge: `items` (each question's module "
                           "outputs, final answer and per-module contributions), `prm_steps` (TRL stepwise "
                           "supervision: prompt, completions, labels), `prm_rejected` (items that gave no PRM row, "
                           "with the reason), `comparison` (graph vs single-shot answer, same judge; only with "
                           "compare).",
            "sections": sections, "facts": facts, "default": "items"}
