"""A Messages or Responses API call served through an upstream that speaks only chat completions
(`proxy.translate`): made as a POST /chat/completions (translate.py, translate_messages.py,
translate_responses.py) and answered in the client's API, as JSON or as an event stream built chunk by chunk from
the chat stream (or replayed from a chat reply that came whole).

The record keeps the client's view (`request`, `response`) and the chat call under `translation` (request,
upstream status, the chat reply's part, error, what had no chat form); its ledger row is the one of the call. A
request chat cannot carry is a 400, a chat reply not of the chat form a 502, an upstream error its status (502 for
one under 400), all in the client API's error form (Anthropic's `{"type": "error", ...}` for Messages); a chat
stream that breaks or ends without [DONE] ends the client's stream with its API's error event. A client's x-api-key
becomes the bearer key a chat upstream reads, under the rules of a client's Authorization.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from evolforge.tasks.proxy.calls import Call, Incoming, Reply, error_payload
from evolforge.tasks.proxy.forward import CLIENT_KEY_HEADERS, client_gone, forward_headers, upstream_message
from evolforge.tasks.proxy.recording import loads, response_part, response_problem, usage_of
from evolforge.tasks.proxy.sse import SSE_HEADERS
from evolforge.tasks.proxy.state import ProxyState
from evolforge.tasks.proxy.translate import CHAT_PATH, Translated, Untranslatable, new_id, to_json
from evolforge.tasks.proxy.translate_messages import MessagesStream, anthropic_error, chat_to_messages, messages_request
from evolforge.tasks.proxy.translate_responses import (
    ResponsesStream,
    assistant_message,
    chat_to_responses,
    responses_request,
)


def _client_error(api: str, status: int, message: str, kind: str | None = None) -> dict:
    """An error body in the client's API: Anthropic's {"type": "error", "error": {...}} for Messages (its kind
    named by status when the proxy has none of its own), OpenAI's {"error": {...}} for Responses."""
    if api == "messages":
        body = anthropic_error(status, message)
        if kind:
            body["error"]["type"] = kind
        return body
    return error_payload(status, message, kind or "upstream_error")


def _translated_headers(state: ProxyState, request) -> dict[str, str]:
    """The forwarded headers less the client API's own (anthropic-*, openai-beta); a client's x-api-key (the
    anthropic SDK's, Claude Code's) becomes the bearer key a chat upstream reads, under the same rules as a
    client's Authorization (pass_client_key, a key may travel to the upstream)."""
    out = {k: v for k, v in forward_headers(state, request, "openai").items()
           if not k.startswith(("anthropic-", "openai-beta")) and k not in CLIENT_KEY_HEADERS}
    out["content-type"] = "application/json"
    if "authorization" not in out and state.settings.proxy.pass_client_key and state.upstream.key_may_travel \
            and not state.keys["openai"]:
        key = next((request.headers[k] for k in CLIENT_KEY_HEADERS if request.headers.get(k)), None)
        if key:
            out["authorization"] = f"Bearer {key}"
    return out


def _with_tokens(client_part: dict, chat_part: dict) -> dict:
    """The client's view of the reply, with the token ids and logprobs the chat upstream returned (the client's
    API has no field for them; the export reads them here)."""
    for key in ("token_ids", "prompt_token_ids"):
        if chat_part.get(key):
            client_part[key] = chat_part[key]
    if client_part.get("logprobs") is None and chat_part.get("logprobs"):
        client_part["logprobs"] = chat_part["logprobs"]
    return client_part


async def serve_translated(state: ProxyState, request: Incoming, call: Call, api: str, receive,
                           reply: Reply) -> None:
    """A Messages or Responses API call made upstream as a chat completion (proxy.translate), answered in the
    client's API, streamed or not. The record keeps the client's view; `call.translation` the chat call."""
    cfg, up, wire = state.settings.proxy, state.upstream, call.wire

    async def fail(status: int, message: str, kind: str | None = None, headers: list | None = None) -> None:
        call.status, call.error = status, message
        data = to_json(_client_error(api, status, message, kind))
        await reply.start(status, [(b"content-type", b"application/json"),
                                   (b"content-length", str(len(data)).encode()), *(headers or ())])
        await reply.body(data)

    if call.body is None:
        return await fail(400, "request body must be a JSON object", "invalid_json")
    try:
        tr = (messages_request(call.body, cfg.translate_model) if api == "messages"
              else responses_request(call.body, state.history, cfg.translate_model))
    except Untranslatable as e:
        return await fail(400, f"this {wire.name.rsplit(' ', 1)[0]} request cannot be made as a chat completion "
                          f"(proxy.translate): {e}", e.kind)
    if (capped := state.cap_output(tr.body, CHAT_PATH)) is not None:
        tr.body, call.output_cap = capped
    call.translation = tr.record()
    call.forwarded = True
    try:
        resp = await state.http.request("POST", f"{up.url}/{CHAT_PATH}", to_json(tr.body),
                                        _translated_headers(state, request), call.note_retry)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
        return await fail(502, f"upstream {up.shown} unreachable: {type(e).__name__}", "upstream_unreachable")
    call.status = call.translation["status"] = resp.status
    rid = new_id("resp_" if api == "responses" else "msg_")
    if resp.status == 200 and resp.headers.get("content-type", "").lower().startswith("text/event-stream"):
        return await _relay_translated(state, resp, call, tr, rid, receive, reply, fail)
    try:
        data = await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return await fail(502, f"upstream {up.shown} failed mid-response: {type(e).__name__}", "upstream_error")
    finally:
        resp.release()
    call.latency_s = time.perf_counter() - call.t0
    try:
        parsed = loads(data)
        problem = response_problem(parsed)
    except ValueError:
        parsed, problem = None, f"not JSON ({len(data)} bytes)"
    if resp.status != 200:
        message = upstream_message(parsed, resp.status)
        call.translation["error"] = message
        retry = [(b"retry-after", resp.headers["retry-after"].encode("latin-1", "replace"))] \
            if "retry-after" in resp.headers else []
        # a status that is not an error (a 201) would make the client parse this as its API's answer
        return await fail(resp.status if resp.status >= 400 else 502, message, None, retry)
    if problem:
        call.outcome = "malformed_response"
        call.translation["error"] = problem
        if isinstance(parsed, dict):
            call.usage = usage_of(parsed.get("usage"))[0]
        return await fail(502, f"upstream {up.shown} returned a body that is not an OpenAI chat completion: "
                          f"{problem}", "upstream_invalid_response")
    await _answer(state, call, tr, rid, response_part(parsed), reply)


