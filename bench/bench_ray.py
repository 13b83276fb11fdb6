"""The Ray path's costs, measured side by side in one run on a real local Ray cluster.

    .venv/bin/python bench/bench_ray.py [--n 2000] [--batch-size B] [--repeat 2] [--jobs 3]

1. Cluster start: `ray start --head` (2 CPUs, 200 MB object store, dashboard on loopback) until the Jobs API
   answers (testing/ray_cluster.py), and its stop.
2. Evolve flow, one round without dedup, against the instant OpenAI-compatible server (testing/instant_server.py,
   its own process): the threads runner (2 batches in flight) vs the Ray runner of flows/_runners.py on that
   cluster, alternating, `--repeat` times each; wall seconds and items/s (the median is the figure), and
   whether both give the same records. The batch size is the settings' default unless --batch-size is given.
3. A Ray job's round trip through the Jobs API (tasks/ppo/ray_jobs.py run: submit, wait for SUCCEEDED, fetch the
   log) for `python3 -c "import evolforge"`, against the same command as a local subprocess.
Results: bench/results/ray.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _evolve(seeds: Path, out: Path, base_url: str, batch_size: int | None, runner: dict) -> tuple[float, object]:
    import polars as pl

    from evolforge.flows.evolve import EvolveParams, evolve_flow
    from evolforge.storage.layout import RunLayout

    evol = {"dedup_each_round": False, **({"batch_size": batch_size} if batch_size else {})}
    params = EvolveParams(seeds=str(seeds), out=str(out), rounds=1, base_url=base_url,
                          overrides={"evol_instruct": evol, "runner": runner})
    t0 = time.perf_counter()
    evolve_flow(params)
    wall = time.perf_counter() - t0
    return wall, pl.read_parquet(RunLayout(out).lineage).drop(["model"]).sort("id")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=None, help="default: the settings' evol_instruct.batch_size")
    ap.add_argument("--repeat", type=int, default=2, help="threads / Ray runs, alternating")
    ap.add_argument("--jobs", type=int, default=3, help="Ray job round trips to time")
    a = ap.parse_args()

    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="evolforge-bench-prefect-"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        os.environ.pop(name, None)

    from prefect import flow

    from evolforge.tasks.ppo import ray_jobs
    from evolforge.testing.prefect_server import free_port
    from evolforge.testing.ray_cluster import local_ray_cluster

    work = Path(tempfile.mkdtemp(prefix="evolforge-bench-ray-"))
    seeds = work / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"b{i:06d}", "instruction": f"Explain how to compute {i} times "
                                                                           f"{i % 97 + 3}."}) + "\n"
                             for i in range(a.n)))
    port = free_port()
    server = subprocess.Popen([sys.executable, str(ROOT / "testing" / "instant_server.py"), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    from evolforge.config.settings import Settings

    batch_size = a.batch_size or Settings().evol_instruct.batch_size
    result: dict = {"n": a.n, "batch_size": batch_size, "cpus": os.cpu_count(), "load_before": os.getloadavg()}
    try:
        @flow
        def warm_up() -> int:
            return 1

        warm_up()  # the temporary Prefect server starts outside the measurements
        t0 = time.perf_counter()
        with local_ray_cluster(num_cpus=2, object_store_memory=200_000_000) as cluster:
            result["cluster_start_s"] = round(time.perf_counter() - t0, 2)

            walls: dict[str, list[float]] = {"threads": [], "ray": []}
            same = True
            for k in range(a.repeat):
                threads_s, threads = _evolve(seeds, work / f"threads-{k}", base_url, a.batch_size,
                                             {"kind": "threads", "max_workers": 2})
                ray_s, on_ray = _evolve(seeds, work / f"ray-{k}", base_url, a.batch_size,
                                        {"kind": "ray", "address": cluster.gcs_address})
                walls["threads"].append(round(threads_s, 2))
                walls["ray"].append(round(ray_s, 2))
                same = same and bool(on_ray.equals(threads))
            t_med, r_med = statistics.median(walls["threads"]), statistics.median(walls["ray"])
            result["evolve"] = {
                "threads_wall_s": walls["threads"], "ray_wall_s": walls["ray"],
                "threads_items_per_s": round(a.n / t_med, 1), "ray_items_per_s": round(a.n / r_med, 1),
                "ray_over_threads": round(t_med / r_med, 3), "records": threads.height, "same_records": same}

            entry = ["python3", "-c", "import evolforge"]
            local, remote = [], []
            for i in range(a.jobs):
                t = time.perf_counter()
                subprocess.run([str(Path(sys.executable).with_name("python3")), *entry[1:]], check=True)
                local.append(time.perf_counter() - t)
                t = time.perf_counter()
                rec = ray_jobs.run(cluster.dashboard_url, ray_jobs.JobRequest(entrypoint=entry,
                                   submission_id=f"bench-{os.getpid()}-{i}"), wait_s=120)
                remote.append(time.perf_counter() - t)
                assert rec["status"] == "SUCCEEDED", rec
            result["job_round_trip"] = {"command": " ".join(entry), "runs": a.jobs,
                                        "local_subprocess_median_s": round(statistics.median(local), 2),
                                        "ray_job_median_s": round(statistics.median(remote), 2),
                                        "ray_job_s": [round(x, 2) for x in remote]}
            t1 = time.perf_counter()
        result["cluster_stop_s"] = round(time.perf_counter() - t1, 2)
        result["stragglers"] = cluster.stragglers
        result["load_after"] = os.getloadavg()
    finally:
        server.terminate()
    print(json.dumps(result, indent=2))
    (ROOT / "bench" / "results" / "ray.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
