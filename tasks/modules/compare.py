"""The comparison (`modules.compare`, `evolforge modules --compare`): single-shot against the module graph.

Every question of a batch is also answered single-shot (one call to `modules.single_shot_model`, the `answer`
stage's model by default, with the plain "answer step by step" prompt of tasks/modules/prompts.py), and both
answers are scored by the same judge (`modules.judge_model`, the module graph's contribution judge, with the same
judge prompt). Judge calls per question: 1 for the single-shot answer, plus 1 for the graph's answer only when
the graph has an answer but no judge_full score of its own (a judge reply without a score); the graph's own
judge_full is reused otherwise. So at most 1 single-shot call and 2 judge calls per question.

Outcome per question (storage/module_sets.COMPARE_SCHEMA): graph (graph score > single-shot score), single_shot,
tie (equal scores, counted apart), or not compared (a judge reply without a score, or no answer on either side).
A side without an answer (the graph's exit module failed, the endpoint rejected the call) loses to a scored
answer. Win rate = graph wins / n, n = the compared questions (graph wins + single-shot wins + ties); reported
overall and by difficulty (storage/module_sets.difficulty_of: the input's `difficulty`, else the evolve
`generation` 0 / 1 / >= 2 -> easy / medium / hard, else unknown).

It runs on the batch runtime after the batch's module graph (same Prefect task, one per batch): its own part
(compare/batch_NNNNN.parquet) and journal (journal/compare_NNNNN.jsonl), so a rerun sends no call, and a
comparison added to a finished run costs only its own calls.
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import mean

from evolforge.config.sections.modules import resolve_model
from evolforge.config.settings import Settings
from evolforge.storage import module_sets as store
from evolforge.storage.journal import CallJournal
from evolforge.tasks.core.batch import BatchSpec, Progress, is_rejected_record, run_batch
from evolforge.tasks.core.gateway import Gateway, GatewayError
from evolforge.tasks.modules.prompts import single_shot_messages
from evolforge.tasks.modules.run import Item, judge, judge_model, module_graph

SINGLE_STAGE = "modules-single"  # ledger stage of the single-shot calls (the judge's: modules-judge)
TABLE_COLUMNS = ("difficulty", "n", "graph wins", "single-shot wins", "ties", "win rate")


def single_shot_model(settings: Settings) -> str:
    return resolve_model(settings.models, settings.modules.single_shot_model)


def compare_item(row: dict, graph_item: dict | None, gw: Gateway, settings: Settings,
                 journal: CallJournal | None = None) -> dict:
    """One question (`row`: id, question[, difficulty]) and its module-graph row -> its COMPARE_SCHEMA row."""
    cfg = settings.modules
    task = f"mod-{row['id']}"
    item = Item(gw, settings, module_graph(settings), journal, task, row["question"], time.perf_counter(), {},
                judge_model(settings))
    model = single_shot_model(settings)
    out = {"id": row["id"], "difficulty": row.get("difficulty") or "unknown",
           "graph_status": graph_item["status"] if graph_item else "missing", "single_status": "ok",
           "single_answer": None, "single_model": model, "graph_score": None, "single_score": None,
           "graph_score_reused": False, "winner": None, "reason": None, "single_calls": 1, "judge_calls": 0}
    reasons: list[str] = []

    # the single-shot answer and its score
    try:
        res = gw.chat(SINGLE_STAGE, single_shot_messages(row["question"]), task_id=f"{task}-single-shot",
                      purpose="single-shot", model=model, temperature=cfg.single_shot_temperature,
                      max_tokens=cfg.single_shot_max_tokens, journal=journal)
        out["single_answer"] = res.text
    except GatewayError as e:
        if not is_rejected_record(e):
            raise
        out["single_status"] = "error"
        reasons.append(f"single-shot: the endpoint rejected the call: {e}"[:300])
    if out["single_status"] == "ok" and not (out["single_answer"] or "").strip():
        out["single_status"] = "error"
        reasons.append("single-shot: empty reply")
    if out["single_status"] == "ok":
        out["judge_calls"] += 1
        out["single_score"], why = judge(item, out["single_answer"], "compare-judge-single")
        if why:
            out["single_status"] = "judge_failed"
            reasons.append(why)

    # the graph's score: its own judge_full, else one judge call when it has an answer
    graph_answered = bool(graph_item and graph_item["status"] in ("ok", "judge_failed") and graph_item["answer"])
    graph_unjudged = False
    if not graph_answered:
        why = (graph_item or {}).get("reason") or "no module-graph row"
        reasons.append(f"graph: no answer ({out['graph_status']}: {why})"[:300])
    elif graph_item["judge_full"] is not None:
        out.update(graph_score=float(graph_item["judge_full"]), graph_score_reused=True)
    else:
        out["judge_calls"] += 1
        out["graph_score"], why = judge(item, graph_item["answer"], "compare-judge-graph")
        if why:
            graph_unjudged = True
            reasons.append(why)

    g, s = out["graph_score"], out["single_score"]
    if graph_unjudged or out["single_status"] == "judge_failed":
        winner = None
    elif g is not None and s is not None:
        winner = "graph" if g > s else "single_shot" if s > g else "tie"
    else:
        winner = "graph" if g is not None else "single_shot" if s is not None else None
    out.update(winner=winner, status=winner or "not_compared", reason="; ".join(reasons)[:500] or None)
    return out


def rejected_row(row: dict, err: Exception, settings: Settings) -> dict:
    return {"id": row["id"], "difficulty": row.get("difficulty") or "unknown", "graph_status": None,
            "status": "not_compared", "single_status": "error", "single_answer": None,
            "single_model": single_shot_model(settings), "graph_score": None, "single_score": None,
            "graph_score_reused": False, "winner": None, "reason": str(err)[:500], "single_calls": 0,
            "judge_calls": 0}


def compare_batch_spec(out_dir: str | Path, batch: int, settings: Settings) -> BatchSpec:
    """The comparison of one batch; the batch's module-graph part must exist (run_modules_batch first)."""
    layout = store.ModulesLayout(out_dir)
    graph_rows: dict[str, dict] = {}

    def load_rows() -> list[dict]:
        graph_rows.update({r["id"]: r for r in store.read_part_rows(layout, batch)})
        return store.read_batch(layout, batch)

    return BatchSpec(
        name=f"cmp{batch}", part=layout.comparisons.part(batch), journal=layout.comparisons.journal(batch),
        schema=store.COMPARE_SCHEMA, load_rows=load_rows,
        work=lambda row, gw, journal: compare_item(row, graph_rows.get(row["id"]), gw, settings, journal),
        on_rejected=lambda row, err: rejected_row(row, err, settings), concurrency=settings.modules.concurrency)


