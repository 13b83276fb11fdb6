"""Serving an ASGI app of this project on a port (uvicorn): the recording proxy (`evolforge proxy`,
tasks/proxy/server.py) and the sandbox service (`evolforge sandbox-serve`, tasks/sandbox/service.py) start and stop
theirs here. uvicorn is imported only when a server is made (a command's --help loads no server library).

- `server(app, host, port, **options)`: a uvicorn server with the settings every service here shares: warnings
  only, no access log, the app's lifespan on (what it opened is closed, and what it wrote flushed, at shutdown),
  idle keep-alive connections closed after 30 s; `options` are the service's own (uvicorn.Config's keywords).
- `serve(server, sockets=None)`: in the foreground until SIGINT / SIGTERM (uvicorn stops gracefully, then re-raises
  Ctrl-C: no traceback), on its host and port, or on `sockets` already bound (the proxy's worker processes).
- `in_thread(server, name, what)`: in a background thread (tests, `--check`, a script), entered once it serves
  (RuntimeError "{what} did not start" after 30 s, or as soon as the thread died); stopped and joined on the way
  out.
- `free_port()`: a port free on loopback now.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Iterator

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


def server(app, host: str, port: int, **options: Any):
    """A uvicorn.Server for `app` on host:port (not started)."""
    import uvicorn

    config = dict(log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=30)
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, **{**config, **options}))


def serve(srv, sockets: list[socket.socket] | None = None) -> None:
    """Serve until interrupted (SIGINT / SIGTERM); the lifespan's shutdown has run when this returns."""
    try:
        srv.run(sockets=sockets)
    except KeyboardInterrupt:  # uvicorn has stopped gracefully, then re-raised Ctrl-C: no traceback
        pass


@contextlib.contextmanager
def in_thread(srv, name: str, what: str) -> Iterator[None]:
    """`srv` serving in a daemon thread named `name` for the time of the block."""
    thread = threading.Thread(target=srv.run, name=name, daemon=True)
    thread.start()
    deadline = time.time() + START_TIMEOUT_S
    while not srv.started:
        if not thread.is_alive() or time.time() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.02)
    try:
        yield
    finally:
        srv.should_exit = True
        thread.join(timeout=STOP_TIMEOUT_S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
