"""A call sent to the upstream as the client sent it (the hot path past `guards.admit`), answered, and its record
filled:

- What goes upstream (`forward_headers`): no hop-by-hop header, none of the proxy's own (`X-Evolforge-*`), no
  client credential but as allowed: the operator's key of the call's API in that API's header
  (`proxy.openai_key_env` as `Authorization: Bearer`; on Messages calls `proxy.anthropic_key_env` as `x-api-key`,
  and never the OpenAI key), else Basic credentials from the upstream URL, else (`proxy.pass_client_key`, to an
  upstream a key may travel to) the client's own key headers; never the proxy token.
- A non-streamed answer on a recorded route must be of its wire's form (tasks/proxy/wires.py): otherwise the client
  gets a 502 `upstream_invalid_response` and the record is failed (ledger outcome `malformed_response`). The
  upstream's own errors pass through as sent (with the PASS_BACK headers).
- A stream is relayed chunk by chunk as the upstream sends it (`relay`: no buffering, byte for byte) while its
  wire's assembler rebuilds the record on the side; a client that goes away stops it (and the upstream call); a
  stream the upstream breaks ends with the wire's SSE error event, never a silent cut.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

import aiohttp
import yarl

from evolforge.tasks.proxy.calls import Call, Incoming, Reply, refuse
from evolforge.tasks.proxy.recording import dumps, loads
from evolforge.tasks.proxy.state import ProxyState
from evolforge.tasks.proxy.upstream import api_of
from evolforge.tasks.proxy.wires import WIRES, Wire

HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
               "upgrade", "proxy-authorization", "proxy-connection", "accept-encoding"}
OWN_HEADERS = ("x-evolforge-", "x-openforge-")
CLIENT_KEY_HEADERS = ("x-api-key", "api-key")  # keys some clients send beside Authorization (Anthropic, Azure)
CREDENTIAL_HEADERS = ("authorization", *CLIENT_KEY_HEADERS)
PASS_BACK = {"content-type", "retry-after", "x-request-id", "openai-processing-ms", "x-ratelimit-limit-requests",
             "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"}
PATH_SAFE = "/:@!$&'()*+,;=-._~"


def forward_headers(state: ProxyState, request, api: str = "openai") -> dict[str, str]:
    """The headers forwarded for a call reaching upstream API `api` ("openai" or "messages", api_of): the operator's
    key of that API only, in that API's header, and then no client credential; else the client's credentials
    (pass_client_key, a key may travel to the upstream), never the proxy token."""
    up = state.upstream
    operator = state.keys.get(api)
    client_keys = state.settings.proxy.pass_client_key and up.key_may_travel and not operator
    out = {k: v for k, v in request.headers.items()
           if k not in HOP_HEADERS and not k.startswith(OWN_HEADERS) and k not in CREDENTIAL_HEADERS}
    if client_keys:
        out.update((k, request.headers[k]) for k in CLIENT_KEY_HEADERS if k in request.headers)
    out["accept-encoding"] = "identity"  # bytes pass through as sent, and records parse them
    if operator and api == "messages":
        out["x-api-key"] = operator
    elif operator:
        out["authorization"] = f"Bearer {operator}"
    if "authorization" not in out and up.authorization:
        out["authorization"] = up.authorization
    elif "authorization" not in out and client_keys and "authorization" in request.headers and not state.token:
        out["authorization"] = request.headers["authorization"]
    return out


async def forward(state: ProxyState, request: Incoming, call: Call, path: str, raw: bytes, receive,
                  reply: Reply) -> None:
    """The call forwarded as sent (past `guards.admit`), the answer sent back, the record filled."""
    recorded, wire = call.wire is not None, call.wire
    if recorded and isinstance(call.body, dict) and (capped := state.cap_output(call.body, path)) is not None:
        body, call.output_cap = capped
        raw = dumps(body)  # the record keeps the client's body; `output_cap` says what the upstream got instead
    up = state.upstream
    url = f"{up.url}/{quote(path, safe=PATH_SAFE)}"
    if request.query:
        url += "?" + request.query.decode("latin-1")
    try:
        target = yarl.URL(url, encoded=True)
    except ValueError:
        return await refuse(call, reply, 400, "the path cannot be forwarded as a URL", "invalid_path")
    call.forwarded = True
    try:
        resp = await state.http.request(request.method, target, raw or None,
                                        forward_headers(state, request, api_of(path)), call.note_retry)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
        return await refuse(call, reply, 502, f"upstream {up.shown} unreachable: {type(e).__name__}",
                            "upstream_unreachable")
    call.status = resp.status
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1", "replace")) for k, v in resp.headers.items()
               if k.lower() in PASS_BACK]
    ctype = resp.headers.get("content-type", "").lower()
    if resp.status == 200 and (ctype.startswith("text/event-stream") or (call.stream and "json" not in ctype)):
        call.stream = True
        return await relay(resp, call, receive, reply, headers, wire)
    try:
        data = await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return await refuse(call, reply, 502, f"upstream {up.shown} failed mid-response: {type(e).__name__}",
                            "upstream_error")
    finally:
        resp.release()
    call.latency_s = time.perf_counter() - call.t0
    if recorded:
        try:
            parsed = loads(data)
            problem = wire.response_problem(parsed)
        except ValueError:
            parsed, problem = None, f"not JSON ({len(data)} bytes)"
        if resp.status == 200 and problem:
            call.outcome = "malformed_response"
            if isinstance(parsed, dict):  # what the upstream says it charged still reaches the ledger
                call.usage = wire.ledger_usage(parsed.get("usage"))
            return await refuse(call, reply, 502, f"upstream {up.shown} returned a body that is not an "
                                f"{wire.name}: {problem}", "upstream_invalid_response")
        if resp.status == 200:
            call.response = wire.response_part(parsed)
            call.usage = wire.ledger_usage(parsed.get("usage"))
        else:
            call.error = upstream_message(parsed, resp.status)
    elif resp.status != 200:
        call.error = f"upstream answered HTTP {resp.status}"
    await reply.start(resp.status, [*headers, (b"content-length", str(len(data)).encode())])
    await reply.body(data)


async def relay(resp: aiohttp.ClientResponse, call: Call, receive, reply: Reply, headers: list,
                wire: Wire | None) -> None:
    """Send the upstream's bytes as they come (no buffering); assemble the record on the side. A client that
    goes away stops the relay (and the upstream call) at once; an upstream that breaks the stream gets the
    client an SSE error event, not a silent cut."""
    wire = wire or WIRES["chat/completions"]  # an unrecorded route's stream: only its timing is kept
    asm = wire.assembler(call.t0)
    gone = asyncio.ensure_future(client_gone(receive))
    try:
        await reply.start(200, headers)
        async for chunk in resp.content.iter_any():
            asm.feed(chunk)
            if gone.done():
                call.error = "client disconnected mid-stream"
                break
            await reply.body(chunk, more=True)
        else:
            await reply.body(b"")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        call.error = f"upstream stream broke: {type(e).__name__}"
        await reply.body((b"\n\n" if asm.pending else b"") + wire.error_event(call.error))
    finally:
        gone.cancel()
        resp.release()
        call.latency_s = time.perf_counter() - call.t0
        call.ttft_s = asm.ttft_s
    if call.wire is None:
        return
    call.response = asm.response_part()
    call.usage = asm.usage
    if call.error:
        return
    if asm.problem:
        call.outcome = "malformed_response"
        call.error = f"upstream stream: {asm.malformed} event(s) not of the {wire.name} form (first: {asm.problem})"
    elif getattr(asm, "error", None):
        call.error = asm.error
    elif not asm.done:
        call.error = f"stream ended without {wire.end_marker}"


async def client_gone(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def upstream_message(parsed, status: int) -> str:
    err = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(err, dict):
        return f"upstream HTTP {status}: {str(err.get('message'))[:300]}"
    if isinstance(err, str):
        return f"upstream HTTP {status}: {err[:300]}"
    return f"upstream HTTP {status}"
