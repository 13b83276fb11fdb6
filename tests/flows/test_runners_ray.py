"""The Ray task runner of [runner] on a real local Ray cluster (`ray start --head`, testing/ray_cluster.py).

A flow that reports to Prefect's temporary server: its Ray workers report to that same server (before, each worker
process started a temporary server of its own, 25-40 s before its first task), and the tasks' context (serialized
once per flow run, one remote function for all tasks) still names the flow run and its parameters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from evolforge.testing.lazy import needs

pytestmark = [pytest.mark.slow, needs("prefect_ray")]

SCRIPT = textwrap.dedent("""
    import json, os, sys
    from prefect import flow, task
    from prefect.context import FlowRunContext, TaskRunContext
    from evolforge.config.settings import RunnerSettings
    from evolforge.flows._runners import build_task_runner, driver_api_url

    @task
    def where(k: int) -> dict:
        from prefect.server.api.server import SubprocessASGIServer
        from prefect.settings import PREFECT_API_URL
        started = [s.port for s in SubprocessASGIServer._instances.values() if s.server_process is not None]
        run = TaskRunContext.get().task_run
        return {"k": k, "pid": os.getpid(), "api": PREFECT_API_URL.value(), "servers_started": started,
                "flow_run_id": str(run.flow_run_id), "flow_param": FlowRunContext.get().parameters["tag"]}

    @flow(task_runner=build_task_runner(RunnerSettings(kind="ray", address=sys.argv[1])))
    def probe(tag: str) -> dict:
        futures = [where.submit(k) for k in range(4)]
        return {"driver_api": driver_api_url()[0], "driver_pid": os.getpid(), "flow_run_id": str(FlowRunContext.get().flow_run.id),
                "tasks": [f.result() for f in futures]}

    print("RESULT " + json.dumps(probe("t-1")))
""")


@pytest.fixture(scope="module")
def ray_cluster():
    from evolforge.testing.ray_cluster import local_ray_cluster

    with local_ray_cluster(num_cpus=2, object_store_memory=200_000_000) as cluster:
        yield cluster


def test_ray_workers_report_to_the_flows_temporary_server(ray_cluster, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "RAY_ADDRESS"))}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, ray_cluster.gcs_address], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert out["driver_api"].startswith("http://127.0.0.1:")
    assert sorted(t["k"] for t in out["tasks"]) == [0, 1, 2, 3]
    for t in out["tasks"]:
        assert t["pid"] != out["driver_pid"]
        assert t["api"] == out["driver_api"]        # the driver's temporary server, not one of its own
        assert t["servers_started"] == []           # no temporary server started in the worker
        assert t["flow_run_id"] == out["flow_run_id"] and t["flow_param"] == "t-1"
