"""An OpenAI-compatible upstream for agent-traffic tests: chat (streamed or not), tool calls (parallel too),
text completions, token ids and logprobs on request, and faults on demand. It keeps every byte it sent, so a
test can check that what a client received through the proxy is exactly what the upstream sent.

- A chat request with `tools` whose last user message contains CALL_TOOLS gets two parallel tool calls
  (get_weather for Paris and for Oslo); after tool results it answers in text.
- `stream: true`: SSE chunks of a few characters, `delay` seconds apart, tool-call deltas split across
  chunks, a final usage chunk with `stream_options.include_usage`, then `data: [DONE]`.
- `return_token_ids: true` (vLLM's extension): `token_ids` per choice (one id per character) and
  `prompt_token_ids`; `logprobs: true`: a logprob per character.
- `fault`: "junk" (200 with a non-JSON body), "500", "cut" (a stream that stops without [DONE]).
- `POST /v1/responses` and `/v1/messages` (streamed or not) and `/v1/messages/count_tokens`: OpenAI's
  Responses API and Anthropic's Messages API, scripted the same way (testing/agent_apis.py).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from evolforge.testing import agent_apis
from evolforge.testing.net import SERVE_POLL


def reply_text(body: dict) -> str:
    msgs = body.get("messages") or []
    last = msgs[-1] if msgs else {}
    if last.get("role") == "tool":
        return "It is sunny in Paris and cold in Oslo."
    return f"Echo: {str(last.get('content', ''))[:60]}"


def tool_calls(body: dict) -> list[dict] | None:
    msgs = body.get("messages") or []
    if body.get("tools") and msgs and msgs[-1].get("role") == "user" and "CALL_TOOLS" in str(msgs[-1].get("content")):
        return [{"id": f"call_{i}", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
                for i, city in enumerate(("Paris", "Oslo"))]
    return None


def usage(body: dict, text: str) -> dict:
    pt = max(1, len(json.dumps(body.get("messages") or body.get("prompt") or "")) // 4)
    return {"prompt_tokens": pt, "completion_tokens": max(1, len(text) // 4), "total_tokens": pt + max(1, len(text) // 4)}


class AgentUpstream:
    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.responses = 0  # Responses API calls answered (their ids: resp_1, resp_2, ...)
        self.fault: str | None = None
        self.sent: list[bytes] = []  # every response body, in order
        self.received: list[dict] = []  # every request: path, headers, body
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer._note(self, None)
                if self.path.rstrip("/").endswith("/models"):
                    return self._send(200, {"object": "list", "data": [{"id": "agent-model", "object": "model"}]})
                return self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw) if raw else {}
                outer._note(self, body)
                path = self.path.split("?", 1)[0]  # Claude Code asks for /v1/messages?beta=true
                if outer.fault == "500":
                    return self._send(500, {"error": {"message": "upstream exploded"}})
                if outer.fault == "junk":
                    return self._raw(200, b"<html>gateway hiccup</html>", "text/html")
                if path.endswith("/messages/count_tokens"):
                    return self._send(200, agent_apis.count_tokens(body))
                if path.endswith("/responses"):
                    outer.responses += 1
                    rid = f"resp_{outer.responses}"
                    if body.get("stream"):
                        return self._stream(body, agent_apis.responses_events(body, rid))
                    return self._send(200, agent_apis.responses_body(body, rid))
                if path.endswith("/messages"):
                    mid = f"msg_{len(outer.received)}"
                    if body.get("stream"):
                        return self._stream(body, agent_apis.messages_events(body, mid))
                    return self._send(200, agent_apis.messages_body(body, mid))
                if path.endswith("/chat/completions"):
                    return self._stream(body) if body.get("stream") else self._send(200, self._chat(body))
                if path.endswith("/completions"):
                    text = f"Completion of: {str(body.get('prompt'))[:40]}"
                    return self._send(200, {"id": "cmpl-1", "object": "text_completion", "model": body.get("model"),
                                            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                                            "usage": usage(body, text)})
                return self._send(404, {"error": {"message": "not found"}})

            def _chat(self, body: dict) -> dict:
                calls = tool_calls(body)
                text = None if calls else reply_text(body)
                choice = {"index": 0, "message": {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})},
                          "finish_reason": "tool_calls" if calls else "stop"}
                out = {"id": "chatcmpl-agent", "object": "chat.completion", "created": 1, "model": body.get("model"),
                       "choices": [choice], "usage": usage(body, text or json.dumps(calls))}
                if body.get("return_token_ids"):
                    choice["token_ids"] = [ord(c) for c in (text or "")]
                    out["prompt_token_ids"] = [1, 2, 3]
                if body.get("logprobs"):
                    choice["logprobs"] = {"content": [{"token": c, "logprob": -0.5} for c in (text or "")]}
                return out

            def _stream(self, body: dict, events: list | None = None) -> None:
                if events is not None:
                    if outer.fault == "cut":
                        events = events[:3] + [events[3][:len(events[3]) // 2]]
                elif outer.fault == "cut":
                    events = [self._chunk(body, {"role": "assistant", "content": "partial"})]
                else:
                    events = self._events(body)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                sent = b""
                for ev in events:
                    data = ev if isinstance(ev, bytes) else f"data: {json.dumps(ev)}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    sent += data
                    if outer.delay:
                        time.sleep(outer.delay)
                with outer.lock:  # noted before the last chunk ends the response
                    outer.sent.append(sent)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _chunk(self, body, delta, finish=None, **extra):
                ch = {"index": 0, "delta": delta, "finish_reason": finish, **extra}
                return {"id": "chatcmpl-agent", "object": "chat.completion.chunk", "created": 1,
                        "model": body.get("model"), "choices": [ch]}

            def _events(self, body: dict) -> list:
                calls = tool_calls(body)
                evs: list = [self._chunk(body, {"role": "assistant", "content": "" if not calls else None})]
                if calls:
                    for i, c in enumerate(calls):
                        args = c["function"]["arguments"]
                        evs.append(self._chunk(body, {"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                                                                      "function": {"name": "get_weather", "arguments": ""}}]}))
                        for j in range(0, len(args), 5):
                            evs.append(self._chunk(body, {"tool_calls": [{"index": i, "function": {"arguments": args[j:j + 5]}}]}))
                    evs.append(self._chunk(body, {}, "tool_calls"))
                    text = json.dumps(calls)
                else:
                    text = reply_text(body)
                    for j in range(0, len(text), 4):
                        piece = text[j:j + 4]
                        extra = {}
                        if body.get("return_token_ids"):
                            extra["token_ids"] = [ord(c) for c in piece]
                        if body.get("logprobs"):
                            extra["logprobs"] = {"content": [{"token": c, "logprob": -0.5} for c in piece]}
                        evs.append(self._chunk(body, {"content": piece}, **extra))
                    evs.append(self._chunk(body, {}, "stop"))
                if (body.get("stream_options") or {}).get("include_usage"):
                    evs.append({"id": "chatcmpl-agent", "object": "chat.completion.chunk", "created": 1,
                                "model": body.get("model"), "choices": [], "usage": usage(body, text)})
                evs.append(b"data: [DONE]\n\n")
                return evs

            def _send(self, status: int, obj: dict) -> None:
                self._raw(status, json.dumps(obj).encode(), "application/json")

            def _raw(self, status: int, data: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                with outer.lock:  # noted before the bytes go out: a client that has them finds them here
                    outer.sent.append(data)
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 256

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def _note(self, handler, body) -> None:
        with self.lock:
            self.received.append({"path": handler.path, "headers": dict(handler.headers), "body": body})

    def __enter__(self) -> "AgentUpstream":
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": SERVE_POLL}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
