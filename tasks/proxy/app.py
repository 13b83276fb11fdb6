"""The recording proxy as an ASGI app (Starlette): forward every call unchanged, record it after the reply.

Routes (the session may ride in the path, so an agent that only takes a base URL needs no code change):
    /v1/{path}                  session from the `X-Evolforge-Session` header, else "default"
    /s/{session}/v1/{path}      chat/completions and completions (streamed or not) are recorded;
                                models and anything else under /v1 pass through (recorded too)
    POST /s/{session}/reward    {"reward": float, ...}: a reward for the session (graders, the agent itself)
    POST /s/{session}/finish    the session is finished (export takes it at once)
    GET  /healthz
Headers: `X-Evolforge-Parent-Session` (a sub-agent's session names its parent: sessions form a tree, and a
session never changes parent), `X-Evolforge-Role` or `X-OpenForge-Role` (which agent or tool made the call),
`X-Evolforge-Proxy-Token` (the access token, when one is configured).

Streams pass through chunk by chunk as the upstream sends them (no buffering); the record is written after
the last chunk has gone out, and for other calls after the response has been sent (Starlette background
tasks), so recording never delays the agent. A call the proxy refuses (malformed JSON, a body over
`max_body_bytes`, a bad session name, a wrong token) or cannot complete (upstream down, or junk where JSON
was due) gets a JSON error body (4xx / 502) and is recorded as a failed call; the proxy keeps serving.

The upstream key comes from EVOLFORGE_API_KEY / OPENAI_API_KEY, else (with `pass_client_key`) the client's
own Authorization header is forwarded. No header is recorded; error messages never carry a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import quote

import aiohttp
import yarl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from evolforge.config.settings import Settings
from evolforge.storage.ledger import LedgerWriter
from evolforge.storage.proxy_sets import ProxyLayout, RecordLog
from evolforge.tasks.core.gateway import is_loopback, read_api_key
from evolforge.tasks.core.keys import token_accepted
from evolforge.tasks.core.pricing import PriceBook
from evolforge.tasks.proxy.recording import StreamAssembler, dumps, loads, request_part, response_part

SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
RECORDED_ROUTES = {"chat/completions": "chat.completions", "completions": "completions"}
HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
               "upgrade", "proxy-authorization", "proxy-connection", "accept-encoding"}
OWN_HEADERS = ("x-evolforge-", "x-openforge-")
PASS_BACK = {"content-type", "retry-after", "x-request-id", "openai-processing-ms", "x-ratelimit-limit-requests",
             "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"}


class ProxyConfigError(ValueError):
    """The proxy cannot start as configured (e.g. a public bind address without an access token)."""


@dataclass
class ProxyState:
    settings: Settings
    upstream: str
    layout: ProxyLayout
    token: str | None
    embedded_models: set[str] = field(default_factory=set)
    run_id: str = field(default_factory=lambda: f"proxy-{int(time.time())}")
    parents: dict[str, str | None] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        cfg = self.settings.proxy
        self.log = RecordLog(self.layout, cfg.flush_seconds)
        self.ledger = LedgerWriter(self.layout.ledger_dir, self.run_id, cfg.flush_seconds)
        self.prices = PriceBook(self.settings.pricing, self.embedded_models)
        self.env_key = read_api_key()
        self.client: aiohttp.ClientSession | None = None  # made on the server's event loop (lifespan)
        self.calls = 0

    async def open(self) -> None:
        cfg = self.settings.proxy
        self.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=cfg.max_connections, limit_per_host=cfg.max_connections),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=cfg.timeout_seconds),
            auto_decompress=False, skip_auto_headers=("User-Agent",))

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.close()
        self.log.close()
        self.ledger.close()


def check_bind(host: str, token: str | None) -> None:
    if not is_loopback(host) and not token:
        raise ProxyConfigError(
            f"refusing to bind the recording proxy to {host} without an access token: set the environment variable "
            "named by proxy.token_env (default EVOLFORGE_PROXY_TOKEN); clients then send it as "
            "X-Evolforge-Proxy-Token. Loopback (127.0.0.1) needs none.")


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(_error_payload(status, message, kind), status_code=status)


class Call:
    """One proxied call's bookkeeping, finished into a record after the response has gone out."""

    def __init__(self, state: ProxyState, request: Incoming, session: str, route: str):
        self.state = state
        self.t0 = time.perf_counter()
        self.ts = time.time()
        self.session = session
        self.route = route
        self.method = request.method
        self.path = request.path
        self.parent = request.headers.get("x-evolforge-parent-session")
        self.role = request.headers.get("x-evolforge-role") or request.headers.get("x-openforge-role")
        self.body: dict | None = None
        self.stream = False
        self.status = 0
        self.error: str | None = None
        self.response: dict | None = None
        self.ttft_s: float | None = None
        self.latency_s: float | None = None

    def finish(self) -> None:
        """Write the record and its ledger row, once the response has gone out: on the event loop, no thread
        hop per call (two appends of one line each: O_APPEND writes locally, a buffer on object stores)."""
        st = self.state
        latency = self.latency_s if self.latency_s is not None else time.perf_counter() - self.t0
        resp = self.response or {}
        body = self.body if isinstance(self.body, dict) else {}
        model = resp.get("model") or body.get("model")
        rec = {
            "record_id": uuid.uuid4().hex, "session": self.session, "parent_session": self.parent,
            "role": self.role, "route": self.route, "method": self.method, "path": self.path,
            "stream": self.stream, "status": self.status, "error": self.error, "model": model,
            "ts": self.ts, "latency_s": round(latency, 6), "ttft_s": self.ttft_s,
            "request": request_part(body) if body else None, "response": self.response,
        }
        usage = resp.get("usage") or {}
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        cost, source = st.prices.cost(model, pt, ct) if model else (None, "unknown model")
        st.ledger.record(stage="proxy", task_id=self.session, model=model, attempt=1,
                         outcome="ok" if self.status == 200 and not self.error else (
                             f"http_{self.status}" if self.status else "upstream_error"),
                         http_status=self.status or None, prompt_tokens=pt, completion_tokens=ct,
                         cost_usd=cost, price_source=source, latency_s=round(latency, 6), error=self.error)
        st.log.record(rec)  # last: a record on disk means its ledger row is there too
        with st.lock:
            st.calls += 1


