"""A scripted upstream that speaks only chat completions, as vLLM's, SGLang's and llama-cpp-python's servers and
most hosted OpenAI-compatible APIs do: `POST /v1/chat/completions` (streamed or not) and `GET /v1/models`; any
other POST (`/v1/messages`, `/v1/responses`) gets a 404. For the recording proxy's translation
(proxy.translate): what the client sends in the Messages or Responses API must arrive here as a chat request.

Script (the same words as testing/agent_apis.py, so a translated call answers as a passed-through one would), on
the last message that is not a system message:
- tools offered and CALL_TOOLS in the last user message: reasoning_content "The user wants two cities.", then two
  tool calls (get_weather for Paris and for Oslo), finish_reason tool_calls;
- tools offered and BAD_JSON in it: one get_weather call whose arguments are not JSON (a small model's slip);
- the agent CLIs' script (agent_apis.shell_call / cli_answer): a shell tool call running CLI_COMMAND, then the
  answer from its result;
- after tool results (a last message of role tool): "It is sunny in Paris and cold in Oslo.";
- anything else: "Echo: <last user text>", with " [N image(s)]" when the last user turn carried image parts.
usage: prompt_tokens about len(messages JSON) / 4, of which `cached` are reported as
prompt_tokens_details.cached_tokens (2 by default); a stream sends it in a final chunk when
stream_options.include_usage asks, its chunks `delay` seconds apart. `fault = "cut"` stops a stream after its third
event without [DONE].
Every request is kept (`received`: path, headers, body) and every response body sent whole (`sent`); `aborted`
counts the streams the proxy hung up on before their end.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from evolforge.testing import agent_apis
from evolforge.testing.net import SERVE_POLL

REASONING = "The user wants two cities."
BAD_ARGUMENTS = '{"city": "Par'


def _text_of(content) -> tuple[str, int]:
    if isinstance(content, str):
        return content, 0
    parts = content if isinstance(content, list) else []
    text = " ".join(p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text")
    return text, sum(isinstance(p, dict) and p.get("type") == "image_url" for p in parts)


def reply(body: dict) -> dict:
    """The scripted assistant message: {"content", "reasoning_content", "tool_calls"} (None where absent)."""
    msgs = [m for m in body.get("messages") or [] if m.get("role") != "system"]
    last = msgs[-1] if msgs else {}
    tools = body.get("tools")
    if last.get("role") == "tool":
        if agent_apis.is_cli_conversation(body):
            return {"content": agent_apis.cli_answer(str(last.get("content"))), "reasoning_content": None,
                    "tool_calls": None}
        return {"content": agent_apis.ANSWER, "reasoning_content": None, "tool_calls": None}
    text, images = _text_of(last.get("content"))
    shell = agent_apis.shell_call(tools, text) if last.get("role") == "user" else None
    if shell:
        return {"content": None, "reasoning_content": None, "tool_calls": [
            {"id": "call_shell", "type": "function", "function": {"name": shell[0], "arguments": json.dumps(shell[1])}}]}
    if tools and "CALL_TOOLS" in text:
        return {"content": None, "reasoning_content": REASONING, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
            for i, city in enumerate(agent_apis.CITIES)]}
    if tools and "BAD_JSON" in text:
        return {"content": None, "reasoning_content": None, "tool_calls": [
            {"id": "call_bad", "type": "function", "function": {"name": "get_weather", "arguments": BAD_ARGUMENTS}}]}
    echo = f"Echo: {text[:60]}" + (f" [{images} image(s)]" if images else "")
    return {"content": echo, "reasoning_content": None, "tool_calls": None}


class ChatUpstream:
    def __init__(self, cached: int = 2, delay: float = 0.0):
        self.cached = cached
        self.delay = delay  # seconds between stream chunks
        self.fault: str | None = None
        self.sent: list[bytes] = []
        self.received: list[dict] = []
        self.aborted = 0  # streams cut short because the other side hung up
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer._note(self, None)
                if self.path.rstrip("/").endswith("/models"):
                    return self._send(200, {"object": "list", "data": [{"id": "chat-model", "object": "model"}]})
                return self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.loads(raw) if raw else {}
                outer._note(self, body)
                if self.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"{self.path} is not served: chat completions only",
                                                      "type": "not_found"}})
                msg = reply(body)
                if body.get("stream"):
                    return self._stream(body, msg)
                out_text = msg["content"] or json.dumps(msg["tool_calls"])
                message = {"role": "assistant", "content": msg["content"]}
                if msg["reasoning_content"]:
                    message["reasoning_content"] = msg["reasoning_content"]
                if msg["tool_calls"]:
                    message["tool_calls"] = msg["tool_calls"]
                self._send(200, {"id": "chatcmpl-chat", "object": "chat.completion", "created": 1,
                                 "model": body.get("model"), "usage": outer.usage(body, out_text),
                                 "choices": [{"index": 0, "message": message,
                                              "finish_reason": "tool_calls" if msg["tool_calls"] else "stop"}]})

            def _chunk(self, body, delta, finish=None) -> dict:
                return {"id": "chatcmpl-chat", "object": "chat.completion.chunk", "created": 1,
                        "model": body.get("model"), "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

            def _stream(self, body: dict, msg: dict) -> None:
                evs = [self._chunk(body, {"role": "assistant", "content": ""})]
                for j in range(0, len(msg["reasoning_content"] or ""), 6):
                    evs.append(self._chunk(body, {"reasoning_content": msg["reasoning_content"][j:j + 6]}))
                for j in range(0, len(msg["content"] or ""), 4):
                    evs.append(self._chunk(body, {"content": msg["content"][j:j + 4]}))
                for i, c in enumerate(msg["tool_calls"] or []):
                    evs.append(self._chunk(body, {"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                                                                  "function": {"name": c["function"]["name"],
                                                                               "arguments": ""}}]}))
                    args = c["function"]["arguments"]
                    for j in range(0, len(args), 5):
                        evs.append(self._chunk(body, {"tool_calls": [{"index": i,
                                                                      "function": {"arguments": args[j:j + 5]}}]}))
                evs.append(self._chunk(body, {}, "tool_calls" if msg["tool_calls"] else "stop"))
                if (body.get("stream_options") or {}).get("include_usage"):
                    evs.append({"id": "chatcmpl-chat", "object": "chat.completion.chunk", "created": 1,
                                "model": body.get("model"), "choices": [],
                                "usage": outer.usage(body, msg["content"] or json.dumps(msg["tool_calls"]))})
                data = [f"data: {json.dumps(e)}\n\n".encode() for e in evs] + [b"data: [DONE]\n\n"]
                if outer.fault == "cut":
                    data = data[:3]
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for d in data:
                    try:
                        self.wfile.write(f"{len(d):x}\r\n".encode() + d + b"\r\n")
                        self.wfile.flush()
                    except OSError:  # the proxy hung up (its client went away)
                        with outer.lock:
                            outer.aborted += 1
                        return
                    time.sleep(outer.delay)
                with outer.lock:
                    outer.sent.append(b"".join(data))
                if outer.fault == "cut":  # no last chunk: the connection just closes
                    self.close_connection = True
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _send(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                with outer.lock:
                    outer.sent.append(data)
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def usage(self, body: dict, out_text: str) -> dict:
        pt = max(self.cached + 1, len(json.dumps(body.get("messages"))) // 4)
        ct = max(1, len(out_text) // 4)
        return {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct,
                "prompt_tokens_details": {"cached_tokens": self.cached}}

    def chat_requests(self) -> list[dict]:
        with self.lock:
            return [r["body"] for r in self.received if r["path"].endswith("/chat/completions")]

    def _note(self, handler, body) -> None:
        with self.lock:
            self.received.append({"path": handler.path, "headers": dict(handler.headers), "body": body})

    def __enter__(self) -> "ChatUpstream":
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": SERVE_POLL}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
