"""Orchestration overhead: evolve N instructions for one round against an instant scripted endpoint.

    .venv/bin/python bench/bench_orchestration.py [--n 10000] [--batch-size 256]

The instant OpenAI-compatible server (testing/instant_server.py) runs in its own
process and answers at once, so the wall time is the pipeline's own cost:
Prefect tasks, the OpenAI SDK, journal and ledger writes, parquet parts.
Reports items/s for the round and the share of wall time during which no model
call was in flight (from the ledger's per-call start/end times).
Target (issue 2): >= 200 items/s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolforge.testing.net import free_port

ROOT = Path(__file__).resolve().parents[1]


def busy_share(ledger) -> tuple[float, float, float]:
    """(first call start, last call end, seconds with at least one call in flight)."""
    iv = sorted((r["ts"] - r["latency_s"], r["ts"]) for r in ledger.select("ts", "latency_s").to_dicts())
    busy, cur_s, cur_e = 0.0, iv[0][0], iv[0][1]
    for s, e in iv[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    return iv[0][0], max(e for _, e in iv), busy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=8, help="records in flight per batch")
    ap.add_argument("--gateway-concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="batches in flight")
    ap.add_argument("--storage", choices=["local", "s3"], default="local",
                    help="where the run's folder lives: a local temp folder, or s3:// on a moto S3 server process")
    ap.add_argument("--no-dedup", action="store_true", help="skip the dedup step after the round")
    ap.add_argument("--flush-seconds", type=float, default=None,
                    help="storage.remote_log_flush_seconds (s3 only; 0 = one object per journal / ledger entry)")
    a = ap.parse_args()

    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="evolforge-bench-prefect-"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

    work = Path(tempfile.mkdtemp(prefix="evolforge-bench-"))
    seeds = work / "seeds.jsonl"
    with open(seeds, "w") as fh:
        for i in range(a.n):
            fh.write(json.dumps({"id": f"b{i:06d}", "instruction": f"Explain step by step how to compute {i} times {i % 97 + 3}."}) + "\n")
    port = free_port()
    stack: list = []
    server = subprocess.Popen([sys.executable, str(ROOT / "testing" / "instant_server.py"), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        from prefect import flow

        from evolforge.flows.evolve import EvolveParams, evolve_flow
        from evolforge.storage.ledger import read_ledger

        @flow
        def warm_up() -> int:
            return 1

        warm_up()  # start the temporary Prefect server outside the measurement
        out = str(work / "out") if a.storage == "local" else start_s3(stack)
        params = EvolveParams(
            seeds=str(seeds), out=out, rounds=1, base_url=f"http://127.0.0.1:{port}/v1",
            overrides={"evol_instruct": {"batch_size": a.batch_size, "concurrency": a.concurrency,
                                         "dedup_each_round": not a.no_dedup},
                       "gateway": {"concurrency": a.gateway_concurrency}},
        )
        params.overrides["runner"] = {"max_workers": a.workers}
        if a.flush_seconds is not None:
            params.overrides["storage"] = {"remote_log_flush_seconds": a.flush_seconds}
        t0 = time.time()
        summary = evolve_flow(params)
        wall = time.time() - t0
        ledger = read_ledger(out)
        first, last, busy = busy_share(ledger)
        round_wall = last - first
        result = {
            "storage": a.storage, "dedup": not a.no_dedup, "n": a.n,
            "remote_log_flush_seconds": a.flush_seconds if a.flush_seconds is not None else "default", "batch_size": a.batch_size, "batches": -(-a.n // a.batch_size),
            "calls": ledger.height, "flow_wall_s": round(wall, 2), "round_wall_s": round(round_wall, 2),
            "items_per_s_round": round(a.n / round_wall, 1), "items_per_s_flow": round(a.n / wall, 1),
            "calls_per_s": round(ledger.height / round_wall, 1),
            "share_no_call_in_flight": round(1 - busy / round_wall, 4),
            "mean_call_latency_ms": round(1000 * float(ledger["latency_s"].mean()), 2),
            "accepted": summary["rounds"][0]["accepted"],
        }
    finally:
        server.terminate()
        for proc in stack:
            proc.kill()
    print(json.dumps(result, indent=2))
    res_dir = ROOT / "bench" / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    name = "orchestration.json" if a.storage == "local" and not a.no_dedup else \
        f"orchestration_{a.storage}{'_nodedup' if a.no_dedup else ''}" \
        f"{'' if a.flush_seconds is None else f'_flush{a.flush_seconds:g}'}.json"
    (res_dir / name).write_text(json.dumps(result, indent=2))


def start_s3(stack: list) -> str:
    """A moto S3 server in its own process; fsspec pointed at it; returns the run URL."""
    import shutil
    import urllib.request

    import fsspec

    port = free_port()
    venv_exe = Path(sys.executable).parent / "moto_server"
    exe = str(venv_exe) if venv_exe.exists() else shutil.which("moto_server")
    stack.append(subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL))
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except OSError:
            time.sleep(0.2)
    fsspec.config.conf["s3"] = {"endpoint_url": url, "key": "bench", "secret": "bench",
                                "client_kwargs": {"region_name": "us-east-1"}}
    import boto3

    boto3.client("s3", endpoint_url=url, aws_access_key_id="bench", aws_secret_access_key="bench",
                 region_name="us-east-1").create_bucket(Bucket="bench")
    return "s3://bench/run"


if __name__ == "__main__":
    main()
