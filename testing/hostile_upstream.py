"""An OpenAI-compatible upstream that answers in hostile shapes, for the recording proxy's tests and fuzz benchmark.

A request picks its reply with the header `X-Hostile-Reply: NAME` (a name of REPLIES or STREAMS); without it a
chat request gets a well-formed completion (streamed when its body asks). The replies are the shapes a broken
or malicious endpoint sends: `choices` as a dict, `message` as a string, `usage` as a list, a stream `delta`
that is a list, a tool-call `index` that is not an int, junk, a lone surrogate, JSON nested past any parser's
depth, a stream cut without [DONE] or in the middle of a chunk. The Responses API and the Messages API get shapes
of their own (API_REPLIES, API_STREAMS: an `output` or `content` that is not a list, a delta that is not a
string, an index that is not an int, a stream without its end event, `response.failed`, an `error` event). Every request is noted (`received`: path,
headers, raw body), so a test can see what reached the upstream.

    with HostileUpstream() as up:                     # in a thread, on 127.0.0.1 (host= to bind another address)
        httpx.post(f"{proxy}/v1/chat/completions", json=..., headers={"X-Hostile-Reply": "choices_dict"})
    python -m evolforge.testing.hostile_upstream --port 8098     # standalone (the fuzz benchmark)
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from evolforge.testing.net import SERVE_POLL

HEADER = "x-hostile-reply"


def _chat(content="ok", **over) -> dict:
    body = {"id": "chatcmpl-h", "object": "chat.completion", "created": 1, "model": "hostile-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    body.update(over)
    return body


def _with_choice(**fields) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop", **fields}
    return _chat(choices=[choice])


def _with_message(**fields) -> dict:
    return _with_choice(message={"role": "assistant", "content": "ok", **fields})


def _json(obj) -> tuple[int, str, bytes]:
    return 200, "application/json", json.dumps(obj).encode()


# non-streamed replies: name -> (status, content type, body)
REPLIES: dict[str, tuple[int, str, bytes]] = {
    "ok": _json(_chat()),
    "choices_dict": _json(_chat(choices={"0": {"message": {"role": "assistant", "content": "ok"}}})),
    "choices_str": _json(_chat(choices="ok")),
    "choice_str": _json(_chat(choices=["ok"])),
    "choice_list": _json(_chat(choices=[[1, 2]])),
    "message_str": _json(_with_choice(message="ok")),
    "message_list": _json(_with_choice(message=["ok"])),
    "content_dict": _json(_with_message(content={"text": "ok"})),
    "content_int": _json(_with_message(content=7)),
    "tool_calls_dict": _json(_with_message(tool_calls={"0": {"function": {"name": "f"}}})),
    "tool_calls_str": _json(_with_message(tool_calls="f()")),
    "tool_call_str": _json(_with_message(tool_calls=["f()"])),
    "reasoning_list": _json(_with_message(reasoning_content=["a"])),
    "usage_list": _json(_chat(usage=[5, 2])),
    "usage_str": _json(_chat(usage="5 in, 2 out")),
    "usage_tokens_str": _json(_chat(usage={"prompt_tokens": "5", "completion_tokens": "2"})),
    "usage_tokens_float": _json(_chat(usage={"prompt_tokens": 5.5, "completion_tokens": 2.25})),
    "usage_tokens_negative": _json(_chat(usage={"prompt_tokens": -5, "completion_tokens": -2})),
    "usage_tokens_bool": _json(_chat(usage={"prompt_tokens": True, "completion_tokens": False})),
    "usage_tokens_huge": (200, "application/json", json.dumps(_chat()).replace(
        '"prompt_tokens": 5', '"prompt_tokens": 123456789012345678901234567890').encode()),
    "model_list": _json(_chat(model=["a", "b"])),
    "model_dict": _json(_chat(model={"name": "m"})),
    "model_int": _json(_chat(model=7)),
    "id_dict": _json(_chat(id={"x": 1})),
    "finish_reason_dict": _json(_with_choice(finish_reason={"why": "stop"})),
    "logprobs_list": _json(_with_choice(logprobs=[1, 2])),
    "token_ids_str": _json(_with_choice(token_ids="1 2 3")),
    "prompt_token_ids_dict": _json(_chat(prompt_token_ids={"a": 1})),
    "body_list": _json([1, 2, 3]),
    "body_str": _json("ok"),
    "body_null": _json(None),
    "body_number": _json(42),
    "junk_html": (200, "text/html", b"<html>gateway hiccup</html>"),
    "empty_body": (200, "application/json", b""),
    "invalid_utf8": (200, "application/json", b'{"choices": [{"message": {"content": "\xff\xfe"}}]}'),
    "lone_surrogate": (200, "application/json", json.dumps(_chat(content="\ud800 x")).encode()),
    "surrogate_model": (200, "application/json", json.dumps(_chat(model="m\udfff")).encode()),
    "deep_nesting": (200, "application/json", b'{"choices": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
    "nan": (200, "application/json", b'{"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": NaN}}'),
    "big_int": (200, "application/json", b'{"choices": [{"message": {"content": "ok"}}], "x": ' + b"9" * 400 + b"}"),
    "error_str": (500, "application/json", b'{"error": "exploded"}'),
    "error_list": (400, "application/json", b'{"error": ["bad", "request"]}'),
    "error_junk": (503, "text/plain", b"upstream overloaded\n"),
    "error_nested": (429, "application/json", json.dumps({"error": {"message": {"deep": [1, 2]}}}).encode()),
    "status_201": (201, "application/json", json.dumps(_chat()).encode()),
}


def _chunk(delta=None, **over) -> dict:
    ch = {"index": 0, "delta": {"content": "ok"} if delta is None else delta, "finish_reason": None}
    out = {"id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 1, "model": "hostile-model", "choices": [ch]}
    out.update(over)
    return out


def _choice_chunk(**fields) -> dict:
    return _chunk(choices=[{"index": 0, "delta": {"content": "ok"}, "finish_reason": None, **fields}])


def _tool(index, **fields) -> dict:
    return _chunk({"tool_calls": [{"index": index, "id": "call_0", "type": "function",
                                   "function": {"name": "f", "arguments": "{}"}, **fields}]})


DONE = b"data: [DONE]\n\n"
USAGE = {"id": "chatcmpl-h", "object": "chat.completion.chunk", "choices": [],
         "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


def _events(*objs, done: bool = True) -> list[bytes]:
    out = [o if isinstance(o, bytes) else b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs]
    return out + ([DONE] if done else [])


def _sse(*objs, done: bool = True) -> list[bytes]:
    return _events(_chunk(), *objs, _chunk({}, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]), USAGE,
                   done=done)


# streamed replies: name -> the SSE events, sent as chunks of a chunked response ("cut": the connection is closed
# in the middle of the last event instead of ending the response)
STREAMS: dict[str, list[bytes]] = {
    "s_ok": _sse(),
    "s_delta_list": _sse(_chunk([1, 2])),
    "s_delta_str": _sse(_chunk("ok")),
    "s_content_int": _sse(_chunk({"content": 7})),
    "s_content_dict": _sse(_chunk({"content": {"t": "ok"}})),
    "s_reasoning_int": _sse(_chunk({"reasoning_content": 5})),
    "s_tool_index_str": _sse(_tool("zero")),
    "s_tool_index_float": _sse(_tool(1.5)),
    "s_tool_index_bool": _sse(_tool(True)),
    "s_tool_index_negative": _sse(_tool(-1)),
    "s_tool_index_huge": _sse(_tool(10 ** 30)),
    "s_tool_index_null": _sse(_tool(None)),
    "s_tool_calls_dict": _sse(_chunk({"tool_calls": {"0": {"function": {"name": "f"}}}})),
    "s_tool_call_str": _sse(_chunk({"tool_calls": ["f()"]})),
    "s_function_str": _sse(_tool(0, function="f()")),
    "s_name_int": _sse(_tool(0, function={"name": 5, "arguments": {"a": 1}})),
    "s_tool_id_dict": _sse(_tool(0, id={"x": 1}, type=["function"])),
    "s_chunk_list": _sse(b"data: [1, 2]\n\n"),
    "s_chunk_str": _sse(b'data: "ok"\n\n'),
    "s_chunk_null": _sse(b"data: null\n\n"),
    "s_choices_dict": _sse(_chunk(choices={"0": {"delta": {"content": "x"}}})),
    "s_choice_str": _sse(_chunk(choices=["ok"])),
    "s_choice_index_str": _sse(_chunk(choices=[{"index": "0", "delta": {"content": "x"}}])),
    "s_usage_list": _sse(_chunk({}, usage=[5, 2])),
    "s_usage_tokens_str": _sse(_chunk({}, usage={"prompt_tokens": "5", "completion_tokens": "2"})),
    "s_model_dict": _sse(_chunk(model={"m": 1})),
    "s_id_list": _sse(_chunk(id=[1])),
    "s_finish_reason_list": _sse(_choice_chunk(finish_reason=["stop"])),
    "s_logprobs_str": _sse(_choice_chunk(logprobs={"content": "x"})),
    "s_token_ids_str": _sse(_choice_chunk(token_ids="1 2")),
    "s_prompt_token_ids_dict": _sse(_chunk(prompt_token_ids={"a": 1})),
    "s_junk_event": _sse(b"data: {not json\n\n"),
    "s_surrogate": _sse(b'data: {"choices": [{"index": 0, "delta": {"content": "\\ud800"}}]}\n\n'),
    "s_deep_nesting": _sse(b"data: " + b"[" * 50_000 + b"]" * 50_000 + b"\n\n"),
    "s_no_done": _sse(done=False),
    "s_crlf": [e.replace(b"\n\n", b"\r\n\r\n") for e in _sse()],
    "s_no_separator": [b"data: " + json.dumps(_chunk()).encode() + b"\n" for _ in range(3)],
    "s_cut": _sse(),
}


# the Responses API and the Messages API (`POST .../responses`, `.../messages`): the same header picks a shape of
# API_REPLIES[api] or API_STREAMS[api]; without it a well-formed answer (streamed when the body asks)
def _resp(**over) -> dict:
    body = {"id": "resp_h", "object": "response", "status": "completed", "model": "hostile-model",
            "output": [{"type": "message", "id": "msg_h", "role": "assistant",
                        "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
            "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}}
    body.update(over)
    return body


def _resp_item(**fields) -> dict:
    return _resp(output=[{"type": "message", "id": "msg_h", "role": "assistant", **fields}])


def _msg(**over) -> dict:
    body = {"id": "msg_h", "type": "message", "role": "assistant", "model": "hostile-model",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 5, "output_tokens": 2}}
    body.update(over)
    return body


_COMMON_BAD = {
    "body_list": _json([1, 2, 3]),
    "body_str": _json("ok"),
    "junk_html": (200, "text/html", b"<html>gateway hiccup</html>"),
    "empty_body": (200, "application/json", b""),
    "deep_nesting": (200, "application/json", b'{"output": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
}
API_REPLIES: dict[str, dict[str, tuple[int, str, bytes]]] = {
    "responses": {
        "ok": _json(_resp()),
        "output_missing": _json({k: v for k, v in _resp().items() if k != "output"}),
        "output_dict": _json(_resp(output={"0": {}})),
        "output_str": _json(_resp(output="ok")),
        "item_str": _json(_resp(output=["ok"])),
        "content_str": _json(_resp_item(content="ok")),
        "content_item_str": _json(_resp_item(content=["ok"])),
        "text_int": _json(_resp_item(content=[{"type": "output_text", "text": 7}])),
        "fc_args_dict": _json(_resp(output=[{"type": "function_call", "call_id": "c", "name": "f",
                                             "arguments": {"a": 1}}])),
        "usage_list": _json(_resp(usage=[5, 2])),
        "usage_tokens_str": _json(_resp(usage={"input_tokens": "5", "output_tokens": "2"})),
        "usage_tokens_negative": _json(_resp(usage={"input_tokens": -5, "output_tokens": 2})),
        "model_dict": _json(_resp(model={"m": 1})),  # odd optional fields: dropped from the record, the answer passes
        "id_list": _json(_resp(id=[1])),
        "status_dict": _json(_resp(status={"s": 1})),
        "lone_surrogate": (200, "application/json", json.dumps(_resp_item(
            content=[{"type": "output_text", "text": "\ud800 x"}])).encode()),
        **_COMMON_BAD,
    },
    "messages": {
        "ok": _json(_msg()),
        "content_missing": _json({k: v for k, v in _msg().items() if k != "content"}),
        "content_dict": _json(_msg(content={"0": {"type": "text", "text": "ok"}})),
        "content_str": _json(_msg(content="ok")),
        "block_str": _json(_msg(content=["ok"])),
        "text_int": _json(_msg(content=[{"type": "text", "text": 7}])),
        "thinking_list": _json(_msg(content=[{"type": "thinking", "thinking": ["a"]}])),
        "tool_input_str": _json(_msg(content=[{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}])),
        "usage_list": _json(_msg(usage=[5, 2])),
        "usage_tokens_str": _json(_msg(usage={"input_tokens": "5", "output_tokens": "2"})),
        "usage_cache_float": _json(_msg(usage={"input_tokens": 5, "output_tokens": 2,
                                              "cache_read_input_tokens": 1.5})),
        "model_dict": _json(_msg(model={"m": 1})),
        "id_list": _json(_msg(id=[1])),
        "stop_reason_dict": _json(_msg(stop_reason={"s": 1})),
        "lone_surrogate": (200, "application/json", json.dumps(_msg(content=[{"type": "text", "text": "\ud800"}])).encode()),
        **_COMMON_BAD,
    },
}
API_PASSING = {"ok", "model_dict", "id_list", "status_dict", "stop_reason_dict", "lone_surrogate"}


def _typed(kind: str, **data) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


def _resp_sse(*middle: bytes, end: bytes | None = None) -> list[bytes]:
    start = _resp(status="in_progress", output=[], usage=None)
    item = {"type": "message", "id": "msg_h", "role": "assistant", "content": []}
    return [e for e in (_typed("response.created", response=start),
            _typed("response.output_item.added", output_index=0, item=item),
            _typed("response.output_text.delta", item_id="msg_h", output_index=0, content_index=0, delta="ok"),
            *middle,
            _typed("response.completed", response=_resp()) if end is None else end) if e]  # b"": no end event


def _msg_sse(*middle: bytes, end: bytes | None = None) -> list[bytes]:
    return [e for e in (_typed("message_start", message=_msg(content=[], stop_reason=None, usage={"input_tokens": 5,
                                                                                        "output_tokens": 1})),
            _typed("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            _typed("content_block_delta", index=0, delta={"type": "text_delta", "text": "ok"}),
            *middle,
            _typed("content_block_stop", index=0),
            _typed("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 2}),
            _typed("message_stop") if end is None else end) if e]


API_STREAMS: dict[str, dict[str, list[bytes]]] = {
    "responses": {
        "s_ok": _resp_sse(),
        "s_crlf": [e.replace(b"\n", b"\r\n") for e in _resp_sse()],
        "s_model_dict": _resp_sse(_typed("response.in_progress", response=_resp(model={"m": 1}, output=[]))),
        "s_no_completed": _resp_sse(end=b""),
        # llama-server's deltas name their item by item_id only; the completed response repeats no output
        "s_item_id_only": [_typed("response.created", response=_resp(status="in_progress", output=[], usage=None)),
                           _typed("response.output_item.added", output_index=0, item={
                               "type": "message", "id": "msg_h", "role": "assistant", "content": []}),
                           _typed("response.output_text.delta", item_id="msg_h", content_index=0, delta="ok"),
                           _typed("response.completed", response=_resp(output=[]))],
        "s_failed": _resp_sse(end=_typed("response.failed", response=_resp(status="failed", error={
            "code": "server_error", "message": "the model broke"}))),
        "s_error_event": _resp_sse(end=_typed("error", code="server_error", message="overloaded")),
        "s_delta_int": _resp_sse(_typed("response.output_text.delta", output_index=0, content_index=0, delta=7)),
        "s_output_index_str": _resp_sse(_typed("response.output_text.delta", output_index="0", delta="x")),
        "s_output_index_huge": _resp_sse(_typed("response.function_call_arguments.delta", output_index=10 ** 30,
                                                delta="x")),
        "s_item_str": _resp_sse(_typed("response.output_item.done", output_index=0, item="ok")),
        "s_response_str": _resp_sse(_typed("response.in_progress", response="ok")),
        "s_usage_str": _resp_sse(end=_typed("response.completed", response=_resp(usage="5 in"))),
        "s_completed_output_bad": _resp_sse(end=_typed("response.completed", response=_resp(output=[1, 2]))),
        "s_no_type": _resp_sse(b'data: {"delta": "x"}\n\n'),
        "s_chunk_list": _resp_sse(b"data: [1, 2]\n\n"),
        "s_junk_event": _resp_sse(b"data: {not json\n\n"),
        "s_deep_nesting": _resp_sse(b"data: " + b"[" * 50_000 + b"]" * 50_000 + b"\n\n"),
        "s_cut": _resp_sse(),
    },
    "messages": {
        "s_ok": _msg_sse(),
        "s_crlf": [e.replace(b"\n", b"\r\n") for e in _msg_sse()],
        "s_ping_and_unknown": _msg_sse(_typed("ping"), _typed("content_block_delta", index=0,
                                                              delta={"type": "future_delta", "x": 1})),
        "s_bad_partial_json": _msg_sse(_typed("content_block_start", index=1, content_block={
            "type": "tool_use", "id": "t", "name": "f", "input": {}}),
            _typed("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": '{"a": '})),
        "s_no_stop": _msg_sse(end=b""),
        "s_error_event": _msg_sse(end=_typed("error", error={"type": "overloaded_error", "message": "overloaded"})),
        "s_delta_str": _msg_sse(_typed("content_block_delta", index=0, delta="x")),
        "s_text_int": _msg_sse(_typed("content_block_delta", index=0, delta={"type": "text_delta", "text": 7})),
        "s_index_str": _msg_sse(_typed("content_block_delta", index="0", delta={"type": "text_delta", "text": "x"})),
        "s_block_str": _msg_sse(_typed("content_block_start", index=1, content_block="ok")),
        "s_message_str": [_typed("message_start", message="ok"), *_msg_sse()[1:]],
        "s_usage_str": _msg_sse(_typed("message_delta", delta={}, usage={"output_tokens": "2"})),
        "s_no_type": _msg_sse(b'data: {"index": 0}\n\n'),
        "s_junk_event": _msg_sse(b"data: {not json\n\n"),
        "s_cut": _msg_sse(),
    },
}
API_STREAMS_PASSING = {"s_ok", "s_crlf", "s_model_dict", "s_ping_and_unknown", "s_bad_partial_json", "s_item_id_only"}


def _api_of(path: str) -> str | None:
    tail = path.split("?", 1)[0].rstrip("/")
    return "responses" if tail.endswith("/responses") else "messages" if tail.endswith("/messages") else None


class HostileUpstream:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.received: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _body(self) -> bytes:
                if self.headers.get("transfer-encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if not size:
                            self.rfile.readline()
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("content-length") or 0))

            def _answer(self):
                raw = self._body()
                with outer.lock:
                    outer.received.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                           "body": raw})
                name = self.headers.get(HEADER) or ""
                api = _api_of(self.path)
                if api and self.command == "POST":
                    if name in API_STREAMS[api]:
                        return self._stream(API_STREAMS[api][name], cut=name == "s_cut")
                    if name in API_REPLIES[api]:
                        return self._send(*API_REPLIES[api][name])
                    try:
                        streamed = bool(json.loads(raw or b"{}").get("stream")) is True
                    except (ValueError, AttributeError, RecursionError):
                        streamed = False
                    return self._stream(API_STREAMS[api]["s_ok"]) if streamed else self._send(*API_REPLIES[api]["ok"])
                if self.command == "GET" and self.path.rstrip("/").endswith("/models") and not name:
                    return self._send(*_json({"object": "list", "data": [{"id": "hostile-model", "object": "model"}]}))
                if name in STREAMS:
                    return self._stream(STREAMS[name], cut=name == "s_cut")
                if name in REPLIES:
                    return self._send(*REPLIES[name])
                try:
                    streamed = bool(json.loads(raw or b"{}").get("stream")) is True
                except (ValueError, AttributeError, RecursionError):
                    streamed = False
                return self._stream(STREAMS["s_ok"]) if streamed else self._send(*REPLIES["ok"])

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

            def _send(self, status: int, ctype: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, events: list[bytes], cut: bool = False) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for i, ev in enumerate(events):
                    if cut and i == len(events) - 1:
                        self.wfile.write(f"{len(ev):x}\r\n".encode() + ev[: len(ev) // 2])
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self.wfile.write(f"{len(ev):x}\r\n".encode() + ev + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 256

        self.httpd = Server((host, port), Handler)
        self.base_url = f"http://{host}:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> "HostileUpstream":
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": SERVE_POLL}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8098)
    a = ap.parse_args()
    up = HostileUpstream(a.host, a.port)
    print(f"hostile upstream on {up.base_url}", flush=True)
    up.httpd.serve_forever()
