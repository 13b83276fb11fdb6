"""What an evaluation reports: summary.json, the counts stage.json keeps, the results table (the `eval-results`
table artifact), the plot (pass@1 per benchmark and domain with its interval), the dataset card and the markdown.

    summarize(params, policy, table, skipped, ...)        summary.json (with the --training tables' overlap)
    counts(summary)                                       the figures stage.json keeps
    rows_dicts(table, ks)                                 the `eval-results` table artifact
    markdown(summary, ks)                                 the `eval-summary` artifact: the table with intervals
    plots(table)                                          eval_pass_at_1
    card(summary, folder)                                 the content of data/README.md (one config per benchmark)
"""

from __future__ import annotations

from evolforge import __version__
from evolforge.storage import eval_sets as store
from evolforge.storage.ledger import read_ledger
from evolforge.tasks.core.reporting import cost_summary, markdown_table
from evolforge.tasks.eval.stage import EvalParams
from evolforge.tasks.report.card import as_yaml, card_cost, card_models
from evolforge.tasks.report.plots import COLORS, empty_plot, plt, png

CARD_KEYS = ("benchmarks", "samples", "k", "temperature", "top_p", "max_new_tokens", "limit", "seed", "math_file",
             "math_template", "humaneval_template")


def summarize(params: EvalParams, policy: str, table: list[dict], skipped: dict, settings,
              overlap: list[dict] | None = None) -> dict:
    return {"training_overlap": overlap or [], "policy": policy, "policy_kind": "local folder" if params.policy else "endpoint model",
            "inputs": {"tasks": params.tasks, "evolve_out": params.evolve_out},
            "benchmarks_run": sorted({r["benchmark"] for r in table}), "not_run": skipped, "table": table,
            "settings": {k: settings.eval.model_dump(mode="json").get(k) for k in CARD_KEYS}}


def counts(summary: dict) -> dict:
    return {f"{r['benchmark']}/{r['domain']}": {"problems": r["problems"], "pass@1": r.get("pass@1")}
            for r in summary["table"]}


def rows(table: list[dict], ks: list[int]) -> list[list]:
    out = []
    for r in table:
        cells = [r["benchmark"], r["domain"], r["problems"], r["samples_per_problem"]]
        for k in ks:
            v, ci = r.get(f"pass@{k}"), r.get(f"pass@{k}_ci95")
            cells.append("-" if v is None else f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]")
        out.append(cells)
    return out


def rows_dicts(table: list[dict], ks: list[int]) -> list[dict]:
    """The table as flat rows (the `eval-results` table artifact)."""
    out = []
    for r in table:
        row = {"benchmark": r["benchmark"], "domain": r["domain"], "problems": r["problems"],
               "samples_per_problem": r["samples_per_problem"]}
        for k in ks:
            ci = r.get(f"pass@{k}_ci95") or [None, None]
            row.update({f"pass@{k}": r.get(f"pass@{k}"), f"pass@{k}_ci95_low": ci[0], f"pass@{k}_ci95_high": ci[1]})
        out.append(row)
    return out


def markdown(summary: dict, ks: list[int]) -> str:
    lines = [f"# Evaluation of `{summary['policy']}` ({summary['policy_kind']})", "",
             "pass@k by the unbiased estimator (Chen et al. 2021), Wilson 95% interval over problems in brackets.", ""]
    lines += markdown_table(["benchmark", "domain", "problems", "samples/problem", *(f"pass@{k}" for k in ks)],
                            rows(summary["table"], ks))
    if summary["training_overlap"]:
        lines += ["", "Training tables against the problems evaluated (word n-gram overlap; nothing dropped here):", ""]
        lines += markdown_table(["table", "folder", "rows", "overlapping", "by benchmark"],
                                [[r["table"], r["folder"], r["checked"], r["overlapping"],
                                  ", ".join(f"{k} {v}" for k, v in r["by_eval_set"].items()) or "-"]
                                 for r in summary["training_overlap"]])
    if summary["not_run"]:
        lines += ["", "Not run: " + "; ".join(f"{b} ({why})" for b, why in summary["not_run"].items()) + "."]
    return "\n".join(lines)


def plots(table: list[dict]) -> dict[str, bytes]:
    title = "pass@1 per benchmark (Wilson 95% interval)"
    pts = [r for r in table if r.get("pass@1") is not None]
    if not pts:
        return {"eval_pass_at_1": empty_plot(title, "no benchmark was evaluated")}
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(pts) + 2), 4))
    labels = [f"{r['benchmark']}\n{r['domain']} (n={r['problems']})" for r in pts]
    vals = [r["pass@1"] for r in pts]
    err = [[v - r["pass@1_ci95"][0] for v, r in zip(vals, pts)], [r["pass@1_ci95"][1] - v for v, r in zip(vals, pts)]]
    ax.bar(range(len(pts)), vals, yerr=err, capsize=5, color=[COLORS[i % 10] for i in range(len(pts))])
    ax.set_xticks(range(len(pts)), labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass@1")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    return {"eval_pass_at_1": png(fig)}


def card(summary: dict, folder: store.EvalFolder) -> dict:
    cost = cost_summary(read_ledger(folder.root))
    facts = {"stage": "eval", "evolforge_version": __version__, "run_id": summary.get("run_id"),
             "lineage": {"policy": summary["policy"], **summary["inputs"]},
             "generation": {"eval": summary["settings"]}, "models": card_models(cost), "cost": card_cost(cost),
             "results": summary["table"]}
    ks = summary["settings"]["k"]
    sections = {
        "Results": ["pass@k (unbiased estimator), Wilson 95% interval over problems:", "",
                    *markdown_table(["benchmark", "domain", "problems", "samples/problem",
                                     *(f"pass@{k}" for k in ks)], rows(summary["table"], ks))],
        "Settings": ["```yaml", *as_yaml(summary["settings"]).splitlines(), "```"],
    }
    return {"title": "evolforge evaluation results",
            "description": f"Every sample of the policy `{summary['policy']}` with its verdict, one config per "
                           "benchmark: code run against its tests in evolforge's sandbox, math by the final answer.",
            "sections": sections, "facts": facts}
