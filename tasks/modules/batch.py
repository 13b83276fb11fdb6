"""One batch of questions through the module graph, and the assembly of the finished sets.

`run_modules_batch` describes the batch for the batch runtime (tasks/core/batch.py: resume from the part,
journal replay, atomic part, error rows) and runs it: one Prefect task per batch (flows/modules.py), never
per question or module. `assemble` turns the parts into the items table, the PRM rows (prm_steps.parquet in the
reward stage's form) and the summary with the annotated Mermaid graph. `endpoint_models` names every model a
run calls (the flow's pre-flight probes each).
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean

from evolforge.config.settings import Settings
from evolforge.storage import module_sets as store
from evolforge.tasks.core.batch import BatchSpec, Progress, run_batch
from evolforge.tasks.modules.compare import single_shot_model
from evolforge.tasks.modules.report import mermaid, module_stats, summary_markdown
from evolforge.tasks.modules.run import error_item, judge_model, module_graph, module_models, solve_item, step_row


def modules_batch_spec(out_dir: str | Path, batch: int, settings: Settings) -> BatchSpec:
    layout = store.ModulesLayout(out_dir)
    questions = layout.questions
    return BatchSpec(
        name=f"mod{batch}", part=questions.part(batch), journal=questions.journal(batch), schema=store.ITEM_SCHEMA,
        load_rows=lambda: store.read_batch(layout, batch),
        work=lambda row, gw, journal: solve_item(row, gw, settings, journal),
        on_rejected=lambda row, err: error_item(row, err, settings), concurrency=settings.modules.concurrency)


def run_modules_batch(out_dir: str | Path, batch: int, settings: Settings, base_url: str, run_id: str,
                      progress: Progress | None = None) -> dict:
    return run_batch(modules_batch_spec(out_dir, batch, settings), settings, base_url, run_id, out_dir, progress)


def endpoint_models(settings: Settings) -> tuple[str, ...]:
    """The judge, every module's model, and with `compare` the single-shot model, sorted."""
    models = {judge_model(settings), *module_models(settings).values()}
    if settings.modules.compare:
        models.add(single_shot_model(settings))
    return tuple(sorted(models))


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(mean(values), 4) if values else None


def assemble(out_dir: str | Path, settings: Settings) -> dict:
    """Write the items table, prm_steps.parquet / prm_rejected.parquet and graph.md; return the summary's body."""
    cfg, graph = settings.modules, module_graph(settings)
    layout = store.ModulesLayout(out_dir)
    table = store.concat_parts(layout)
    store.write_items(table, layout)
    items = table.to_pylist()
    n_rows, n_rejected = store.write_prm_sets([step_row(it, cfg.margin) for it in items], layout)
    stats = module_stats(items, graph)
    by_status: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for it in items:
        by_status[it["status"]] = by_status.get(it["status"], 0) + 1
        if it["status"] != "ok":
            key = " ".join(str(it["reason"]).split()[:6])
            reasons[key] = reasons.get(key, 0) + 1
    modules = [m for it in items for m in it["modules"] or []]
    judged = [it for it in items if it["judge_calls"]]
    ratios = [it["forward_s"] / it["chain_s"] for it in items if it.get("chain_s")]
    summary = {
        "items": len(items), "by_status": by_status,
        "reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
        "aggregation": cfg.aggregation, "ablation": cfg.ablation, "judge_model": judge_model(settings),
        "margin": cfg.margin, "graph_source": cfg.graph_source or "config",
        "graph": {"modules": list(graph.order), "exit": graph.exit, "chain_length": graph.chain_length,
                  "recompute_calls_per_item": graph.recompute_calls},
        "module_outputs": {"total": len(modules), "valid": sum(1 for m in modules if m["status"] == "ok"),
                           "valid_share": round(sum(1 for m in modules if m["status"] == "ok") / len(modules), 4)
                           if modules else None,
                           "reasked": sum(1 for m in modules if m["reasks"]),
                           "truncated_then_asked_again": sum(1 for m in modules if m["truncations"])},
        "calls": {"module": sum(it["module_calls"] or 0 for it in items),
                  "judge": sum(it["judge_calls"] or 0 for it in items),
                  "judge_per_judged_item": _mean([it["judge_calls"] for it in judged])},
        "timing": {"mean_wall_s": _mean([it["wall_s"] for it in items]),
                   "mean_forward_s": _mean([it["forward_s"] for it in items]),
                   "mean_chain_s": _mean([it["chain_s"] for it in items]),
                   "mean_levels_s": _mean([it["levels_s"] for it in items]),
                   "mean_forward_over_chain": _mean(ratios)},
        "prm": {"rows": n_rows, "not_labelled": n_rejected,
                "steps": sum(len([m for m in it["modules"] or [] if m["contribution"] is not None])
                             for it in items if it["status"] == "ok")},
        "local_reward": {"weight": cfg.local_reward_weight, "outputs": len(modules),
                         "mean": _mean([m.get("local_reward") for m in modules]),
                         "own_checked": sum(1 for m in modules if (m.get("local_parts") or {}).get("own") is not None),
                         "own_failed": sum(1 for m in modules if (m.get("local_parts") or {}).get("own") == 0.0),
                         "zero_with_positive_contribution": sum(1 for m in modules if m.get("local_reward") == 0.0
                                                                and (m["contribution"] or 0) > 0)},
        "modules": stats,
        "mermaid": mermaid(graph, stats),
    }
    store.write_graph_markdown(summary_markdown(summary), layout)
    return summary
