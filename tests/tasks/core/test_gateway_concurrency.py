"""The gateway's calls in flight follow the endpoint (gateway.concurrency = 0): the embedded llama-server's slots
(its /props), 32 for a remote endpoint; an explicit setting overrides it; the run's first lines say which."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from evolforge.storage.ledger import LedgerWriter
from evolforge.tasks.core.gateway import REMOTE_CONCURRENCY, Gateway, derive_concurrency
from evolforge.testing.scripted_server import ScriptedServer
from evolforge.testing.settings import make_settings


def fake_binary(tmp_path):
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def gateway(settings, url, tmp_path, embedded: bool) -> Gateway:
    return Gateway(settings, base_url=url, run_id="r", ledger=LedgerWriter(tmp_path / "ledger", "r"),
                   embedded_models={settings.embedded.alias} if embedded else set())


def test_a_remote_endpoint_gets_32_unless_gateway_concurrency_says_otherwise(server, tmp_path):
    assert make_settings().gateway.concurrency == 0  # the default: follow the endpoint
    gw = gateway(make_settings(server.base_url), server.base_url, tmp_path, embedded=False)
    assert gw.max_in_flight == REMOTE_CONCURRENCY == 32
    assert gw.concurrency_line() == ("gateway: 32 calls in flight (from the default for a remote endpoint; "
                                     "gateway.concurrency sets another)")
    explicit = gateway(make_settings(server.base_url, gateway={"concurrency": 5}), server.base_url, tmp_path, False)
    assert explicit.max_in_flight == 5
    assert explicit.concurrency_line() == "gateway: 5 calls in flight (from gateway.concurrency)"
    assert server.props_requests == 0  # a remote endpoint is not asked for llama-server's /props


def test_the_embedded_model_gets_one_call_per_slot_its_server_reports(server, tmp_path):
    """The scripted server stands in for the embedded llama-server here: its /props says how many slots."""
    settings = make_settings(embedded={"server_binary": str(fake_binary(tmp_path)), "parallel": 5})
    url = server.base_url
    server.props = {"total_slots": 3, "default_generation_settings": {"n_ctx": 2048}}
    assert derive_concurrency(settings, url, embedded=True) == (3, "the embedded llama-server's /props: 3 slots")
    assert server.props_requests == 1
    server.props = None  # no /props (404): what it was started with
    assert derive_concurrency(settings, url, embedded=True) == (5, "embedded.parallel: 5 llama-server slots")
    for hostile in ({"total_slots": "8"}, {"total_slots": True}, {"total_slots": 0}, {"total_slots": 10**9},
                    [3], "slots", {"total_slots": -1}):
        server.props = hostile
        assert derive_concurrency(settings, url, embedded=True)[0] == 5, hostile
    server.props = {"total_slots": 3}
    lower = make_settings(gateway={"concurrency": 2}, embedded={"server_binary": str(fake_binary(tmp_path))})
    assert derive_concurrency(lower, url, embedded=True) == (
        2, "gateway.concurrency, under the embedded llama-server's /props: 3 slots")
    higher = make_settings(gateway={"concurrency": 16}, embedded={"server_binary": str(fake_binary(tmp_path))})
    assert derive_concurrency(higher, url, embedded=True)[0] == 3  # calls beyond the slots would only queue
    own = make_settings(embedded={"server_binary": str(fake_binary(tmp_path)), "max_concurrent_calls": 12})
    assert derive_concurrency(own, url, embedded=True) == (12, "embedded.max_concurrent_calls")
    fallback = make_settings(embedded={"server": "llama-cpp-python"})
    assert derive_concurrency(fallback, url, embedded=True) == (2, "llama-cpp-python's server, one call at a time")


def test_the_derived_limit_is_what_the_gateway_holds_to(server, tmp_path):
    """6 calls at once against 3 reported slots: never more than 3 reach the server together."""
    server.latency = 0.3
    server.props = {"total_slots": 3}
    settings = make_settings(gateway={"timeout_seconds": 10.0},
                             embedded={"server_binary": str(fake_binary(tmp_path))})
    gw = gateway(settings, server.base_url, tmp_path, embedded=True)
    assert gw.max_in_flight == 3
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: gw.chat("evolve", [{"role": "user", "content": f"hi {i}"}], task_id=str(i)),
                      range(6)))
    gw.close()
    starts = sorted(e["t"] for e in server.posts())
    assert len(starts) == 6
    assert max(sum(1 for t in starts if s <= t < s + 0.25) for s in starts) == 3


def test_a_run_says_its_calls_in_flight_in_its_first_lines(tmp_path):
    """`evolforge run` prints `gateway: N calls in flight (from ...)` on the terminal, before its progress ends."""
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"instruction": f"List {i + 2} rivers of country {i}."}) + "\n"
                             for i in range(3)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLFORGE__GATEWAY")}
    env["EVOLFORGE__GATEWAY__CONCURRENCY"] = "3"
    env["EVOLFORGE__GATEWAY__BACKOFF_BASE_SECONDS"] = "0"
    env["PREFECT_LOGGING_LEVEL"] = "INFO"  # a user's level (the suite's default is WARNING)
    with ScriptedServer() as srv:
        r = subprocess.run([sys.executable, "-m", "evolforge.cli", "run", "--seeds", str(seeds), "--out",
                            str(tmp_path / "out"), "--rounds", "1", "--base-url", srv.base_url],
                           env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    terminal = (r.stderr + r.stdout).splitlines()
    said = [line for line in terminal if "calls in flight" in line]
    assert said and said[0].endswith("gateway: 3 calls in flight (from gateway.concurrency)"), terminal[:20]
    summary = next(i for i, line in enumerate(terminal) if "== evolforge run complete ==" in line)
    assert terminal.index(said[0]) < summary
    assert "gateway: 3 calls in flight" in (tmp_path / "out" / "evolforge.log").read_text()
