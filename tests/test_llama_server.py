"""The embedded model on llama.cpp's llama-server: server choice, gateway cap, and real concurrent calls."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor

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
    cfg = embedded_cfg(server_binary=str(tmp_path / "missing"))
    assert llama_server.chosen_server(cfg) == "llama-cpp-python"
    assert llama_server.concurrency_cap(cfg) == 2  # one call at a time there: more only queue
    pytest.importorskip("llama_cpp.server")
    assert server_command(cfg, 9999)[1:3] == ["-m", "llama_cpp.server"]


def test_auto_picks_llama_server_and_its_slots_cap_the_gateway(tmp_path):
    cfg = embedded_cfg(server="auto", server_binary=str(fake_binary(tmp_path)), parallel=6, n_ctx=1024)
    assert llama_server.chosen_server(cfg) == "llama-server"
    assert llama_server.chosen_server(embedded_cfg(server_binary=str(fake_binary(tmp_path)))) == "llama-cpp-python"
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