class Incoming:
    """What the hot path needs of an ASGI request: method, path, query and lower-cased headers."""

    __slots__ = ("method", "path", "query", "headers", "path_params")

    def __init__(self, scope: dict, session: str | None):
        self.method = scope["method"]
        self.path = scope["path"]
        self.query = scope.get("query_string") or b""
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.path_params = {"session": session} if session is not None else {}


def _session_of(request) -> str | None:
    return request.path_params.get("session") or request.headers.get("x-evolforge-session") or "default"


def _authorized(state: ProxyState, request) -> bool:
    return token_accepted(state.token, request.headers.get("x-evolforge-proxy-token"),
                          request.headers.get("authorization", ""))


def _forward_headers(state: ProxyState, request) -> dict[str, str]:
    out = {k: v for k, v in request.headers.items()
           if k not in HOP_HEADERS and not k.startswith(OWN_HEADERS) and k != "authorization"}
    out["accept-encoding"] = "identity"  # bytes pass through as sent, and records parse them
    if state.env_key:
        out["authorization"] = f"Bearer {state.env_key}"
    elif state.settings.proxy.pass_client_key and "authorization" in request.headers and not state.token:
        out["authorization"] = request.headers["authorization"]
    return out


def _claim_session(state: ProxyState, session: str, parent: str | None) -> str | None:
    """Register the session's parent; an error message when the call would mix the tree."""
    known = state.parents.get(session, ...)
    if known is not ... and parent is None:  # the common case: a known session, no parent named
        return None
    if parent is not None and not SESSION_RE.match(parent):
        return "bad parent session name (letters, digits, . _ : - ; at most 128)"
    if parent == session:
        return f"session {session!r} cannot be its own parent"
    with state.lock:
        known = state.parents.get(session, ...)
        if known is ...:
            p = parent
            while p is not None:  # a cycle would make the tree a loop
                if p == session:
                    return f"parent {parent!r} descends from session {session!r}"
                p = state.parents.get(p)
            state.parents[session] = parent
            return None
    if parent is not None and known != parent:
        return f"session {session!r} already belongs to parent {known!r}; a sub-agent needs its own session id"
    return None


