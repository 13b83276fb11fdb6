"""Running the recording proxy: as a long-running service (uvicorn, no Prefect needed) or in a thread.

    evolforge proxy --upstream http://gpu-box:8000/v1 --port 8787 --out runs/agent-traffic
    evolforge proxy --check --upstream ...      # one call through the proxy to the upstream

`serve` blocks until interrupted; `running_proxy` starts it on a free loopback port in a background thread
(tests, `--check`, embedding it in a script) and yields its base URL. Starting, stopping and the thread are the
project's one server plumbing (tasks/core/serving.py); the proxy adds its own uvicorn protocol (a response head
sent with the first body write) and no X-Forwarded-* trust.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from typing import Iterator

from evolforge.config.settings import Settings
from evolforge.storage.fs import ensure_dir, is_remote, write_json_atomic
from evolforge.storage.proxy_sets import ProxyLayout, SessionParents
from evolforge.tasks.core import serving
from evolforge.tasks.proxy.app import build_app
from evolforge.tasks.proxy.calls import log
from evolforge.tasks.proxy.state import ProxyState
from evolforge.tasks.proxy.upstream import (
    ProxyConfigError,
    Upstream,
    check_bind,
    operator_keys,
    redact_url,
    upstream_of,
)


def check_settings(settings: Settings, upstream: str) -> tuple[Upstream, str | None]:
    """The checks that need no folder and no port: the bind address against the token, and the upstream (key
    transport, URL credentials). Raises ProxyConfigError / InsecureKeyTransport; the CLI runs it before it probes
    the port, so a settings error is reported as itself whatever listens on the port."""
    token = os.environ.get(settings.proxy.token_env) or None
    check_bind(settings.proxy.host, token)
    return upstream_of(settings, upstream, operator_keys(settings)["openai"]), token


def _checked(settings: Settings, upstream: str, out: str) -> tuple[Upstream, ProxyLayout, str | None]:
    """Check the bind address and the upstream (key transport, URL credentials) before anything is written; then
    make the folders and write proxy.json."""
    cfg = settings.proxy
    up, token = check_settings(settings, upstream)
    layout = ProxyLayout(out)
    if cfg.workers > 1:
        if cfg.translate in ("responses", "both"):
            raise ProxyConfigError(
                f"proxy.workers = {cfg.workers} cannot be combined with proxy.translate = {cfg.translate!r}: the "
                "translated Responses API keeps previous_response_id chains in one process's memory. Set "
                "proxy.workers = 1, or proxy.translate to \"off\" or \"messages\".")
        if is_remote(layout.root):
            raise ProxyConfigError(f"proxy.workers = {cfg.workers} needs a local --out folder (the workers share "
                                   "the session tree in an SQLite file there); set proxy.workers = 1 for this one.")
    for d in (layout.root, layout.records_dir, layout.events_dir, layout.ledger_dir):
        ensure_dir(d)
    write_json_atomic(layout.info, {"upstream": up.shown, "host": cfg.host, "port": cfg.port,
                                    "workers": cfg.workers, "token_required": bool(token), "started": time.time()})
    return up, layout, token


def _state(settings: Settings, upstream: str, out: str, embedded_models: set[str] | None = None) -> ProxyState:
    up, layout, token = _checked(settings, upstream, out)
    return ProxyState(settings=settings, upstream=up, layout=layout, token=token,
                      embedded_models=embedded_models or set())


class _CoalescingTransport:
    """A connection's transport that sends a response's head together with the first body write after it: one
    send (one loopback segment, one wake-up of the client) per non-streamed answer instead of two. uvicorn writes
    the status line and headers on `http.response.start` and the body on `http.response.body`, in the same step
    of the event loop for a whole answer; the head is held until the next write, or the loop's next turn at the
    latest (a stream's head never waits for its first chunk). Everything else is the real transport's."""

    __slots__ = ("_transport", "_loop", "_head")

    def __init__(self, transport, loop):
        self._transport, self._loop, self._head = transport, loop, None

    def write(self, data) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif data[:5] == b"HTTP/" and data[-4:] == b"\r\n\r\n":
            self._head = data
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name):
        return getattr(self._transport, name)


def _protocol():
    """uvicorn's httptools protocol with the coalescing transport (None: httptools missing, uvicorn picks)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None

    class Protocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(_CoalescingTransport(transport, self.loop))

    return Protocol


def _server(state: ProxyState, host: str, port: int):
    # proxy_headers off: X-Forwarded-* from a client is not trusted (and costs a header scan per call);
    # no Server header (the software is nobody's business, and each header costs two regex scans per answer)
    return serving.server(build_app(state), host, port, http=_protocol() or "auto", proxy_headers=False,
                          server_header=False)


def _quiet_gc() -> None:
    """A long-running server of many small short-lived objects: move what start-up made out of the
    collector's sight and collect the young generation less often (fewer pauses in the tail latency)."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 50)


def serve(settings: Settings, upstream: str, out: str, embedded_models: set[str] | None = None) -> None:
    """Serve until interrupted (SIGINT / SIGTERM): records are flushed on the way out. With proxy.workers > 1,
    this process binds the port and starts that many worker processes on it (`_worker`), then waits for them."""
    if settings.proxy.workers > 1:
        return _serve_workers(settings, upstream, out, embedded_models or set())
    state = _state(settings, upstream, out, embedded_models)
    _quiet_gc()
    serving.serve(_server(state, settings.proxy.host, settings.proxy.port))  # records flushed on the way out


def _serve_workers(settings: Settings, upstream: str, out: str, embedded_models: set[str]) -> None:
    """proxy.workers processes accepting on one listening socket (the idlest takes the next connection). Each
    builds its own state (records and ledger files named by its pid) and shares the session tree through
    PROXY_OUT/sessions.sqlite. SIGTERM / SIGINT stop them all gracefully."""
    import multiprocessing
    import signal

    cfg = settings.proxy
    _, layout, _ = _checked(settings, upstream, out)
    SessionParents(layout.sessions_db).close()  # the table exists before any worker opens it
    family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((cfg.host, cfg.port))
    sock.listen(2048)
    sock.set_inheritable(True)
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    procs = [ctx.Process(target=_worker, args=(settings, upstream, out, embedded_models, sock), daemon=False,
                         name=f"evolforge-proxy-{i}") for i in range(cfg.workers)]
    stopping = []

    def stop(signum, frame) -> None:
        stopping.append(signum)
        for p in procs:
            if p.is_alive() and p.pid:
                os.kill(p.pid, signal.SIGTERM)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for p in procs:
            p.start()
        sock.close()  # the workers have their own copies
        while any(p.is_alive() for p in procs):
            for p in procs:
                p.join(timeout=0.5)
                if p.exitcode not in (None, 0) and not stopping:  # a worker died: stop the others
                    log.error("recording proxy: worker %s exited with %s; stopping the others", p.name, p.exitcode)
                    stop(signal.SIGTERM, None)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _worker(settings: Settings, upstream: str, out: str, embedded_models: set[str], sock: socket.socket) -> None:
    """One worker process of `_serve_workers`: its own state on the shared socket."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us by SIGTERM
    up, layout, token = upstream_of(settings, upstream, operator_keys(settings)["openai"]), ProxyLayout(out), \
        os.environ.get(settings.proxy.token_env) or None
    state = ProxyState(settings=settings, upstream=up, layout=layout, token=token, embedded_models=embedded_models,
                       shared=SessionParents(layout.sessions_db))
    _quiet_gc()
    serving.serve(_server(state, settings.proxy.host, settings.proxy.port), [sock])


@contextlib.contextmanager
def running_proxy(settings: Settings, upstream: str, out: str, embedded_models: set[str] | None = None,
                  port: int | None = None) -> Iterator[str]:
    """The proxy on loopback in a background thread; yields its base URL (http://127.0.0.1:PORT)."""
    settings = settings.model_copy(update={"proxy": settings.proxy.model_copy(update={"host": "127.0.0.1"})})
    state = _state(settings, upstream, out, embedded_models)
    port = port or serving.free_port()
    with serving.in_thread(_server(state, "127.0.0.1", port), "evolforge-proxy", "the recording proxy"):
        yield f"http://127.0.0.1:{port}"


def check(settings: Settings, upstream: str, out: str, model: str, embedded_models: set[str] | None = None) -> dict:
    """One chat completion through a temporary proxy to the upstream: latency and the call's cost as the ledger
    prices it (`cost_usd`, `price_source`: the embedded model, named in `embedded_models`, is free), or the exact
    error and fix."""
    import httpx

    with running_proxy(settings, upstream, out, embedded_models) as url:
        t0 = time.perf_counter()
        try:
            r = httpx.post(f"{url}/s/preflight/v1/chat/completions", timeout=settings.proxy.timeout_seconds,
                           json={"model": model, "max_tokens": 4, "temperature": 0,
                                 "messages": [{"role": "user", "content": "Reply with the word OK."}]})
        except httpx.HTTPError as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}", "fix": "the proxy did not answer"}
        latency = round(time.perf_counter() - t0, 3)
    shown = redact_url(upstream)
    if r.status_code == 200:
        from evolforge.tasks.core.pricing import PriceBook, cache_tokens
        from evolforge.tasks.proxy.recording import model_name, usage_of

        body = r.json()
        usage = usage_of(body.get("usage"))[0] or {}
        served = model_name(body.get("model")) or model
        cost, source = PriceBook(settings.pricing, embedded_models or set()).cost(
            served, usage.get("prompt_tokens"), usage.get("completion_tokens"), *cache_tokens(usage))
        return {"ok": True, "latency_s": latency, "upstream": shown, "model": served, "cost_usd": cost,
                "price_source": source}
    try:
        message = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = r.text[:300]
    fix = {401: "the upstream refused the key: set EVOLFORGE_API_KEY (or OPENAI_API_KEY) for it",
           404: f"the upstream does not serve {model!r} (or the URL lacks /v1): check --model and --upstream",
           502: "start the upstream or fix --upstream (an OpenAI-compatible base URL ending in /v1)"}
    return {"ok": False, "status": r.status_code, "error": message,
            "fix": fix.get(r.status_code, "see the upstream's message"), "latency_s": latency,
            "detail": json.dumps({"upstream": shown})}
