"""An instant OpenAI-compatible chat endpoint for benchmarks (asyncio, HTTP/1.1 keep-alive).

Same replies as testing/scripted_server.py (deterministic functions of the
prompt), but with a minimal asyncio HTTP server so the endpoint itself costs
as little CPU as possible and the benchmark measures the pipeline.

    python testing/instant_server.py --port 8099 [--chunks 8 --chunk-delay 0.01]

A request with `"stream": true` gets the reply as `--chunks` SSE chunks, `--chunk-delay` seconds apart
(chunked transfer encoding), then `data: [DONE]`: what a streaming benchmark needs to see that chunks pass
through a proxy as they are sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from evolforge.testing.scripted_server import MODELS as MODEL_IDS
from evolforge.testing.scripted_server import completion, reply_for  # noqa: E402

MODELS = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in MODEL_IDS]}).encode()


STREAM = {"chunks": 8, "delay": 0.01}


async def stream(req: dict, writer: asyncio.StreamWriter) -> None:
    text = reply_for(req)
    n = STREAM["chunks"]
    step = max(1, -(-len(text) // n))
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for i in range(n):
        piece = text[i * step:(i + 1) * step]
        ev = {"id": "c", "object": "chat.completion.chunk", "model": req.get("model"),
              "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None if i < n - 1 else "stop"}]}
        data = b"data: " + json.dumps(ev).encode() + b"\n\n"
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await writer.drain()
        await asyncio.sleep(STREAM["delay"])
    done = b"data: [DONE]\n\n"
    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    await writer.drain()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            method, path = lines[0].split(b" ")[:2]
            length = 0
            for line in lines[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:].strip())
            body = await reader.readexactly(length) if length else b""
            if method == b"GET":
                data = MODELS
            else:
                req = json.loads(body)
                if req.get("stream"):
                    await stream(req, writer)
                    continue
                data = json.dumps(completion(req, reply_for(req))).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(data) + data)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=512)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8099)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--chunk-delay", type=float, default=0.01)
    a = ap.parse_args()
    STREAM.update(chunks=a.chunks, delay=a.chunk_delay)
    asyncio.run(main(a.port))
