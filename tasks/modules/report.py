"""Per-module statistics of a modules run and its Mermaid graph (summary.json, graph.md, the markdown artifact)."""

from __future__ import annotations

from statistics import mean

from evolforge.tasks.core.reporting import markdown_table
from evolforge.tasks.modules.graph import ModuleGraph


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
             s["lowest_contribution_items"]] for s in summary["modules"]]
    out += markdown_table(["module", "output", "depends on", "runs", "valid", "re-asks", "truncations",
                           "mean latency s", "mean contribution", "lowest in items"], rows)
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
