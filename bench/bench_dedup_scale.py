"""Dedup scale-out, side by side in one run: one process vs the dedup flow on a local Dask cluster of 1 and 2 workers.

    flock /tmp/evolforge-bench.lock .venv/bin/python bench/bench_dedup_scale.py --n 1000000 --shards 2

On n records of testing/near_dup_corpus.py (seed 0, written once to a parquet file), each configuration runs in
its own fresh process (so peak RSS is its own):
  one-process   dedup_file() with dedup.shards = S, the shards one after the other in this process
  dask-1        the dedup flow, dedup.shards = S, runner.kind = dask, 1 worker process (one thread)
  dask-2        the same with 2 worker processes
records/s = n / (exact + MinHash + embedding seconds of the dedup call), so the Prefect server start and the Dask
cluster start (reported apart, as wall seconds) are not counted; peak RSS of the driver process and of every
worker process (ru_maxrss, read by each shard task at its end). The kept ids of all three must be identical.
Per-record costs for the 10M plan: CPU seconds and driver / worker bytes per record. Writes
bench/results/dedup_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _child(a) -> None:
    """One configuration in this fresh process; prints one JSON line."""
    from evolforge.config.sections.dedup import DedupSettings
    from evolforge.tasks.dedup.pipeline import _encoder

    dedup = {"shards": a.shards}
    s = DedupSettings(**dedup)
    _encoder("static", s)
    _encoder("full", s).encode(["warm up"])   # models loaded before the clock starts, as in bench_dedup.py
    out = Path(a.workdir) / a.config
    t0 = time.perf_counter()
    c0 = time.process_time()
    if a.config == "one-process":
        from evolforge.tasks.dedup.pipeline import dedup_file

        summary = dedup_file(a.input, "text", out, s, id_field="id")
    else:
        from evolforge.flows.dedup import DedupParams, dedup_flow

        workers = int(a.config.split("-")[1])
        summary = dedup_flow(DedupParams(input=a.input, text_field="text", id_field="id", out=str(out),
                                         overrides={"dedup": dedup, "runner": {"kind": "dask", "max_workers": workers}}))
    wall = time.perf_counter() - t0
    st = summary["stats"]
    sec = st["seconds"]
    dedup_s = sum(sec.get(k, 0.0) for k in ("exact", "minhash", "embedding"))
    print(json.dumps({"config": a.config, "records": st["records"], "kept": summary["kept"], "wall_seconds": wall,
                      "dedup_seconds": dedup_s, "records_per_s": st["records"] / dedup_s, "seconds": sec,
                      "driver_cpu_seconds": time.process_time() - c0,
                      "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "worker_peak_rss_mb": st.get("shard_workers", {}), "shard_seconds": st.get("shard_seconds", {}),
                      "minhash_candidates": st.get("minhash_candidates"), "kept_path": summary["kept_path"]}))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--configs", default="one-process,dask-1,dask-2")
    ap.add_argument("--out", default=str(HERE / "results" / "dedup_scale.json"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--config", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--input", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a)
        return {}
    import polars as pl

    from evolforge.testing.near_dup_corpus import make_corpus

    res = {"n": a.n, "shards": a.shards, "cpus": os.cpu_count(), "load_avg_start": os.getloadavg()}
    work = Path(tempfile.mkdtemp(prefix="evolforge-bench-dedup-scale-"))
    t = time.perf_counter()
    c = make_corpus(a.n, seed=0)
    inp = work / "corpus.parquet"
    pl.DataFrame({"id": [f"r{i}" for i in range(a.n)], "text": c.texts}).write_parquet(inp)
    res["corpus_seconds"] = time.perf_counter() - t
    del c
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    env.pop("PREFECT_API_URL", None)
    runs = {}
    for config in a.configs.split(","):
        cmd = [sys.executable, __file__, "--child", "1", "--config", config, "--input", str(inp), "--workdir", str(work),
               "--shards", str(a.shards)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode:
            raise SystemExit(f"{config} failed:\n{p.stderr[-4000:]}")
        runs[config] = json.loads(p.stdout.strip().splitlines()[-1])
        print(config, json.dumps({k: runs[config][k] for k in ("records_per_s", "dedup_seconds", "wall_seconds",
                                                               "driver_peak_rss_mb", "worker_peak_rss_mb")}), flush=True)
    kept = {k: pl.read_parquet(r["kept_path"])["id"].to_list() for k, r in runs.items()}
    first = next(iter(kept.values()))
    res["same_kept_ids"] = all(v == first for v in kept.values())
    res["runs"] = runs
    res["load_avg_end"] = os.getloadavg()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1, default=float))
    print(json.dumps({"same_kept_ids": res["same_kept_ids"], "load_avg_start": res["load_avg_start"],
                      "load_avg_end": res["load_avg_end"]}))
    return res


if __name__ == "__main__":
    main()
