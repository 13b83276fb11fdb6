"""A real local Ray cluster for tests and benchmarks: `ray start --head` on loopback ports, stopped by process id.

    with local_ray_cluster(tmp_dir) as cluster:
        cluster.dashboard_url   http://127.0.0.1:PORT, the Jobs API (JobSubmissionClient, `ray job submit`)
        cluster.gcs_address     127.0.0.1:PORT, for ray.init / prefect-ray's RayTaskRunner(address=...)

The head runs with `--block` in its own session, with its own --temp-dir (sockets, logs), a CPU count and an
object store capped (Ray reserves 30% of the memory for the object store otherwise). Every Ray process it starts
(GCS, raylet, dashboard, agents, workers) stays in that session, so teardown stops exactly this cluster: SIGTERM
to the blocking `ray start` (which drains and stops its processes), then SIGKILL to any process still in the
session or naming the cluster's temp dir (`cluster.stragglers` lists them; empty when Ray stopped cleanly). `ray stop` is not used: it stops every Ray process of the user on the machine, other clusters included.
The `ray` executable is the one beside this Python (the project's environment); its folder leads PATH inside the
cluster, so a job's `python3` is this environment's Python.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import httpx

from evolforge.testing.prefect_server import free_port

AGENT_KEY_PREFIX = b"DASHBOARD_AGENT_ADDR_NODE_ID_PREFIX:"  # ray.dashboard.consts: the agent's address, by node id


@dataclass(frozen=True)
class RayCluster:
    dashboard_url: str
    gcs_address: str
    session_id: int  # the process session of every process of this cluster
    temp_dir: Path
    log: Path
    stragglers: list[int] = field(default_factory=list)  # processes SIGKILLed at teardown (none when Ray stops cleanly)


def ray_executable() -> str:
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.exists() else shutil.which("ray")
    if not found:
        raise RuntimeError("the `ray` command is not installed: pip install 'ray[default]'")
    return found


def session_pids(session_id: int) -> list[int]:
    """Live processes of one process session (read from /proc: field 6 of /proc/PID/stat)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session ...
        if int(fields[3]) == session_id and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def processes_using(folder: Path) -> list[int]:
    """Live processes whose command line names `folder` (this cluster's private --temp-dir): a Ray process that
    left the session would still show here."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(folder).encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def stop_session(session_id: int, grace_s: float = 30.0) -> list[int]:
    """SIGTERM the session leader (the blocking `ray start`), wait, then SIGKILL what is left; returns what had
    to be killed."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(session_id, signal.SIGTERM)
    deadline = time.time() + grace_s
    while session_pids(session_id) and time.time() < deadline:
        time.sleep(0.5)
    killed = session_pids(session_id)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return killed


def job_agent_registered(gcs_address: str) -> bool:
    """Whether the head's dashboard agent has written its HTTP address to the GCS, which is where the Jobs API looks
    for the agent it hands a submission to."""
    import ray._raylet

    try:
        client = ray._raylet.GcsClient(address=gcs_address)
        keys = client.internal_kv_keys(AGENT_KEY_PREFIX, namespace=b"dashboard", timeout=5)
        values = [client.internal_kv_get(key, namespace=b"dashboard", timeout=5) for key in keys]
    except Exception:  # noqa: BLE001 - the GCS is still starting (Ray raises its own RPC error types)
        return False
    return any(value and json.loads(value)[1] > 0 for value in values)  # (ip, http port, grpc port); -1: no server


@contextlib.contextmanager
def local_ray_cluster(num_cpus: int = 2, object_store_memory: int = 200_000_000,
                      startup_timeout: float = 180.0) -> Iterator[RayCluster]:
    # a short folder: Ray's unix sockets live under it (socket paths are limited to 107 characters)
    temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    gcs_port, dashboard_port = free_port(), free_port()
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "RAY_USAGE_STATS_ENABLED": "0"}
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        env.pop(name, None)
    cmd = [ray_executable(), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--port", str(gcs_port), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard_port),
           "--include-dashboard", "true", "--dashboard-agent-listen-port", str(free_port()),
           "--ray-client-server-port", str(free_port()), "--metrics-export-port", str(free_port()),
           "--num-cpus", str(num_cpus), "--object-store-memory", str(object_store_memory),
           "--temp-dir", str(temp_dir), "--disable-usage-stats"]
    log_path = temp_dir / "ray-start.log"
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    cluster: RayCluster | None = None
    try:
        deadline = time.time() + startup_timeout
        # Up when the job server answers (the dashboard starts after GCS and raylet) and the head's dashboard agent
        # has registered (the Jobs API submits through it: before, a submission is refused with "No available
        # agent to submit job"; on a loaded machine the agent comes up seconds to minutes after the dashboard).
        while True:
            try:
                if httpx.get(f"{dashboard}/api/version", timeout=2).status_code == 200 \
                        and job_agent_registered(f"127.0.0.1:{gcs_port}"):
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited ({proc.returncode}): {log_path.read_text()[-3000:]}")
            if time.time() > deadline:
                raise RuntimeError(f"the Ray head did not come up in {startup_timeout}s: {log_path.read_text()[-3000:]}")
            time.sleep(1)
        cluster = RayCluster(dashboard, f"127.0.0.1:{gcs_port}", proc.pid, temp_dir, log_path)
        yield cluster
    finally:
        stragglers = stop_session(proc.pid) + processes_using(temp_dir)
        for pid in stragglers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if cluster is not None:
            cluster.stragglers.extend(stragglers)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        shutil.rmtree(temp_dir, ignore_errors=True)
