"""The links a command prints open a working Prefect UI: `evolforge run` with the default reused local server
(runner.prefect_server = "reuse") prints `Prefect UI: URL` and the flow run's `View at URL`; headless Chromium on
that printed link shows the run's task runs and its artifacts, never the "Can't connect to Server API" banner (the
UI of a server started on another port than 4200 used to look for its API on 4200). And the server's port is
stable: the preferred port when it is free, else the next free one, as the printed line says."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from evolforge.cli.prefect_server import pick_port, port_free
from evolforge.testing import browser
from evolforge.testing.net import free_port
from evolforge.testing.scripted_server import ScriptedServer

BANNER = "Can't connect to Server API"


def test_preferred_port_when_free_else_the_next_free_one():
    port = free_port()
    assert port_free(port) and pick_port(port) == port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        assert not port_free(port)
        nxt = pick_port(port)
        assert nxt > port and port_free(nxt)
        assert pick_port(port, skip=(nxt,)) not in (port, nxt)
    assert pick_port(0) > 0  # 0: any free port


@pytest.mark.skipif(bool(browser.available()), reason=browser.available() or "")
def test_printed_flow_run_link_shows_task_runs_and_artifacts(tmp_path):
    home = tmp_path / "prefect-home"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_URL")}
    env.update(PREFECT_HOME=str(home), EVOLFORGE__RUNNER__PREFECT_SERVER="reuse",
               EVOLFORGE__RUNNER__PREFECT_PORT=str(port), PREFECT_LOGGING_LEVEL="INFO")
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Name {i + 2} rivers of country {i}."}) + "\n"
                             for i in range(4)))
    config = tmp_path / "config.toml"
    config.write_text("[gateway]\nbackoff_base_seconds = 0.0\n[evol_instruct]\nbatch_size = 2\n")

    def evolforge(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "evolforge.cli", *args], env=env, capture_output=True, text=True,
                              timeout=600)

    try:
        with ScriptedServer() as srv:
            r = evolforge("run", "--seeds", str(seeds), "--out", str(tmp_path / "out"), "--rounds", "1",
                          "--base-url", srv.base_url, "--config", str(config))
        text = r.stdout + r.stderr
        assert r.returncode == 0, text[-3000:]
        ui = re.search(r"Prefect UI: (http://\S+)", text)
        link = re.search(r"View at (http://\S+/runs/flow-run/[0-9a-f-]{36})", text)
        assert ui and link, text[-3000:]
        assert ui.group(1) == f"http://127.0.0.1:{port}"  # the port asked for, free here
        assert link.group(1).startswith(ui.group(1) + "/")
        # the UI served there is told its own API (what the SPA reads before its first API call)
        from evolforge.cli.prefect_server import ui_api_url

        assert ui_api_url(ui.group(1) + "/api") == ui.group(1) + "/api"

        with browser.chromium() as driver:
            driver.get(link.group(1))
            # the run page: its state, the task runs of its batches (in the run graph and the Task Runs tab)
            browser.wait_for(driver, lambda d: "Completed" in browser.page_text(d), "the completed run")
            assert BANNER not in browser.page_text(driver)
            tab = "//*[normalize-space(.)='{0}' and not(*[normalize-space(.)='{0}'])]"
            for name, shows in (("Task Runs", ("evolve-round-1-batch-00000", "evolve-round-1-batch-00001")),
                                ("Artifacts", ("evolve-summary", "evolve-round-1", "evolve-plots"))):
                browser.wait_for(driver, lambda d: [e for e in d.find_elements("xpath", tab.format(name))
                                                    if e.is_displayed()][-1].click() or True, f"the {name} tab")
                browser.wait_for(driver, lambda d: all(s in browser.page_text(d) for s in shows),
                                 f"{', '.join(shows)} under {name}")
            assert BANNER not in browser.page_text(driver)
            driver.save_screenshot(str(tmp_path / "flow-run-page.png"))
    finally:
        stop = evolforge("server", "stop")
        assert stop.returncode == 0, stop.stdout + stop.stderr
