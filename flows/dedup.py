"""Dedup flow: any jsonl, parquet or csv with a text field -> kept set + dropped set with reasons.

input -> exact, MinHash + LSH and embedding dedup (tasks/dedup/pipeline.py `dedup_file`; with `index`, also
against a persistent index, which it then extends, so a dataset can be deduplicated incrementally) ->
OUT/kept.<fmt>, OUT/dropped.<fmt> (with dedup_duplicate_of, dedup_method, dedup_similarity, ...), summary.json
(counts, per-method counts and timings) and the `dedup-summary` table artifact. Parameters and check:
tasks/dedup/stage.py; files: storage/dedup_sets.py; the figures: tasks/dedup/report.py. The same methods run
inside every evolution round (tasks/evolve/dedup_round.py).

With `dedup.shards` = 1 the dedup is one `dedup-file` task. With more, the flow drives it and runs the MinHash
band shards and the embedding search shards as `dedup-shard` tasks (one per shard) on the `[runner]` task
runner, so a Dask or Ray cluster spreads them over its workers (tasks/dedup/shard_tasks.py); the shards
exchange .npy files through `dedup.shard_dir` (storage/dedup_shards.py). Same settings, same kept and dropped
records as in one process.
"""

from __future__ import annotations

import time

from prefect import flow, task

from evolforge.flows._runners import build_task_runner
from evolforge.flows._stage import finish_stage, stage_run
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.dedup import report
from evolforge.tasks.dedup.distributed import remove_work, run_step, work_bytes, work_files, work_for
from evolforge.tasks.dedup.graph import node_ranges
from evolforge.tasks.dedup.pipeline import dedup_file
from evolforge.tasks.dedup.shard_tasks import SubmittedShards, run_shard_files
from evolforge.tasks.dedup.stage import DedupParams

__all__ = ["DedupParams", "dedup_flow"]


@task(name="dedup-file")
def dedup_file_task(input: str, text_field: str, out_dir: str, id_field: str | None, index: str | None,
                    settings_json: str) -> dict:
    return dedup_file(input, text_field, out_dir, settings_from_json(settings_json).dedup, id_field=id_field,
                      index_dir=index)


@task(name="dedup-shard")
def dedup_shard_task(kind: str, inputs: dict[str, str], job: dict, settings_json: str, out_dir: str) -> dict:
    return run_shard_files(kind, inputs, job, settings_from_json(settings_json).dedup, out_dir)


@task(name="dedup-step", retries=2, retry_delay_seconds=1)
def dedup_step_task(step: str, work: str, args: list[dict], settings_json: str) -> list[dict]:
    """One step for one or more shards, one after the other (at most `dedup.step_tasks` tasks per step)."""
    s = settings_from_json(settings_json).dedup
    return [run_step(step, work, a, s) for a in args]


