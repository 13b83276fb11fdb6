"""The embedded model on llama.cpp's llama-server: server choice, gateway cap, and real concurrent calls."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from evolforge.config.settings import load_settings
from evolforge.storage.ledger import LedgerWriter, read_ledger
from evolforge.tasks.core import llama_server
from evolforge.tasks.core.embedded_model import EmbeddedModelError, embedded_server, server_command
from evolforge.tasks.core.gateway import Gateway


def embedded_cfg(**kw):
    return load_settings(overrides={"embedded": kw}, environ={}).embedded


def fake_binary(tmp_path):
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_auto_falls_back_to_llama_cpp_python_without_a_binary(tmp_path):
    cfg = embedded_cfg(server_binary=str(tmp_path / "missing"))  # the default server (auto), no binary
    assert cfg.server == "auto" and cfg.n_threads == 0
    assert llama_server.chosen_server(cfg) == "llama-cpp-python"
    assert llama_server.concurrency_cap(cfg) == 2  # one call at a time there: more only queue
    pytest.importorskip("llama_cpp.server")
    assert server_command(cfg, 9999)[1:3] == ["-m", "llama_cpp.server"]


def test_auto_picks_llama_server_and_its_slots_cap_the_gateway(tmp_path):
    cfg = embedded_cfg(server="auto", server_binary=str(fake_binary(tmp_path)), parallel=6, n_ctx=1024)
    assert llama_server.chosen_server(cfg) == "llama-server"
    assert embedded_cfg().server == "auto"  # the default: llama-server whenever it is built
    assert llama_server.chosen_server(embedded_cfg(server_binary=str(fake_binary(tmp_path)))) == "llama-server"
    assert llama_server.concurrency_cap(cfg) == 6
    assert llama_server.concurrency_cap(cfg.model_copy(update={"max_concurrent_calls": 3})) == 3  # explicit wins
    cmd = server_command(cfg, 9999)
    assert cmd[0] == str(tmp_path / "llama-server")
    args = dict(zip(cmd[1::2], cmd[2::2]))
    assert args["--ctx-size"] == "6144" and args["--parallel"] == "6"  # each slot keeps n_ctx
    assert args["--alias"] == cfg.alias and args["--host"] == "127.0.0.1" and args["--port"] == "9999"
    assert "--cont-batching" in cmd
    forced = cfg.model_copy(update={"server": "llama-cpp-python"})
    assert llama_server.chosen_server(forced) == "llama-cpp-python" and llama_server.concurrency_cap(forced) == 2


@pytest.mark.embedded
def test_the_default_serves_on_llama_cpp_python_when_llama_server_is_not_built(tmp_path, caplog):
    pytest.importorskip("llama_cpp.server")
    import logging

    cfg = embedded_cfg(server_binary=str(tmp_path / "missing"), max_new_tokens=8)
    with caplog.at_level(logging.INFO, logger="evolforge.embedded"), embedded_server(cfg, tmp_path) as url:
        r = httpx.post(url + "/chat/completions", timeout=120, json={
            "model": cfg.alias, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert any("(llama-cpp-python," in m for m in caplog.messages)
    assert "slot" not in (tmp_path / "embedded-model.log").read_text(errors="replace")  # not llama-server


def test_forced_llama_server_without_a_binary_says_how_to_build_it(tmp_path):
    cfg = embedded_cfg(server="llama-server", server_binary=str(tmp_path / "missing"))
    with pytest.raises(EmbeddedModelError, match="serve-model --build"):
        server_command(cfg, 9999)


def test_a_file_that_is_not_executable_is_no_binary(tmp_path):
    plain = tmp_path / "llama-server"
    plain.write_text("not a program")
    assert llama_server.find_binary(embedded_cfg(server_binary=str(plain))) is None


needs_binary = pytest.mark.skipif(
    llama_server.find_binary(embedded_cfg()) is None,
    reason=f"no llama-server binary at {llama_server.cached_binary()}: build it with `evolforge serve-model --build`")


@needs_binary
@pytest.mark.embedded
def test_concurrent_chats_through_the_gateway_on_llama_server(tmp_path):
    settings = load_settings(overrides={"embedded": {"server": "llama-server", "parallel": 4, "max_new_tokens": 24}},
                             environ={})
    alias = settings.embedded.alias
    with embedded_server(settings.embedded, tmp_path) as url:
        models = httpx.get(url + "/models", timeout=5).json()
        assert alias in [m["id"] for m in models["data"]]
        gw = Gateway(settings, base_url=url, run_id="r", ledger=LedgerWriter(tmp_path / "ledger", "r"),
                     embedded_models={alias})
        assert gw.max_in_flight == 4  # one call per slot
        questions = ["What is 2 + 3?", "Name a colour.", "Say hello in French.", "What is the capital of Italy?",
                     "Count to three.", "Name a fruit."]
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(
                lambda i: gw.chat("evolve", [{"role": "user", "content": questions[i]}], task_id=f"t{i}",
                                  max_tokens=500, temperature=0.0), range(len(questions))))
        gw.close()
    for res in results:
        assert res.text.strip()  # real text from the real model
        assert res.prompt_tokens and res.prompt_tokens > 5
        assert 0 < res.completion_tokens <= 24  # max_tokens was capped to embedded.max_new_tokens
        assert res.finish_reason in ("stop", "length")
    ledger = read_ledger(tmp_path)
    assert ledger.height == len(questions) and set(ledger["outcome"]) == {"ok"}
    assert set(ledger["price_source"]) == {"embedded model (free)"}
    assert "slot" in (tmp_path / "embedded-model.log").read_text(errors="replace")  # it was llama-server serving
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/models", timeout=2)  # stopped with the context


def test_build_is_skipped_when_the_machine_already_has_the_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLFORGE_CACHE", str(tmp_path))
    cached = llama_server.cached_binary("9.9.9")
    assert cached == tmp_path / "llama-server" / "9.9.9" / "llama-server"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\n")
    monkeypatch.setattr(llama_server, "_run", lambda cmd: pytest.fail(f"rebuilt: {cmd}"))
    said = []
    assert llama_server.build("9.9.9", log=said.append) == cached and "already built" in said[0]


def _server_pid(guard_pid: int) -> int:
    children = open(f"/proc/{guard_pid}/task/{guard_pid}/children").read().split()
    assert len(children) == 1, children
    return int(children[0])


@needs_binary
@pytest.mark.embedded
def test_a_stuck_llama_server_is_killed_and_its_call_fails_instead_of_hanging(tmp_path, monkeypatch, caplog):
    """A server that takes a call and then makes no progress (SIGSTOP: the socket still accepts, nothing
    answers) must become a clear error within embedded.stall_seconds, not a call that hangs to its timeout."""
    import os
    import signal
    import threading
    import time

    from evolforge.tasks.core import embedded_model

    started: list = []
    real_popen = embedded_model.subprocess.Popen
    monkeypatch.setattr(embedded_model.subprocess, "Popen",
                        lambda *a, **k: started.append(real_popen(*a, **k)) or started[-1])
    cfg = embedded_cfg(server="llama-server", parallel=2, stall_seconds=3)
    outcome: dict = {}
    with embedded_server(cfg, tmp_path) as url:
        server_pid = _server_pid(started[0].pid)

        def long_call():
            t0 = time.monotonic()
            try:
                httpx.post(url + "/chat/completions", timeout=120, json={
                    "model": cfg.alias, "max_tokens": 4000, "messages": [{"role": "user", "content": "Tell a long story."}]})
                outcome["error"] = None
            except httpx.HTTPError as e:
                outcome["error"] = e
            outcome["seconds"] = time.monotonic() - t0

        caller = threading.Thread(target=long_call)
        caller.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait until the call is being decoded
            slots = httpx.get(url.removesuffix("/v1") + "/slots", timeout=5).json()
            if any(s["is_processing"] for s in slots):
                break
            time.sleep(0.1)
        os.kill(server_pid, signal.SIGSTOP)
        caller.join(timeout=60)
        assert not caller.is_alive(), "the call still hangs a minute after the server stopped making progress"
    assert isinstance(outcome["error"], httpx.HTTPError) and outcome["seconds"] < 30
    assert "killed it" in (tmp_path / "embedded-model.log").read_text(errors="replace")
    assert any("stall_seconds" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    for _ in range(50):  # gone (or a zombie waiting for its new parent to reap it), not left stopped
        try:
            state = open(f"/proc/{server_pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"llama-server {server_pid} is still there (state {state})")


def test_the_watchdog_is_off_at_zero_and_only_watches_llama_server(tmp_path):
    assert embedded_cfg().stall_seconds > 0
    assert embedded_cfg(stall_seconds=0).stall_seconds == 0


@needs_binary
@pytest.mark.slow
@pytest.mark.embedded
def test_eight_calls_finish_within_the_gateway_timeout_while_other_processes_load_both_cores(tmp_path):
    """The module-DAG stage 'hung' on llama-server with other work on the 2 cores: 2 llama.cpp threads that spin
    on a barrier collapse when a neighbour takes a core (3-5 completion tokens/s for 8 slots), so every call
    outlived the gateway's 120 s timeout, was cancelled and sent again from scratch, and no call ever finished.
    With the default settings 8 concurrent full-length calls must finish inside the timeout next to 2 busy
    processes."""
    import subprocess
    import sys
    import time

    settings = load_settings(overrides={"embedded": {"server": "llama-server"}}, environ={})
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        with embedded_server(settings.embedded, tmp_path) as url:
            gw = Gateway(settings, base_url=url, run_id="r", ledger=LedgerWriter(tmp_path / "ledger", "r"),
                         embedded_models={settings.embedded.alias})
            timeout = settings.gateway.timeout_seconds

            def call(i):
                t0 = time.monotonic()
                res = gw.chat("evolve", [{"role": "user", "content": f"Write a long story about the number {i}."}],
                              task_id=f"t{i}", max_tokens=settings.embedded.max_new_tokens, temperature=0.0)
                return res, time.monotonic() - t0

            with ThreadPoolExecutor(8) as pool:
                results = list(pool.map(call, range(8)))
            gw.close()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    for res, seconds in results:
        assert res.attempts == 1 and seconds < timeout, (res.attempts, seconds)  # no timeout, no retry from scratch
        assert res.completion_tokens > 0
    assert set(read_ledger(tmp_path)["outcome"]) == {"ok"}


def test_thread_count_defaults_to_half_the_usable_cpus():
    cpus = len(os.sched_getaffinity(0))
    assert llama_server.thread_count(embedded_cfg()) == max(1, cpus // 2)
    assert llama_server.thread_count(embedded_cfg(n_threads=3)) == 3
    cmd = llama_server.command(Path("/bin/llama-server"), embedded_cfg(n_threads=3), "m.gguf", 1234)
    assert cmd[cmd.index("--threads") + 1] == "3" and cmd[cmd.index("--threads-batch") + 1] == "3"
