"""An instant OpenAI-compatible chat endpoint for benchmarks (asyncio, HTTP/1.1 keep-alive).

Same replies as testing/scripted_server.py (deterministic functions of the
prompt), but with a minimal asyncio HTTP server so the endpoint itself costs
as little CPU as possible and the benchmark measures the pipeline.

    python testing/instant_server.py --port 8099 [--chunks 8 --chunk-delay 0.01]

A request with `"stream": true` gets the reply as `--chunks` SSE chunks, `--chunk-delay` seconds apart
(chunked transfer encoding), then `data: [DONE]`: what a streaming benchmark needs to see that chunks pass
through a proxy as they are sent.

`POST .../responses` (OpenAI's Responses API) and `POST .../messages` (Anthropic's Messages API) are answered in
their own forms, the same text: a response with one message item (`output_text`) or a message with one text
block, with each API's usage; streamed as that API's typed events (`response.created`, `output_item.added`,
`output_text.delta` per chunk, `output_item.done`, `response.completed`; `message_start`,
`content_block_start`, `content_block_delta` text_delta per chunk, `content_block_stop`, `message_delta`,
`message_stop`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from evolforge.testing.scripted_server import MODELS as MODEL_IDS
from evolforge.testing.scripted_server import completion, reply_for  # noqa: E402

MODELS = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in MODEL_IDS]}).encode()


STREAM = {"chunks": 8, "delay": 0.01}


def _usage(req: dict, text: str) -> tuple[int, int]:
    return max(1, len(str(req.get("messages") or req.get("input"))) // 4), max(1, len(text) // 4)


def response_body(req: dict, text: str) -> dict:
    """A Responses API answer: one message item."""
    pt, ct = _usage(req, text)
    return {"id": "resp_instant", "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": req.get("model", "scripted"),
            "output": [{"type": "message", "id": "msg_instant", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "usage": {"input_tokens": pt, "output_tokens": ct, "total_tokens": pt + ct}}


def message_body(req: dict, text: str) -> dict:
    """A Messages API answer: one text block."""
    pt, ct = _usage(req, text)
    return {"id": "msg_instant", "type": "message", "role": "assistant", "model": req.get("model", "scripted"),
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": pt, "output_tokens": ct}}


def _events(api: str, req: dict, pieces: list[str]):
    """The stream of one API as (event name or None, data) pairs, the pieces as its text deltas."""
    text = "".join(pieces)
    if api == "responses":
        full = response_body(req, text)
        item = {**full["output"][0], "status": "in_progress", "content": []}
        yield "response.created", {"type": "response.created",
                                   "response": {**full, "status": "in_progress", "output": [], "usage": None}}
        yield "response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}
        for p in pieces:
            yield "response.output_text.delta", {"type": "response.output_text.delta", "output_index": 0,
                                                 "item_id": item["id"], "content_index": 0, "delta": p}
        yield "response.output_item.done", {"type": "response.output_item.done", "output_index": 0,
                                            "item": full["output"][0]}
        yield "response.completed", {"type": "response.completed", "response": full}
    elif api == "messages":
        full = message_body(req, text)
        yield "message_start", {"type": "message_start", "message": {**full, "content": [], "stop_reason": None,
                                                                     "usage": {**full["usage"], "output_tokens": 1}}}
        yield "content_block_start", {"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "text", "text": ""}}
        for p in pieces:
            yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": p}}
        yield "content_block_stop", {"type": "content_block_stop", "index": 0}
        yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                "usage": {"output_tokens": full["usage"]["output_tokens"]}}
        yield "message_stop", {"type": "message_stop"}
    else:
        for i, p in enumerate(pieces):
            yield None, {"id": "c", "object": "chat.completion.chunk", "model": req.get("model"),
                         "choices": [{"index": 0, "delta": {"content": p},
                                      "finish_reason": None if i < len(pieces) - 1 else "stop"}]}


async def stream(req: dict, writer: asyncio.StreamWriter, api: str = "chat") -> None:
    """The reply in `--chunks` pieces, `--chunk-delay` seconds apart (an event per piece, the API's others
    around them sent with the first and the last piece)."""
    text = reply_for(req)
    n = STREAM["chunks"]
    step = max(1, -(-len(text) // n))
    pieces = [text[i * step:(i + 1) * step] for i in range(n)]
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    data = b""
    sent = 0
    for name, ev in _events(api, req, pieces):
        data += (b"event: %s\n" % name.encode() if name else b"") + b"data: " + json.dumps(ev).encode() + b"\n\n"
        is_delta = name is None or name in ("response.output_text.delta", "content_block_delta")
        if is_delta:
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            data = b""
            sent += 1
            await writer.drain()
            await asyncio.sleep(STREAM["delay"])
    if api == "chat":
        data += b"data: [DONE]\n\n"
    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
    await writer.drain()


def api_of(path: bytes) -> str:
    path = path.split(b"?", 1)[0].rstrip(b"/")
    return "responses" if path.endswith(b"/responses") else "messages" if path.endswith(b"/messages") else "chat"


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
                api = api_of(path)
                if req.get("stream"):
                    await stream(req, writer, api)
                    continue
                make = {"chat": completion, "responses": response_body, "messages": message_body}[api]
                data = json.dumps(make(req, reply_for(req))).encode()
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