async def _answer(state: ProxyState, call: Call, tr: Translated, rid: str, part: dict,
                  reply: Reply) -> None:
    """A whole chat reply answered in the client's API: JSON, or the event stream the client asked for."""
    wire = call.wire
    call.translation["response"] = part
    if tr.stream:
        cls = MessagesStream if tr.api == "messages" else ResponsesStream
        events = cls.replay(part, call.t0, tr, wire.error_event, rid).take()
        asm = wire.assembler(call.t0)
        asm.feed(events)
        await reply.start(200, SSE_HEADERS)
        await reply.body(events)
        call.response, call.usage, call.ttft_s = asm.response_part(), asm.usage, asm.ttft_s
    else:
        body = (chat_to_messages(part, tr, rid) if tr.api == "messages"
                else chat_to_responses(part, tr, rid))
        data = to_json(body)
        await reply.start(200, [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())])
        await reply.body(data)
        call.response, call.usage = wire.response_part(body), wire.ledger_usage(body["usage"])
    call.status = 200
    _with_tokens(call.response, part)
    call.translation["notes"] = tr.notes
    if tr.api == "responses" and tr.request.get("store") is not False:
        state.history.put(rid, [*tr.conversation, assistant_message(part)])


async def _relay_translated(state: ProxyState, resp: aiohttp.ClientResponse, call: Call, tr: Translated,
                            rid: str, receive, reply: Reply, fail) -> None:
    """A chat stream re-emitted in the client's API as it comes (or gathered into one reply when the client did
    not ask for a stream). A chat stream that breaks, ends without [DONE], sends an error or an event not of the
    chunk form ends the client's stream with its API's error event (a 502 when not streamed)."""
    wire = call.wire
    cls = MessagesStream if tr.api == "messages" else ResponsesStream
    chat = cls(call.t0, tr, wire.error_event, rid)
    asm = wire.assembler(call.t0)  # the client's view, rebuilt from the bytes it is sent

    async def send(data: bytes) -> None:
        if data:
            asm.feed(data)
            await reply.body(data, more=True)

    gone = asyncio.ensure_future(client_gone(receive))
    broke, disconnected = None, False
    try:
        if tr.stream:
            await reply.start(200, SSE_HEADERS)
        async for chunk in resp.content.iter_any():
            chat.feed(chunk)
            if gone.done():
                call.error, disconnected = "client disconnected mid-stream", True
                break
            if chat.failed:
                break
            if tr.stream:
                await send(chat.take())
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        broke = f"upstream stream broke: {type(e).__name__}"
    finally:
        gone.cancel()
        resp.release()
        call.latency_s = time.perf_counter() - call.t0
    call.translation["response"] = chat.response_part()
    if call.error is None:
        if broke:
            call.error = broke
        elif chat.failed:
            call.error = chat.failed
            call.outcome = "malformed_response" if chat.problem else None
        elif not chat.done:
            call.error = "upstream chat stream ended without [DONE]"
    if call.error:
        call.translation["error"] = call.error
    if disconnected:  # nobody to tell: the record is all that is left to write
        call.response, call.usage, call.ttft_s = asm.response_part(), asm.usage or chat.usage, asm.ttft_s
        return
    if not tr.stream:
        if call.error:
            return await fail(502, f"upstream {state.upstream.shown}: {call.error}", "upstream_error")
        return await _answer(state, call, tr, rid, chat.response_part(), reply)
    if call.error:
        chat.fail(call.error)
    else:
        chat.finish()
    await send(chat.take())
    await reply.body(b"")
    call.response, call.usage, call.ttft_s = asm.response_part(), asm.usage or chat.usage, asm.ttft_s
    _with_tokens(call.response, call.translation["response"])
    call.translation["notes"] = tr.notes
    if not call.error and tr.api == "responses" and tr.request.get("store") is not False:
        state.history.put(rid, [*tr.conversation, assistant_message(call.translation["response"])])
