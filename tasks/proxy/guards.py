"""The checks a call under /v1 passes before the proxy sends it on (`admit`), in this order; the first it fails
is the client's answer (a JSON error) and the call's failed record, and the call never reaches the upstream:

- the door (tasks/core/request_guard.py, ProxyState.door): `Host` must name this machine, and a browser-originated
  request (`Origin`, `Sec-Fetch-Site: cross-site`) must come from a page `proxy.allowed_origins` lets in (403;
  recorded under the session `(refused)`, which no client can name);
- the access token, when one is configured (`authorized`; 401);
- the session name, matched in full (`valid_session`; 400, recorded under `invalid`), and its place in the tree: a
  session never changes parent nor descends from itself (`claim_session`; 409);
- the body: at most `proxy.max_body_bytes` (413), declared JSON (415), a JSON object on a recorded route (400);
  and no dot segment in the path (400).
`capped_body` reads a session event's body within `proxy.max_event_bytes`.
"""

from __future__ import annotations

import re

from starlette.requests import Request

from evolforge.tasks.core.keys import token_accepted
from evolforge.tasks.core.request_guard import json_body_refusal
from evolforge.tasks.proxy.calls import Call, Incoming, Reply, refuse
from evolforge.tasks.proxy.recording import loads
from evolforge.tasks.proxy.state import ProxyState
from evolforge.tasks.proxy.wires import WIRES

SESSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # matched in full (`valid_session`)
INVALID_SESSION = "invalid"
RECORDED_ROUTES = {"chat/completions": "chat.completions", "completions": "completions", "responses": "responses",
                   "messages": "messages"}  # the wire of each: tasks/proxy/wires.py


def valid_session(name) -> bool:
    return isinstance(name, str) and SESSION_RE.fullmatch(name) is not None


def session_of(request) -> str:
    """The session the call names: its path's (even empty), else the header's, else "default"."""
    if "session" in request.path_params:
        return request.path_params["session"]
    return request.headers.get("x-evolforge-session") or "default"


def authorized(state: ProxyState, request) -> bool:
    return token_accepted(state.token, request.headers.get("x-evolforge-proxy-token"),
                          request.headers.get("authorization", ""))


def claim_session(state: ProxyState, session: str, parent: str | None) -> str | None:
    """Register the session's parent; an error message when the call would mix the tree."""
    known = state.parents.get(session, ...)
    if known is not ... and parent is None:  # the common case: a known session, no parent named
        return None
    if parent is not None and not valid_session(parent):
        return "bad parent session name (letters, digits, . _ : - ; at most 128)"
    if parent == session:
        return f"session {session!r} cannot be its own parent"
    with state.lock:
        known = state.parents.get(session, ...)
        if known is ... and state.shared is not None:  # several workers: the first to see the session decides
            how, known = state.shared.claim(session, parent)
            if how == "cycle":
                return f"parent {parent!r} descends from session {session!r}"
            state.parents[session] = known
            if how == "new":
                return None
        elif known is ...:
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


async def read_body(receive, limit: int) -> tuple[bytes, int]:
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


async def capped_body(request: Request, limit: int) -> tuple[bytes | None, int]:
    """The body, or None once it passes `limit` bytes (the rest is drained, not kept)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            parts.append(chunk)
    return (b"".join(parts) if size <= limit else None), size


async def admit(state: ProxyState, request: Incoming, call: Call, path: str, receive, reply: Reply) -> bytes | None:
    """The call's body (b"" when it has none) once the call passed every check, with its session, parent, wire,
    parsed body and stream flag set on `call`; None when it was refused (the client has its answer)."""
    refusal = state.door(request.headers, request.scope)
    if refusal:
        return await refuse(call, reply, *refusal)
    if not authorized(state, request):
        return await refuse(call, reply, 401, "missing or wrong proxy access token (X-Evolforge-Proxy-Token)",
                            "unauthorized")
    session = session_of(request)
    if not valid_session(session):
        call.session = INVALID_SESSION
        return await refuse(call, reply, 400, "bad session name: letters, digits, . _ : - ; at most 128, starting "
                            "with a letter or digit", "invalid_session")
    call.session = session
    parent = request.headers.get("x-evolforge-parent-session")
    call.parent = parent if valid_session(parent) else None
    problem = claim_session(state, session, parent)
    if problem:
        return await refuse(call, reply, 409, problem, "session_conflict")
    limit = state.settings.proxy.max_body_bytes
    raw, size = await read_body(receive, limit)
    if size > limit:
        return await refuse(call, reply, 413, f"request body of {size} bytes is over proxy.max_body_bytes "
                            f"({limit})", "body_too_large")
    refusal = json_body_refusal(request.headers.get("content-type"), bool(raw))
    if refusal:
        return await refuse(call, reply, *refusal)
    recorded = path in RECORDED_ROUTES and request.method == "POST"
    call.wire = WIRES[path] if recorded else None
    if raw and recorded:
        try:
            call.body = loads(raw)
        except ValueError as e:
            return await refuse(call, reply, 400, f"request body is not valid JSON: {str(e)[:200]}",
                                "invalid_json")
        if not isinstance(call.body, dict):
            return await refuse(call, reply, 400, "request body must be a JSON object", "invalid_json")
        call.stream = call.body.get("stream") is True
    if any(part in (".", "..") for part in path.split("/")):
        return await refuse(call, reply, 400, "dot segments are not allowed in the path", "invalid_path")
    return raw
