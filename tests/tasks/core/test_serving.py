"""The one server plumbing (tasks/core/serving.py) the recording proxy and the sandbox service start theirs with:
a server in a thread is entered once it answers and is stopped on the way out; one that cannot bind its port is
reported at once, not after the start timeout."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from evolforge.tasks.core import serving


async def _hello(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        return await send({"type": "lifespan.shutdown.complete"})
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


def test_a_server_in_a_thread_answers_inside_the_block_and_is_gone_after():
    port = serving.free_port()
    srv = serving.server(_hello, "127.0.0.1", port)
    with serving.in_thread(srv, "test-serving", "the test server"):
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "hello"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/", timeout=2)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # uvicorn exits its thread
def test_a_server_that_cannot_bind_is_reported_at_once():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        srv = serving.server(_hello, "127.0.0.1", taken.getsockname()[1])
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="the test server did not start"):
            with serving.in_thread(srv, "test-serving", "the test server"):
                pass
    assert time.monotonic() - t0 < serving.START_TIMEOUT_S / 2
