"""Loopback helpers for tests and benchmarks: a free port, and waiting for a server to answer."""

from __future__ import annotations

import socket
import time
import urllib.request


def free_port() -> int:
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