def run_compare_batch(out_dir: str | Path, batch: int, settings: Settings, base_url: str, run_id: str,
                      progress: Progress | None = None) -> dict:
    return run_batch(compare_batch_spec(out_dir, batch, settings), settings, base_url, run_id, out_dir, progress)


# ------------------------------------------------------------------------------------------------ the report
def _order(level: str) -> tuple[int, str]:
    return (store.DIFFICULTIES.index(level), "") if level in store.DIFFICULTIES else (len(store.DIFFICULTIES), level)


def _group(rows: list[dict]) -> dict:
    compared = [r for r in rows if r["winner"] is not None]
    wins = {w: sum(1 for r in compared if r["winner"] == w) for w in ("graph", "single_shot", "tie")}
    n = len(compared)
    scores = [r for r in compared if r["graph_score"] is not None and r["single_score"] is not None]
    return {"items": len(rows), "n": n, "graph_wins": wins["graph"], "single_shot_wins": wins["single_shot"],
            "ties": wins["tie"], "not_compared": len(rows) - n,
            "win_rate": round(wins["graph"] / n, 4) if n else None,
            "mean_graph_score": round(mean(r["graph_score"] for r in scores), 4) if scores else None,
            "mean_single_score": round(mean(r["single_score"] for r in scores), 4) if scores else None}


def comparison_summary(rows: list[dict], settings: Settings) -> dict:
    """summary.json's `comparison` block: overall and per difficulty (easy, medium, hard, unknown, others)."""
    levels = sorted({r["difficulty"] or "unknown" for r in rows}, key=_order)
    return {"judge_model": judge_model(settings), "single_shot_model": single_shot_model(settings),
            "win_rate": "graph wins / n; n = compared questions (graph wins + single-shot wins + ties)",
            "difficulty_rule": "the input's `difficulty`, else evolve `generation` 0 / 1 / >= 2 -> easy / medium / "
                               "hard, else unknown",
            "overall": _group(rows),
            "by_difficulty": {lv: _group([r for r in rows if (r["difficulty"] or "unknown") == lv]) for lv in levels},
            "calls": {"single_shot": sum(r["single_calls"] or 0 for r in rows),
                      "judge": sum(r["judge_calls"] or 0 for r in rows),
                      "graph_scores_reused": sum(1 for r in rows if r["graph_score_reused"])}}


def comparison_table(comparison: dict) -> list[dict]:
    """The `modules-comparison` table: one row per difficulty, then `all`."""
    groups = [*comparison["by_difficulty"].items(), ("all", comparison["overall"])]
    return [dict(zip(TABLE_COLUMNS, (level, g["n"], g["graph_wins"], g["single_shot_wins"], g["ties"],
                                     g["win_rate"]))) for level, g in groups]


def assemble_comparison(out_dir: str | Path, settings: Settings) -> dict:
    """Write comparison.parquet; return summary.json's `comparison` block."""
    layout = store.ModulesLayout(out_dir)
    table = store.concat_compare_parts(layout)
    store.write_comparison(table, layout)
    return comparison_summary(table.to_pylist(), settings)
