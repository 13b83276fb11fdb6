"""A real local Dask cluster whose scheduler is a process of its own, as on several machines: `dask scheduler`
and N `dask worker` processes (one thread each) on loopback, for benchmarks and tests.

    with local_dask_cluster(workers=2) as address:   # tcp://127.0.0.1:PORT, for [runner] address
        ...

The runner's default local cluster (distributed.LocalCluster) runs the scheduler inside the flow's own process;
this one leaves the flow process only its own work, which is what a deployment past one machine looks like. The
processes share one process session, killed together at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from evolforge.testing.net import free_port


def _dask() -> str:
    exe = Path(sys.executable).with_name("dask")
    if not exe.exists():
        raise RuntimeError("the `dask` command is not installed: pip install 'evolforge[dask]'")
    return str(exe)


@contextlib.contextmanager
def local_dask_cluster(workers: int = 2, log_dir: str | Path | None = None,
                       startup_timeout: float = 120) -> Iterator[str]:
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    out = open(Path(log_dir) / "dask-cluster.log", "w") if log_dir else subprocess.DEVNULL
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "false"}
    scheduler = subprocess.Popen([_dask(), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                  "--dashboard-address", ":0", "--no-show"], env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    procs = [scheduler]
    try:
        for _ in range(workers):
            procs.append(subprocess.Popen([_dask(), "worker", address, "--nthreads", "1", "--nworkers", "1",
                                           "--host", "127.0.0.1", "--dashboard-address", ":0", "--no-nanny"],
                                          env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.time() + startup_timeout
        while True:
            try:
                with Client(address, timeout=5) as c:
                    if len(c.scheduler_info()["workers"]) >= workers:
                        break
            except OSError:
                pass
            if time.time() > deadline or scheduler.poll() is not None:
                raise RuntimeError(f"the Dask cluster at {address} did not come up with {workers} workers")
            time.sleep(0.5)
        yield address
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if out is not subprocess.DEVNULL:
            out.close()
