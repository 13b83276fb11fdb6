"""runner.prefect_server = "reuse": the first command starts a local Prefect server in the background and leaves it
running; the next command reports to the same server (no server start of its own); `evolforge server stop` ends it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from evolforge.testing.net import free_port
from evolforge.testing.scripted_server import ScriptedServer


def _flow_runs(api: str) -> list[dict]:
    req = urllib.request.Request(f"{api}/flow_runs/filter", data=b"{}", headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _logs(api: str, flow_run_id: str) -> list[str]:
    body = json.dumps({"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}).encode()
    req = urllib.request.Request(f"{api}/logs/filter", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return [x["message"] for x in json.loads(r.read())]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is gone for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_commands_reuse_one_background_server_and_stop_it(tmp_path):
    home = tmp_path / "prefect-home"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL",)}
    env.update(PREFECT_HOME=str(home), EVOLFORGE__RUNNER__PREFECT_SERVER="reuse", PREFECT_LOGGING_LEVEL="INFO",
               EVOLFORGE__RUNNER__PREFECT_PORT=str(free_port()))  # not 4200: a user's own server may be there
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"List {i + 2} rivers of country {i}."}) + "\n"
                             for i in range(4)))
    config = tmp_path / "config.toml"
    config.write_text("[gateway]\nbackoff_base_seconds = 0.0\ntimeout_seconds = 5.0\n"
                      "[evol_instruct]\nbatch_size = 2\nconcurrency = 2\ndedup_each_round = false\n")

    def evolforge(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "evolforge.cli", *args], env=env, capture_output=True, text=True,
                              timeout=600)

    state_file = home / "evolforge-server.json"
    try:
        with ScriptedServer() as srv:
            for n, out in enumerate(("out-1", "out-2"), start=1):
                r = evolforge("run", "--seeds", str(seeds), "--out", str(tmp_path / out), "--rounds", "1",
                              "--base-url", srv.base_url, "--config", str(config))
                assert r.returncode == 0, r.stderr[-3000:]
                state = json.loads(state_file.read_text())
                if n == 1:
                    first = state
                assert state == first  # the second command found the first one's server and started none
                assert _alive(state["pid"])  # it outlives the command
                runs = _flow_runs(state["url"])
                assert len(runs) == n  # both runs are in that server (and its UI)
                # the command ends its process without the interpreter's teardown (cli/common.fast_exit): its
                # last printed lines, the run's final state and its last log lines still get out
                last = r.stdout.rstrip().splitlines()
                assert last[-2].startswith("per-stage costs:"), r.stdout[-2000:]
                assert last[-1] == f"log: {tmp_path / out}/evolforge.log", r.stdout[-2000:]
                assert "== evolforge run complete ==" in r.stdout
                assert all(run["state_type"] == "COMPLETED" for run in runs)
                newest = max(runs, key=lambda run: run["created"])
                assert any(m.startswith("done: ") for m in _logs(state["url"], newest["id"])), "the last log line was lost"
        st = evolforge("server", "status")
        assert st.returncode == 0 and first["url"] in st.stdout
        assert f"export PREFECT_API_URL={first['url']}" in st.stdout  # the line that points the prefect CLI at it
    finally:
        stop = evolforge("server", "stop")
    assert stop.returncode == 0 and "stopped" in stop.stdout
    deadline = time.time() + 20
    while _alive(first["pid"]) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(first["pid"]) and not state_file.exists()
    assert evolforge("server", "status").returncode == 1


@pytest.mark.parametrize("mode", ["ephemeral"])
def test_ephemeral_mode_leaves_no_server_behind(tmp_path, mode, monkeypatch):
    from evolforge.cli.prefect_server import attach

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert attach(mode) is None and "PREFECT_API_URL" not in os.environ