def on_workers(runner, p: DedupParams, settings, settings_json: str, logger) -> dict:
    """The dedup as steps on the workers (tasks/dedup/distributed.py): this process submits the steps in order and
    keeps their records (counts and paths), never a record's text, key, sketch or vector."""
    s = settings.dedup
    work = work_for(p.input, p.out, s)
    records: list[dict] = []
    tasks = [0]   # Prefect tasks submitted
    started = time.perf_counter()

    def steps(step: str, args: list[dict]) -> list[dict]:
        n = min(len(args), s.step_tasks)
        chunks = [args[len(args) * i // n: len(args) * (i + 1) // n] for i in range(n)]
        futures = [runner.submit(dedup_step_task.with_options(task_run_name="dedup-" + "-".join(
            [step] + [str(c[0][k]) for k in ("phase", "round") if k in c[0]]
            + ([f"{c[0]['shard']}" + (f"..{c[-1]['shard']}" if len(c) > 1 else "")] if "shard" in c[0] else []))),
            parameters={"step": step, "work": work.location, "args": c, "settings_json": settings_json})
            for c in chunks]
        out = [r for f in futures for r in f.result()]
        records.extend(out)
        tasks[0] += len(futures)
        return out

    def collect(phase: str, prev: str | None, senders: list[str]) -> list[int]:
        got = steps("collect", [{"shard": k, "phase": phase, "bounds": bounds, "prev": prev, "senders": senders}
                                for k in range(S)])
        stats[f"dropped_{phase}"] = sum(r["dropped"] for r in got)
        return [r["alive"] for r in got]

    def components(phase: str, parts: list[dict], n_nodes: int) -> int:
        """Rounds of hook + apply until no label moves, then every edge routed to its group shard."""
        ranges, r = [list(x) for x in node_ranges(n_nodes, S)], 0
        while True:
            moved = steps("hook", [{"phase": phase, "round": r, "shard": e, "part": part, "ranges": ranges}
                                   for e, part in enumerate(parts)])
            if not sum(m["proposals"] for m in moved):
                break
            steps("apply", [{"phase": phase, "round": r, "shard": k, "parts": len(parts), "ranges": ranges}
                            for k in range(len(ranges))])
            r += 1
        steps("route", [{"phase": phase, "round": r, "shard": e, "part": part, "ranges": ranges, "groups": S}
                        for e, part in enumerate(parts)])
        stats[f"{phase}_component_rounds"] = r + 1
        return len(parts)

    split = steps("split", [{"input": str(p.input), "text_field": p.text_field, "id_field": p.id_field}])[0]
    bounds, S = split["bounds"], len(split["bounds"])
    stats = {"records": split["n"], "indexed_before": 0, "dropped_exact": 0}
    steps("prep", [{"shard": k, "bounds": bounds} for k in range(S)])
    if s.exact:
        steps("exact", [{"shard": b, "bounds": bounds} for b in range(S)])
    counts = collect("exact", None, [f"exact/bucket-{b:05d}" for b in range(S)] if s.exact else [])
    drop_steps, alive_step = ["exact"], "exact"
    if s.minhash:
        mh_plan = steps("minhash", [{"bounds": bounds}])[0]
        parts = steps("bands", [{"shard": i, "inputs": mh_plan["inputs"], "job": job}
                                for i, job in enumerate(mh_plan["jobs"])])
        n_parts = components("minhash", [r["paths"] for r in parts], mh_plan["records"])
        grouped = steps("minhash-group", [{"shard": g, "bounds": bounds, "parts": n_parts, "n_nodes": mh_plan["records"],
                                           "counts": counts, "inputs": mh_plan["inputs"]} for g in range(S)])
        stats.update(minhash_candidates=sum(r["candidates"] for r in parts),
                     minhash_verified_pairs=sum(r["pairs"] for r in grouped))
        counts = collect("minhash", "exact", [f"minhash-group/shard-{g:05d}" for g in range(S)])
        drop_steps.append("minhash")
        alive_step = "minhash"
    if s.embedding:
        enc = steps("embed", [{"shard": k, "bounds": bounds, "alive_step": alive_step} for k in range(S)])
        plan = steps("embedding", [{"bounds": bounds, "dim": enc[0]["dim"]}])[0]
        parts = plan.get("parts") or [r["paths"] for r in steps("ann", [
            {"shard": i, "inputs": plan["inputs"], "job": job} for i, job in enumerate(plan["jobs"])])]
        L = plan["records"]
        n_parts = components("embedding", parts, L)
        steps("embedding-uncertain", [{"shard": g, "parts": n_parts, "n_nodes": L} for g in range(S)])
        confirmed = steps("confirm", [{"bounds": bounds, "groups": S, "n_nodes": L, "alive_step": alive_step,
                                       "counts": counts}])[0]
        grouped = steps("embedding-group", [{"shard": g, "bounds": bounds, "parts": n_parts, "n_nodes": L,
                                             "alive_step": alive_step, "counts": counts, "inputs": plan["inputs"]}
                                            for g in range(S)])
        for key in ("embedding_candidates", "embedding_static_accepted", "embedding_uncertain",
                    "embedding_number_guarded"):
            stats[key] = sum(r[key] for r in grouped)
        stats.update(embedding_confirm_checked=confirmed["embedding_confirm_checked"],
                     embedding_confirmed=confirmed["embedding_confirmed"])
        counts = collect("embedding", alive_step, [f"embedding-group/shard-{g:05d}" for g in range(S)])
        drop_steps.append("embedding")
        alive_step = "embedding"
    stats.update(worker_stats(records, work, started), prefect_tasks=tasks[0] + 1)
    out = steps("write", [{"input": str(p.input), "text_field": p.text_field, "id_field": p.id_field,
                           "out_dir": str(p.out), "drop_steps": drop_steps, "alive_step": alive_step,
                           "stats": stats}])[0]
    remove_work(work)
    logger.info("%d records in %d shards on %s: %d steps in %d tasks, %d reused", split["n"], S,
                settings.runner.kind, len(records), stats["prefect_tasks"], len(stats["steps_reused"]))
    return out["summary"]


def worker_stats(records: list[dict], work, started: float) -> dict:
    """summary.json `stats` entries from the step records: seconds, CPU, peak memory per step and worker."""
    workers: dict[str, float] = {}
    for r in records:
        workers[str(r["pid"])] = max(workers.get(str(r["pid"]), 0.0), r["peak_rss_mb"])
    return {"seconds": {r["step"]: round(r["seconds"], 3) for r in records}, "shard_workers": workers,
            "steps": len(records) + 1, "steps_reused": [r["step"] for r in records if r.get("reused")],
            "step_attempts": {r["step"]: r.get("attempts") or [r["pid"]] for r in records},
            "work_dir": work.location, "work_files": work_files(work),
            "worker_cpu_seconds": round(sum(r.get("cpu_seconds", 0.0) for r in records), 3),
            "work_bytes": work_bytes(work), "steps_wall_seconds": round(time.perf_counter() - started, 3),
            "step_cost": {r["step"]: {"seconds": round(r["seconds"], 3), "cpu_seconds": round(r["cpu_seconds"], 3),
                                      "peak_rss_mb": round(r["peak_rss_mb"], 1)} for r in records if "cpu_seconds" in r}}


@flow(name="dedup", log_prints=True)
def dedup_flow(params: DedupParams) -> dict:
    with stage_run("dedup", params) as run:
        settings, p = run.settings, params
        if settings.dedup.shards == 1:
            summary = dedup_file_task(p.input, p.text_field, p.out, p.id_field, p.index, run.settings_json)
        elif not p.index:
            with build_task_runner(settings.runner) as runner:
                summary = on_workers(runner, p, settings, run.settings_json, run.logger)
        else:
            with build_task_runner(settings.runner) as runner:
                shards = SubmittedShards(lambda name, parameters: runner.submit(
                    dedup_shard_task.with_options(task_run_name=name), parameters=parameters),
                    settings, type(runner).__name__)
                summary = dedup_file(p.input, p.text_field, p.out, settings.dedup, id_field=p.id_field,
                                     index_dir=p.index, shard_runner=shards)
            summary["stats"].update(shards.stats())
            run.logger.info("%d shards on %s: %d worker processes", settings.dedup.shards, settings.runner.kind,
                            len(shards.workers))
        run.logger.info("kept %d, dropped %d -> %s", summary["kept"], summary["dropped"], p.out)
        summary = report.plain(summary)
        return finish_stage(run, summary, cost=False, counts=report.counts(summary),
                            tables={"dedup-summary": (report.removed_by_method(summary), f"Dedup of {p.input}")})
