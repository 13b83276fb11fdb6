"""One evaluation, as plain functions the flow calls in this order.

    problems(params, settings)                 benchmark -> its problems, and benchmark -> why it was not run
    generate(bench, problems, policy, ...)     the policy's completions (generations/<bench>.parquet, once)
    check(bench, problems, generations, ...)   each sample's verdict: code in evolforge's sandbox (run_many), math by
                                               the final answer (data/<bench>.parquet)
    metrics(folder, benchmarks, cfg)           the table of every finished benchmark (tasks/eval/scoring.py)
"""

from __future__ import annotations

from evolforge.config.settings import Settings
from evolforge.storage import eval_sets as store
from evolforge.storage.synthesis_sets import read_kept_tasks
from evolforge.tasks.core.progress import StepProgress
from evolforge.tasks.eval import prompts, scoring
from evolforge.tasks.eval.stage import EvalParams, inputs
from evolforge.tasks.problems import benchmarks as B
from evolforge.tasks.sandbox.run import run_many


def problems(params: EvalParams, settings: Settings) -> tuple[dict[str, list[B.Problem]], dict[str, str]]:
    """The problems of each benchmark of eval.benchmarks, and the reason for each one that cannot run."""
    cfg, paths = settings.eval, inputs(params)
    tasks = read_kept_tasks(paths["tasks"]) if paths["tasks"] else []
    evolved = store.read_rows(paths["evolved"]) if paths["evolved"] else None
    own = B.own_problems(tasks, B.held_out_seeds(evolved or [], tasks, settings.ppo)) if tasks else []
    found, skipped = {}, {}
    for bench in cfg.benchmarks:
        loaded = B.load(bench, cfg, own)
        if loaded:
            found[bench] = loaded
        elif bench == "own" or (bench == "math" and not cfg.math_file):
            skipped[bench] = ("no held-out verified tasks: pass --tasks (a synthesis run) and --evolve-out" if not tasks
                              else "the held-out seed lineages hold no verified task of this kind")
        else:
            skipped[bench] = "no problems"
    return found, skipped


def generate(bench: str, items: list[B.Problem], policy, cfg, folder: store.EvalFolder) -> list[dict]:
    """The completions of `items` (kept from an earlier run over the folder)."""
    done = store.read_rows(folder.generations(bench))
    if done is not None:
        return done
    ps = [prompts.prompt_for(p, cfg, policy.chat_only) for p in items]
    progress = StepProgress(f"generate {bench}", len(items), "problems")
    kw = {"ids": [f"{bench}/{p.id}" for p in items]} if policy.chat_only else {}
    outs = policy.generate(ps, cfg.samples, on_batch=lambda k: progress.update(advance=k), **kw)
    progress.finish()
    rows = [{"benchmark": bench, "problem_id": p.id, "domain": p.domain, "template": pr["template"],
             "prompt": pr.get("raw") or pr["chat"][-1]["content"], "samples": o} for p, pr, o in zip(items, ps, outs)]
    store.write_generations(rows, folder.generations(bench))
    return rows


def check(bench: str, items: list[B.Problem], generations: list[dict], settings: Settings,
          folder: store.EvalFolder) -> list[dict]:
    """One row per sample with its verdict; code runs in the sandbox, math compares final answers."""
    by_id = {p.id: p for p in items}
    rows, jobs = [], []
    for g in generations:
        p = by_id[g["problem_id"]]
        for s, completion in enumerate(g["samples"]):
            row = {"benchmark": bench, "problem_id": p.id, "domain": p.domain, "sample": s, "completion": completion}
            if p.domain == "code":
                jobs.append((len(rows), prompts.sandbox_job(p, completion, g["template"])))
                row.update(passed=False, detail=None)
            else:
                ok = prompts.math_correct(p, completion)
                row.update(passed=ok, detail=f"expected {p.check['answer']}")
            rows.append(row)
    if jobs:
        results = run_many([job for _, job in jobs], settings.sandbox)
        for (i, _), res in zip(jobs, results):
            rows[i]["passed"] = bool(res.passed)
            rows[i]["detail"] = None if res.passed else (res.killed_reason or res.verdict_error or
                                                          (res.stderr or "").strip()[-300:] or "failed")
    store.write_results(rows, folder.results(bench))
    return rows


def metrics(folder: store.EvalFolder, benchmarks: list[str], ks: list[int]) -> list[dict]:
    results = [r for b in benchmarks for r in (store.read_rows(folder.results(b)) or [])]
    return scoring.table(results, ks)