async def _read_body(receive, limit: int) -> tuple[bytes, int]:
    """The request body, or (b"", size seen) once it passes `limit` (the rest is drained, not kept)."""
    parts: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            parts.append(chunk)
        more = message.get("more_body", False)
    if size > limit:
        return b"", size
    return parts[0] if len(parts) == 1 else b"".join(parts), size


async def _send_json(send, status: int, payload: dict, headers: list | None = None) -> None:
    body = dumps(payload)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or ())]})
    await send({"type": "http.response.body", "body": body})


def _error_payload(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}


async def proxy_call(state: ProxyState, scope: dict, receive, send, session: str | None, path: str) -> None:
    """One call under /v1 or /s/{session}/v1: forwarded, answered, then recorded (raw ASGI, the hot path)."""
    request = Incoming(scope, session)
    path = path.strip("/")
    session = _session_of(request)
    call = Call(state, request, session if SESSION_RE.match(session or "") else "invalid", RECORDED_ROUTES.get(path, path))

    async def refuse(status: int, message: str, kind: str) -> None:
        """A JSON error to the client, recorded as a failed call once it is sent."""
        call.status, call.error = status, message
        await _send_json(send, status, _error_payload(status, message, kind))
        call.finish()

    if not _authorized(state, request):
        await _send_json(send, 401, _error_payload(401, "missing or wrong proxy access token (X-Evolforge-Proxy-Token)",
                                                   "unauthorized"))
        return
    if not SESSION_RE.match(session or ""):
        return await refuse(400, "bad session name: letters, digits, . _ : - ; at most 128, starting with a letter "
                            "or digit", "invalid_session")
    problem = _claim_session(state, session, call.parent)
    if problem:
        return await refuse(409, problem, "session_conflict")
    limit = state.settings.proxy.max_body_bytes
    raw, size = await _read_body(receive, limit)
    if size > limit:
        return await refuse(413, f"request body of {size} bytes is over proxy.max_body_bytes ({limit})",
                            "body_too_large")
    recorded = path in RECORDED_ROUTES and request.method == "POST"
    if raw and recorded:
        try:
            call.body = loads(raw)
        except ValueError as e:
            return await refuse(400, f"request body is not valid JSON: {e}", "invalid_json")
        if not isinstance(call.body, dict):
            return await refuse(400, "request body must be a JSON object", "invalid_json")
        call.stream = bool(call.body.get("stream"))
    if any(part in (".", "..") for part in path.split("/")):
        return await refuse(400, "dot segments are not allowed in the path", "invalid_path")
    url = f"{state.upstream}/{quote(path, safe=PATH_SAFE)}"
    if request.query:
        url += "?" + request.query.decode("latin-1")
    try:
        resp = await state.client.request(request.method, yarl.URL(url, encoded=True), data=raw or None,
                                          headers=_forward_headers(state, request))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return await refuse(502, f"upstream {state.upstream} unreachable: {type(e).__name__}", "upstream_unreachable")
    call.status = resp.status
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in resp.headers.items()
               if k.lower() in PASS_BACK]
    if call.stream and resp.status == 200:
        await _relay(resp, call, receive, send, headers)
        call.finish()
        return
    try:
        data = await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        resp.release()
        return await refuse(502, f"upstream {state.upstream} failed mid-response: {type(e).__name__}", "upstream_error")
    resp.release()
    call.latency_s = time.perf_counter() - call.t0
    if recorded:
        try:
            parsed = loads(data)
        except ValueError:
            parsed = None
        if resp.status == 200 and not isinstance(parsed, dict):
            return await refuse(502, f"upstream {state.upstream} returned a body that is not JSON "
                                f"({len(data)} bytes)", "upstream_invalid_response")
        if resp.status == 200:
            call.response = response_part(parsed)
        else:
            call.error = _upstream_message(parsed, resp.status)
    elif resp.status != 200:
        call.error = f"upstream answered HTTP {resp.status}"
    await send({"type": "http.response.start", "status": resp.status,
                "headers": [*headers, (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
    call.finish()  # after the response has gone out: recording never delays the agent


async def _relay(resp: aiohttp.ClientResponse, call: Call, receive, send, headers: list) -> None:
    """Send the upstream's bytes as they come (no buffering); assemble the record on the side. A client that
    goes away stops the relay (and the upstream call) at once."""
    asm = StreamAssembler(call.t0)
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async for chunk in resp.content.iter_any():
            asm.feed(chunk)
            if gone.done():
                call.error = "client disconnected mid-stream"
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        else:
            await send({"type": "http.response.body", "body": b""})
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        call.error = f"upstream stream broke: {type(e).__name__}"
        await send({"type": "http.response.body", "body": b""})
    finally:
        gone.cancel()
        resp.release()
        call.latency_s = time.perf_counter() - call.t0
        call.ttft_s = asm.ttft_s
        call.response = asm.response_part()
        if not asm.done and not call.error:
            call.error = "stream ended without [DONE]"


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _upstream_message(parsed, status: int) -> str:
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return f"upstream HTTP {status}: {str(parsed['error'].get('message'))[:300]}"
    return f"upstream HTTP {status}"


async def session_event(request: Request) -> Response:
    state: ProxyState = request.app.state.proxy
    if not _authorized(state, request):
        return _error(401, "missing or wrong proxy access token (X-Evolforge-Proxy-Token)", "unauthorized")
    session, kind = request.path_params["session"], request.path_params["kind"]
    if not SESSION_RE.match(session):
        return _error(400, "bad session name", "invalid_session")
    if kind not in ("reward", "finish"):
        return _error(404, f"unknown session action {kind!r} (reward, finish)", "not_found")
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError as e:
        return _error(400, f"body is not valid JSON: {e}", "invalid_json")
    if not isinstance(body, dict):
        return _error(400, "body must be a JSON object", "invalid_json")
    event = {"session": session, "event": kind, "ts": time.time()}
    if kind == "reward":
        reward = body.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward:
            return _error(400, '"reward" must be a number', "invalid_reward")
        event.update(reward=float(reward), details=body.get("details"), source=body.get("source"))
    state.log.event(event)
    return JSONResponse({"ok": True, **{k: v for k, v in event.items() if k != "details"}})


async def health(request: Request) -> Response:
    state: ProxyState = request.app.state.proxy
    return JSONResponse({"ok": True, "upstream": state.upstream, "calls": state.calls})


PATH_SAFE = "/:@!$&'()*+,;=-._~"
HOT_PATH = re.compile(r"^/(?:s/([^/]*)/)?v1/(.*)$", re.S)


def build_app(state: ProxyState):
    """The ASGI app: calls under /v1 and /s/{session}/v1 go straight to the raw hot path; session events,
    health and lifespan go through Starlette."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await state.open()
        try:
            yield
        finally:  # records and ledger rows reach the store before the process exits
            await state.aclose()

    rest = Starlette(routes=[
        Route("/healthz", health, methods=["GET"]),
        Route("/s/{session}/{kind:str}", session_event, methods=["POST"]),
    ], lifespan=lifespan)
    rest.state.proxy = state

    async def app(scope, receive, send):
        if scope["type"] == "http":
            m = HOT_PATH.match(scope["path"])
            if m:
                return await proxy_call(state, scope, receive, send, m.group(1), m.group(2))
        return await rest(scope, receive, send)

    app.state = rest.state
    return app
