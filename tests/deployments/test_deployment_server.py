"""The Prefect way, against a real Prefect server started here (loopback, its own PREFECT_HOME):
deploy, start a process worker, `prefect deployment run`, watch it fail on a poisoned batch,
`prefect flow-run retry` it, and read its artifacts through the API."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import httpx
import polars as pl

from evolforge.testing.prefect_server import wait_for_run as _wait
from evolforge.testing.scripted_server import ScriptedServer


def test_deploy_worker_run_retry_artifacts(prefect_server, tmp_path):
    env, api = prefect_server
    pool = "evolforge-test-pool"
    deploy = subprocess.run([sys.executable, "-m", "evolforge.cli", "deploy", "--pool", pool, "--no-schedule"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    deps = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
    by_name = {d["name"]: d for d in deps}
    assert {"evolve", "nightly", "dedup", "synthesize", "reward-data", "train-reward", "ppo", "pipeline"} <= set(by_name)
    assert by_name["nightly"]["concurrency_limit"] == 1 or by_name["nightly"].get("global_concurrency_limit")
    sched = by_name["nightly"]["schedules"][0]
    assert sched["schedule"]["cron"] == "0 2 * * *" and sched["active"] is False

    wlog = open(tmp_path / "worker.log", "w")
    worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool],
                              env=env, stdout=wlog, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        seeds = tmp_path / "seeds.jsonl"
        seeds.write_text("\n".join(json.dumps({"id": f"s{i}", "instruction": f"Summarise book number {i}."})
                                   for i in range(6)) + "\n" + json.dumps({"id": "bad", "instruction": "POISON pill"}) + "\n")
        with ScriptedServer() as srv:
            srv.poison = "POISON"
            params = {"seeds": str(seeds), "out": str(tmp_path / "out"), "rounds": 1, "base_url": srv.base_url,
                      "overrides": {"evol_instruct": {"batch_size": 3},
                                    "gateway": {"max_retries": 1, "backoff_base_seconds": 0.0}}}
            run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "evolve/evolve",
                                  "--param", f"params={json.dumps(params)}"], env=env, capture_output=True,
                                 text=True, timeout=120)
            assert run.returncode == 0, run.stdout + run.stderr
            run_id = re.search(r"UUID: ([0-9a-f-]{36})", run.stdout).group(1)
            assert _wait(api, run_id) == "FAILED"
            first = srv.posts()
            assert any(p["action"] == "500" for p in first)

            srv.poison = None  # the endpoint recovers; retry the failed run
            retry = subprocess.run([sys.executable, "-m", "prefect", "flow-run", "retry", run_id], env=env,
                                   capture_output=True, text=True, timeout=120)
            assert retry.returncode == 0, retry.stdout + retry.stderr
            assert _wait(api, run_id) == "COMPLETED", (tmp_path / "worker.log").read_text()[-4000:]
            again = srv.posts()[len(first):]
        # only the failed batch ran again, and only its unfinished record: 3 calls for the poisoned seed
        assert len(again) == 3
        lineage = pl.read_parquet(tmp_path / "out" / "dataset" / "lineage.parquet")
        assert lineage.height == 7 and lineage["parent_id"].n_unique() == 7

        arts = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}},
                          timeout=10).json()
        keys = {a["key"] for a in arts}
        assert {"evolve-summary", "evolve-round-1", "evolve-round-1-progress"} <= keys
        summary = next(a for a in arts if a["key"] == "evolve-summary")
        assert "Cost per stage" in summary["data"]
        names = httpx.post(f"{api}/task_runs/filter", json={"flow_runs": {"id": {"any_": [run_id]}}},
                           timeout=10).json()
        assert {"evolve-round-1-batch-00000", "evolve-round-1-batch-00002"} <= {t["name"] for t in names}
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
