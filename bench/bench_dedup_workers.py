"""Dedup on the workers at scale: driver memory and CPU against records, records/s with 1 and 2 workers, a 10M plan.

    flock /tmp/evolforge-bench.lock .venv/bin/python bench/bench_dedup_workers.py \
        --runs 100000:dask-2,1000000:dask-2,1000000:dask-1,100000:ray-2 --shards 4 [--prefect-server]

A run is records:runner-workers[:shards[:s3]] (default shards: --shards): the 100M shard-count simulation is e.g.
`--runs 51200:dask-2:256,204800:dask-2:256` (256 shards at 200 and 800 records each: the driver's memory and
the work folder's file count must not grow with the records); `:s3` puts the work folder on a local S3 API
(moto's server, testing/s3_server.py) instead of the local disk.

Runners: `dask-N` is the runner's default local cluster (distributed.LocalCluster: its scheduler runs inside the
flow's process); `daskext-N` a Dask cluster whose scheduler and N workers are processes of their own
(testing/dask_cluster.py), as past one machine; `ray-N` a local Ray cluster (`ray start --head`).
`--prefect-server` runs every flow against one standing Prefect server (`prefect server start`, as a deployment
does) instead of the temporary server each flow process otherwise starts and imports.

Each run (records:runner-workers) in its own fresh process, on testing/near_dup_corpus.py's corpus (seed 0,
written once per size to a parquet file): the dedup flow (tasks/dedup/plan.py: every per-record step a
Prefect task on the workers, files in the work folder) with `dedup.shards` = S on a local Dask cluster
(LocalCluster, N single-thread worker processes) or a local Ray cluster (`ray start --head --num-cpus N`).
Figures per run:
  driver peak RSS      VmHWM of the flow's process (Dask's scheduler runs in it too; not ru_maxrss, which a
                       child keeps from its parent over fork + exec: the parent here builds the corpus)
  driver CPU share     the flow process's CPU seconds over (that + every step's CPU seconds in its worker)
  records/s            records / the steps' wall seconds (split to the last grouping; the Prefect server and
                       cluster start are not in it), and the flow's whole wall seconds
  per-step costs       seconds, CPU seconds, worker peak RSS per step; the work folder's bytes, its files per
                       step folder, the number of steps (Prefect tasks) and of component rounds
plus the load average before and after each run. The kept ids of runs of one size must be identical.
Writes bench/results/dedup_workers.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _child(a) -> None:
    from evolforge.flows.dedup import DedupParams, dedup_flow
    from evolforge.tasks.dedup.distributed import peak_rss_mb  # VmHWM: ru_maxrss keeps the parent's peak over exec

    kind, workers = a.config.split("-")
    runner: dict = {"kind": "dask" if kind == "daskext" else kind, "max_workers": int(workers)}
    out = Path(a.workdir) / f"{a.n}-{a.config}-{a.shards}-{a.store}"
    dedup: dict = {"shards": a.shards}
    if a.store == "s3":
        dedup["shard_dir"] = "s3://evolforge/dedup-work"
    c0, t0 = time.process_time(), time.perf_counter()

    def run():
        return dedup_flow(DedupParams(input=a.input, text_field="text", id_field="id", out=str(out),
                                      overrides={"dedup": dedup, "runner": runner}))

    if kind == "daskext":
        from evolforge.testing.dask_cluster import local_dask_cluster

        with local_dask_cluster(workers=int(workers)) as address:
            runner["address"] = address
            c0, t0 = time.process_time(), time.perf_counter()
            summary = run()
    elif kind == "ray":
        from evolforge.testing.ray_cluster import local_ray_cluster

        with local_ray_cluster(num_cpus=int(workers), object_store_memory=200_000_000) as cluster:
            runner["address"] = cluster.gcs_address
            c0, t0 = time.process_time(), time.perf_counter()
            summary = run()
    else:
        summary = run()
    wall, driver_cpu = time.perf_counter() - t0, time.process_time() - c0
    st = summary["stats"]
    worker_cpu = st["worker_cpu_seconds"]
    print(json.dumps({
        "config": a.config, "records": st["records"], "kept": summary["kept"], "dropped": summary["dropped"],
        "flow_wall_seconds": wall, "steps_wall_seconds": st["steps_wall_seconds"],
        "records_per_s": st["records"] / st["steps_wall_seconds"],
        "driver_cpu_seconds": driver_cpu, "worker_cpu_seconds": worker_cpu,
        "driver_cpu_share": driver_cpu / (driver_cpu + worker_cpu),
        "driver_peak_rss_mb": peak_rss_mb(),
        "worker_peak_rss_mb": st["shard_workers"], "work_bytes": st["work_bytes"], "step_cost": st["step_cost"],
        "steps": st["steps"], "prefect_tasks": st["prefect_tasks"], "work_files": st["work_files"], "work_files_total": sum(st["work_files"].values()),
        "component_rounds": {k: v for k, v in st.items() if k.endswith("_component_rounds")},
        "dropped_by": {m: st.get(f"dropped_{m}") for m in ("exact", "minhash", "embedding")},
        "kept_path": summary["kept_path"]}))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="100000:dask-2,1000000:dask-2,1000000:dask-1,100000:ray-2")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--out", default=str(HERE / "results" / "dedup_workers.json"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--config", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--input", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--store", default="local", help=argparse.SUPPRESS)
    ap.add_argument("--prefect-server", action="store_true", help="one standing Prefect server for every run")
    a = ap.parse_args(argv)
    if a.child:
        _child(a)
        return {}
    import polars as pl

    work = Path(tempfile.mkdtemp(prefix="evolforge-bench-dedup-workers-"))
    res: dict = {"shards": a.shards, "cpus": os.cpu_count(), "runs": []}
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_LOGGING_LEVEL": "WARNING", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    env.pop("PREFECT_API_URL", None)
    with contextlib.ExitStack() as stack:
        if a.prefect_server:
            from evolforge.testing.prefect_server import prefect_server

            (work / "server-home").mkdir()
            server_env, api = stack.enter_context(prefect_server(work / "server-home"))
            env["PREFECT_API_URL"] = api
        if any(spec.endswith(":s3") for spec in a.runs.split(",")):
            from evolforge.testing.s3_server import CREDENTIALS, moto_s3

            endpoint = stack.enter_context(moto_s3("evolforge"))
            env.update(CREDENTIALS, FSSPEC_S3=json.dumps({"endpoint_url": endpoint,
                                                          "client_kwargs": {"region_name": "us-east-1"}}))
        _runs(a, work, env, res)
    by_n: dict[str, list] = {}
    for r in res["runs"]:
        by_n.setdefault(f'{r["n"]}x{r["shards"]}', []).append(pl.read_parquet(r["kept_path"])["id"].to_list())
    res["same_kept_ids_per_size"] = {str(n): all(k == v[0] for k in v) for n, v in by_n.items()}
    res["prefect_server"] = "standing" if a.prefect_server else "temporary, per flow process"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1, default=float))
    print(json.dumps({"same_kept_ids_per_size": res["same_kept_ids_per_size"]}))
    return res


def _runs(a, work: Path, env: dict, res: dict) -> None:
    import polars as pl

    from evolforge.testing.near_dup_corpus import make_corpus

    inputs: dict[int, Path] = {}
    for spec in a.runs.split(","):
        n_s, config, *rest = spec.split(":")
        store = "s3" if rest and rest[-1] == "s3" else "local"
        sh = [x for x in rest if x != "s3"]
        n, shards = int(n_s), int(sh[0]) if sh else a.shards
        if n not in inputs:
            c = make_corpus(n, seed=0)
            inputs[n] = work / f"corpus-{n}.parquet"
            pl.DataFrame({"id": [f"r{i}" for i in range(n)], "text": c.texts}).write_parquet(inputs[n])
            del c
        load_before = os.getloadavg()
        cmd = [sys.executable, __file__, "--child", "1", "--config", config, "--n", str(n), "--input",
               str(inputs[n]), "--workdir", str(work), "--shards", str(shards), "--store", store]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode:
            raise SystemExit(f"{spec} failed:\n{p.stderr[-4000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r.update(n=n, shards=shards, store=store, load_before=load_before, load_after=os.getloadavg())
        res["runs"].append(r)
        print(spec, json.dumps({k: r[k] for k in ("records_per_s", "steps_wall_seconds", "flow_wall_seconds",
                                                  "driver_peak_rss_mb", "driver_cpu_share", "steps", "prefect_tasks",
                                                  "work_files_total", "load_before", "load_after")}), flush=True)


if __name__ == "__main__":
    main()
