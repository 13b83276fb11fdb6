"""Loopback helpers for tests and benchmarks: a free port, waiting for a server to answer, and how often a test
server's serve_forever loop looks for its shutdown."""

from __future__ import annotations

import os
import random
import socket
import time
import urllib.request

# Ports for the servers tests start are drawn below the kernel's ephemeral range (32768-60999 on Linux, where the
# source ports of outgoing connections come from): a port found free here cannot be taken by some client's
# connection before the server binds it. Each pytest-xdist worker (PYTEST_XDIST_WORKER=gwN) draws from a block of
# its own, so two workers never hand out the same port; other processes draw from the shared block at the end.
_PORT_BASE, _BLOCK, _BLOCKS = 20000, 1000, 12  # 20000-31999
_next: dict[int, int] = {}

# socketserver's serve_forever(poll_interval=0.5) checks for shutdown() twice a second, so every test server's
# stop took up to half a second: about 0.45 s of wall time per proxy test, measured. A test server polls faster.
SERVE_POLL = 0.05


def _block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        return int(worker[2:]) % (_BLOCKS - 1)
    return _BLOCKS - 1


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now: the next free one of this process's block (from a random start, so two
    test sessions on one machine rarely try the same one), else any port the kernel picks."""
    block = _block()
    lo = _PORT_BASE + block * _BLOCK
    offset = _next.get(block, random.randrange(_BLOCK))
    for i in range(_BLOCK):
        port = lo + (offset + i) % _BLOCK
        if _bindable(port):
            _next[block] = (offset + i + 1) % _BLOCK
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, timeout: float = 60) -> None:
    """Return once GET url answers (any status that urllib does not raise for); OSError after timeout s."""
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
