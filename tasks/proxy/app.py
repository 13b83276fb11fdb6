"""The recording proxy as an ASGI app (Starlette): forward every call unchanged, record it after the reply.

This module is the routing: the raw hot path for calls under /v1 (`proxy_call`: checked by guards.py, then sent
on as is by forward.py or through chat completions by translating.py, recorded by calls.py), session events and
health through Starlette, and the lifespan that opens and closes the process's state (state.py, upstream.py).

Routes (the session may ride in the path, so an agent that only takes a base URL needs no code change):
    /v1/{path}                  session from the `X-Evolforge-Session` header, else "default"
    /s/{session}/v1/{path}      chat/completions, completions, responses (OpenAI's Responses API) and messages
                                (Anthropic's Messages API), streamed or not, are recorded with their parsed
                                request and response (tasks/proxy/wires.py); models, messages/count_tokens and
                                anything else under /v1 pass through (recorded too, without parsed bodies)
    POST /s/{session}/reward    {"reward": float, ...}: a reward for the session (graders, the agent itself)
    POST /s/{session}/finish    the session is finished (export takes it at once)
    GET  /healthz               {"ok": true}; with the access token (or when none is configured) also the
                                upstream, its credentials masked, and the calls served
Headers: `X-Evolforge-Parent-Session` (a sub-agent's session names its parent: sessions form a tree, and a
session never changes parent), `X-Evolforge-Role` or `X-OpenForge-Role` (which agent or tool made the call),
`X-Evolforge-Proxy-Token` (the access token, when one is configured).

Every call under /v1 ends as exactly one record and one ledger row, whatever the client or the upstream sent
(except calls the proxy refuses past `proxy.refused_records_per_second`: those are counted, and the count is
written with the next refused record or at shutdown; a refused record keeps 256 characters of path and error):
- The door (tasks/core/request_guard.py), before anything else (guards.py, in order): `Host` must name this
  machine (a web page or a DNS-rebinding name is refused, 403), browser-originated requests (`Origin`,
  `Sec-Fetch-Site: cross-site`) are refused unless `proxy.allowed_origins` lets the page in, then the access token
  (401). Refused here, the call is recorded under the session `(refused)`, which no client can name.
- Then the session name (matched in full; 400, recorded under `invalid`), its place in the tree (409), the body
  (over `max_body_bytes`: 413; a body that is not declared JSON: 415; malformed JSON, nested past the parser's
  depth, or not an object on a recorded route: 400).
- Calls the proxy refused never reached the upstream: their ledger row costs 0.0 (`price_source` "not forwarded").
- A non-streamed answer on a recorded route must be of its API's form (tasks/proxy/wires.py; forward.py):
  otherwise the client gets a 502 `upstream_invalid_response` and the record is failed (ledger outcome
  `malformed_response`). The upstream's own errors (any status but 200) pass through as sent.
- A pooled keep-alive connection the upstream had closed, found so before any response byte, gets the call sent
  once more on a new connection (upstream.py UpstreamClient; the record's `upstream_retry`, its ledger row's
  attempt 2).
- Streams pass through chunk by chunk as the upstream sends them (no buffering; byte for byte). Events that are
  not of the chunk form mark the record failed; a stream the upstream breaks ends with an SSE error event
  (`{"error": {...}}`, which the openai SDK raises), never a silent cut.
- Anything unexpected in the proxy itself is logged with its traceback, answered 500 (or ends the stream), and
  still recorded.
The record is written after the last byte has gone out, so recording never delays the agent.

When the upstream is the embedded model (the CLI passes its alias in `embedded_models`), a recorded call that asks
for no output limit or more than `proxy.embedded_max_tokens` goes upstream with that limit (`output_capped`); the
record keeps the client's request and says what was capped under `output_cap`.

With `proxy.translate` (an upstream that speaks only chat completions), `responses` and / or `messages` calls are
not forwarded as sent: tasks/proxy/translating.py makes each a POST /chat/completions and answers in the client's
API (JSON, or an event stream built chunk by chunk from the chat stream). The record keeps the client's view
(`request`, `response`) and the chat call under `translation` (request, upstream status, the chat reply's part,
error, what had no chat form); its ledger row is the one of the call. A request chat cannot carry is a 400, a chat
reply not of the chat form a 502, an upstream error its status (502 for one under 400), all in the client API's
error form (Anthropic's `{"type": "error", ...}` for Messages); a chat stream that breaks or ends without [DONE]
ends the client's stream with its API's error event.

Keys (upstream.py, forward.py), one setting per upstream API, each sent only in its API's header: the OpenAI-style
APIs (chat, completions, Responses, anything else under /v1, and Messages translated to chat) get
`proxy.openai_key_env` (default EVOLFORGE_API_KEY / OPENAI_API_KEY) as `Authorization: Bearer`; Messages calls
forwarded as Messages get `proxy.anthropic_key_env` (default ANTHROPIC_API_KEY) as `x-api-key` and never the
OpenAI key. A call that carries
an operator key carries no client credential (Authorization, x-api-key, api-key are stripped), so the operator's key
never travels beside a client's. Without an operator key for the call's API: credentials in the upstream URL's
userinfo (sent as Basic auth), else (with `pass_client_key`) the client's own key headers are forwarded;
`pass_client_key = false` strips every client credential header. No key goes over
plain http to a host that is not loopback unless `gateway.allow_key_over_http` says so (the gateway's own check,
tasks/core/keys.py): the proxy refuses to start with an environment key or URL credentials for such an upstream,
and does not forward a client's key to it. No header is recorded; error messages never carry a key; the upstream
URL is shown and written with its userinfo masked (`redact_url`).
"""

from __future__ import annotations

import contextlib
import re
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from evolforge.tasks.core.request_guard import cors_settings, json_body_refusal
from evolforge.tasks.proxy.calls import Call, Incoming, Reply, clipped, error_payload, headers_of, log
from evolforge.tasks.proxy.forward import forward
from evolforge.tasks.proxy.guards import RECORDED_ROUTES, admit, authorized, capped_body, valid_session
from evolforge.tasks.proxy.recording import dumps, loads
from evolforge.tasks.proxy.state import ProxyState
from evolforge.tasks.proxy.translating import serve_translated


async def proxy_call(state: ProxyState, scope: dict, receive, send, session: str | None, path: str) -> None:
    """One call under /v1 or /s/{session}/v1: forwarded, answered, then recorded (raw ASGI, the hot path). Ends as
    exactly one record and one ledger row whatever happens on the way."""
    request = Incoming(scope, session)
    path = path.strip("/")
    call = Call(state, request, RECORDED_ROUTES.get(path, path))
    reply = Reply(send)
    try:
        await _serve(state, request, call, path, receive, reply)
    except Exception as e:  # noqa: BLE001 - a bug here must not lose the call or leave the client hanging
        log.exception("recording proxy: unexpected error on %s %s", call.method, clipped(call.path, 200))
        call.error = f"proxy error: {type(e).__name__}"
        with contextlib.suppress(Exception):
            if not reply.started:
                call.status = 500
                await reply.json(500, error_payload(500, "the recording proxy failed on this call "
                                                     f"({type(e).__name__}); it was recorded", "proxy_error"))
            elif not reply.ended:
                await reply.body(b"")
    finally:
        call.finish()  # after the response has gone out: recording never delays the agent


async def _serve(state: ProxyState, request: Incoming, call: Call, path: str, receive, reply: Reply) -> None:
    raw = await admit(state, request, call, path, receive, reply)
    if raw is None:
        return
    if call.wire is not None and state.translates(path):
        return await serve_translated(state, request, call, path, receive, reply)
    await forward(state, request, call, path, raw, receive, reply)


async def session_event(request: Request) -> Response:
    state: ProxyState = request.app.state.proxy
    if not authorized(state, request):
        return _error(401, "missing or wrong proxy access token (X-Evolforge-Proxy-Token)", "unauthorized")
    session, kind = request.path_params["session"], request.path_params["kind"]
    if not valid_session(session):
        return _error(400, "bad session name", "invalid_session")
    if kind not in ("reward", "finish"):
        return _error(404, f"unknown session action {kind!r} (reward, finish)", "not_found")
    ctype = request.headers.get("content-type")
    refusal = json_body_refusal(ctype, False)
    if refusal:
        return _error(*refusal)
    limit = state.settings.proxy.max_event_bytes
    raw, size = await capped_body(request, limit)
    if raw is None:
        return _error(413, f"{kind} body of {size} bytes is over proxy.max_event_bytes ({limit})", "body_too_large")
    refusal = json_body_refusal(ctype, bool(raw.strip()))
    if refusal:
        return _error(*refusal)
    try:
        body = loads(raw) if raw.strip() else {}
    except ValueError as e:
        return _error(400, f"body is not valid JSON: {str(e)[:200]}", "invalid_json")
    if not isinstance(body, dict):
        return _error(400, "body must be a JSON object", "invalid_json")
    event = {"session": session, "event": kind, "ts": time.time()}
    if kind == "reward":
        reward = body.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward:
            return _error(400, '"reward" must be a number', "invalid_reward")
        event.update(reward=float(reward), details=body.get("details"), source=body.get("source"))
    state.log.event(event)
    return Response(dumps({"ok": True, **{k: v for k, v in event.items() if k != "details"}}),
                    media_type="application/json")


async def health(request: Request) -> Response:
    """Alive, without secrets: the upstream (credentials masked) and the calls served only to a client that may
    use the proxy (the token, when one is configured)."""
    state: ProxyState = request.app.state.proxy
    if state.token and not authorized(state, request):
        return JSONResponse({"ok": True})
    return JSONResponse({"ok": True, "upstream": state.upstream.shown, "calls": state.calls})


HOT_PATH = re.compile(r"/(?:s/([^/]*)/)?v1/(.*)", re.S)  # matched in full


def build_app(state: ProxyState):
    """The ASGI app: calls under /v1 and /s/{session}/v1 go straight to the raw hot path (which checks and records
    them); session events and health pass the same door, then go through Starlette, as does the lifespan. With
    `proxy.allowed_origins` set, Starlette's CORS middleware answers the allowed pages' preflights."""

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
            m = HOT_PATH.fullmatch(scope["path"])
            if m:
                return await proxy_call(state, scope, receive, send, m.group(1), m.group(2))
            refusal = state.door(headers_of(scope), scope)
            if refusal:
                return await _send_json(send, refusal[0], error_payload(*refusal))
        return await rest(scope, receive, send)

    app.state = rest.state
    allowed = state.settings.proxy.allowed_origins
    if not allowed:
        return app
    from starlette.middleware.cors import CORSMiddleware

    outer = CORSMiddleware(app, **cors_settings(allowed))
    outer.state = rest.state
    return outer


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(error_payload(status, message, kind), status_code=status)


async def _send_json(send, status: int, payload: dict, headers: list | None = None) -> None:
    body = dumps(payload)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or ())]})
    await send({"type": "http.response.body", "body": body})
