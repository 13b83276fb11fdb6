"""The recording proxy as an ASGI app (Starlette): forward every call unchanged, record it after the reply.

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
- The door (tasks/core/request_guard.py), before anything else: `Host` must name this machine (a web page or a
  DNS-rebinding name is refused, 403), browser-originated requests (`Origin`, `Sec-Fetch-Site: cross-site`) are
  refused unless `proxy.allowed_origins` lets the page in, then the access token (401). Refused here, the call is
  recorded under the session `(refused)`, which no client can name.
- Then the session name (matched in full; 400, recorded under `invalid`), its place in the tree (409), the body
  (over `max_body_bytes`: 413; a body that is not declared JSON: 415; malformed JSON, nested past the parser's
  depth, or not an object on a recorded route: 400).
- Calls the proxy refused never reached the upstream: their ledger row costs 0.0 (`price_source` "not forwarded").
- A non-streamed answer on a recorded route must be of its API's form (tasks/proxy/wires.py): otherwise the
  client gets a 502 `upstream_invalid_response` and the record is failed (ledger outcome `malformed_response`).
  The upstream's own errors (any status but 200) pass through as sent.
- A pooled keep-alive connection the upstream had closed, found so before any response byte, gets the call sent
  once more on a new connection (`call_upstream`; the record's `upstream_retry`, its ledger row attempt 2).
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
not forwarded as sent: tasks/proxy/translate.py makes each a POST /chat/completions and answers in the client's
API (JSON, or an event stream built chunk by chunk from the chat stream). The record keeps the client's view
(`request`, `response`) and the chat call under `translation` (request, upstream status, the chat reply's part,
error, what had no chat form); its ledger row is the one of the call. A request chat cannot carry is a 400, a chat
reply not of the chat form a 502, an upstream error its status (502 for one under 400), all in the client API's
error form (Anthropic's `{"type": "error", ...}` for Messages); a chat stream that breaks or ends without [DONE]
ends the client's stream with its API's error event.

Keys, one setting per upstream API, each sent only in its API's header: the OpenAI-style APIs (chat, completions,
Responses, anything else under /v1, and Messages translated to chat) get `proxy.openai_key_env` (default
EVOLFORGE_API_KEY / OPENAI_API_KEY) as `Authorization: Bearer`; Messages calls forwarded as Messages get
`proxy.anthropic_key_env` (default ANTHROPIC_API_KEY) as `x-api-key` and never the OpenAI key. A call that carries
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

import asyncio
import base64
import contextlib
import contextvars
import itertools
import logging
import os
import re
import threading
import time
import weakref
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aiohttp
import yarl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from evolforge.config.settings import Settings
from evolforge.storage.ledger import LedgerWriter
from evolforge.storage.proxy_sets import ProxyLayout, RecordLog, SessionParents
from evolforge.tasks.core.gateway import InsecureKeyTransport, check_key_transport, is_loopback, read_api_key
from evolforge.tasks.core.keys import token_accepted
from evolforge.tasks.core.pricing import PriceBook, cache_tokens
from evolforge.tasks.core.request_guard import cors_settings, door_refusal, json_body_refusal
from evolforge.tasks.proxy import translate
from evolforge.tasks.proxy.recording import dumps, loads, model_name, response_part, response_problem, usage_of
from evolforge.tasks.proxy.wires import WIRES, Wire

log = logging.getLogger("evolforge.proxy")

SESSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # matched in full (`valid_session`)
REFUSED_SESSION = "(refused)"  # calls refused at the door: a name no client can give (SESSION_RE refuses it)
INVALID_SESSION = "invalid"
RECORDED_ROUTES = {"chat/completions": "chat.completions", "completions": "completions", "responses": "responses",
                   "messages": "messages"}  # the wire of each: tasks/proxy/wires.py
HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
               "upgrade", "proxy-authorization", "proxy-connection", "accept-encoding"}
OWN_HEADERS = ("x-evolforge-", "x-openforge-")
CLIENT_KEY_HEADERS = ("x-api-key", "api-key")  # keys some clients send beside Authorization (Anthropic, Azure)
CREDENTIAL_HEADERS = ("authorization", *CLIENT_KEY_HEADERS)
# each recorded route's output-token limits (proxy.embedded_max_tokens caps them); the last is set when none is
OUTPUT_LIMITS = {"chat/completions": ("max_completion_tokens", "max_tokens"), "completions": ("max_tokens",),
                 "responses": ("max_output_tokens",), "messages": ("max_tokens",)}


def output_capped(body: dict, path: str, cap: int) -> tuple[dict, dict] | None:
    """`body` with its output-token limit at most `cap` (proxy.embedded_max_tokens: an embedded model on a CPU
    must not write for minutes), and what was changed ({field: what the client asked, None: nothing}); None when
    the body already asks for `cap` tokens or fewer, or `cap` is 0. A capped chat call gets `max_tokens` too
    (the field every server reads; some ignore max_completion_tokens)."""
    keys = OUTPUT_LIMITS.get(path)
    if not cap or not keys:
        return None

    def within(v) -> bool:
        return type(v) is int and 1 <= v <= cap

    present = [k for k in keys if body.get(k) is not None]
    if present and all(within(body[k]) for k in present):
        return None
    changed = {k: body.get(k) for k in dict.fromkeys([*present, keys[-1]]) if not within(body.get(k))}
    return {**body, **dict.fromkeys(changed, cap)}, changed


def operator_keys(settings: Settings, environ: dict | None = None) -> dict[str, str | None]:
    """The operator's key of each upstream API ("openai": Bearer, "messages": x-api-key), from its own setting."""
    environ = os.environ if environ is None else environ
    cfg = settings.proxy
    openai_key = environ.get(cfg.openai_key_env) or None if cfg.openai_key_env else read_api_key(environ)
    messages_key = environ.get(cfg.anthropic_key_env) or None if cfg.anthropic_key_env else None
    return {"openai": openai_key, "messages": messages_key}


def api_of(path: str, translated: bool = False) -> str:
    """The upstream API a call under /v1 reaches: "messages" (Anthropic's, forwarded as Messages) or "openai"."""
    return "messages" if (path == "messages" or path.startswith("messages/")) and not translated else "openai"
PASS_BACK = {"content-type", "retry-after", "x-request-id", "openai-processing-ms", "x-ratelimit-limit-requests",
             "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"}
MAX_ROLE_CHARS = 128
DOOR_MEMO = 256  # door answers remembered (ProxyState.door)
MAX_ERROR_CHARS = 2000
MAX_REFUSED_CHARS = 256  # of the path and the error in the record of a refused call (the client chose both)


class RefusalBudget:
    """A token bucket for the records of refused calls: `take()` says whether this one is recorded; the calls it
    refused to record are counted (`pending`) until a record carries the count."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), time.monotonic()
        self.pending = 0
        self.lock = threading.Lock()

    def take(self) -> int | None:
        """None: do not record this call (counted); else the count of unrecorded refusals before it (now reset)."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens < 1.0:
                self.pending += 1
                return None
            self.tokens -= 1.0
            count, self.pending = self.pending, 0
            return count

    def drain(self) -> int:
        with self.lock:
            count, self.pending = self.pending, 0
            return count


class ProxyConfigError(ValueError):
    """The proxy cannot start as configured (e.g. a public bind address without an access token)."""


def valid_session(name) -> bool:
    return isinstance(name, str) and SESSION_RE.fullmatch(name) is not None


def redact_url(url: str) -> str:
    """The URL with its userinfo (user:password@) replaced by ***@: how an upstream is shown and written."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


@dataclass(frozen=True)
class Upstream:
    """Where calls go. `url`: the base URL without userinfo (no trailing slash); `shown`: the URL as shown and
    written (userinfo masked); `authorization`: Basic credentials from the URL's userinfo; `key_may_travel`: a key
    may be sent to it (https, a loopback host, or gateway.allow_key_over_http)."""

    url: str
    shown: str
    authorization: str | None
    key_may_travel: bool


def upstream_of(settings: Settings, url: str, env_key: str | None) -> Upstream:
    """Check the upstream before anything is served or written: InsecureKeyTransport when the environment key or
    the URL's credentials would go over plain http to a host that is not loopback (gateway.allow_key_over_http
    allows it), ProxyConfigError when both an environment key and URL credentials would be the Authorization."""
    url = url.rstrip("/")
    parts = urlsplit(url)
    shown = redact_url(url)
    authorization = None
    if "@" in parts.netloc:
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        url = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    if authorization and env_key:
        raise ProxyConfigError(
            f"the upstream {shown} carries credentials in its URL and EVOLFORGE_API_KEY / OPENAI_API_KEY is set: both "
            "would be the Authorization header. Drop the credentials from the URL or unset the key.")
    allow = settings.gateway.allow_key_over_http
    check_key_transport(shown, env_key or (authorization and "url-credentials"), allow)  # the gateway's one check
    check_key_transport(shown, operator_keys(settings)["messages"], allow)  # the Messages key: the same rule
    try:
        check_key_transport(shown, "a client's key", allow)
        may_travel = True
    except InsecureKeyTransport:
        may_travel = False
    return Upstream(url=url, shown=shown, authorization=authorization, key_may_travel=may_travel)


@dataclass
class ProxyState:
    settings: Settings
    upstream: Upstream
    layout: ProxyLayout
    token: str | None
    embedded_models: set[str] = field(default_factory=set)
    run_id: str = field(default_factory=lambda: f"proxy-{int(time.time())}")
    parents: dict[str, str | None] = field(default_factory=dict)  # what this process knows of the session tree
    lock: threading.Lock = field(default_factory=threading.Lock)
    shared: SessionParents | None = None  # the tree shared by the worker processes (proxy.workers > 1)

    def __post_init__(self):
        cfg = self.settings.proxy
        self.log = RecordLog(self.layout, cfg.flush_seconds)
        self.ledger = LedgerWriter(self.layout.ledger_dir, self.run_id, cfg.flush_seconds)
        self.prices = PriceBook(self.settings.pricing, self.embedded_models)
        self.keys = operator_keys(self.settings)
        self.refusals = RefusalBudget(cfg.refused_records_per_second, cfg.refused_records_burst)
        self.client: aiohttp.ClientSession | None = None  # made on the server's event loop (lifespan)
        self._fresh: aiohttp.ClientSession | None = None  # fresh_client, made at the first retry (call_upstream)
        self.calls = 0
        self.history = translate.History(cfg.translate_history)  # translated Responses, for previous_response_id
        self._door_memo: dict[tuple, tuple[int, str, str] | None] = {}
        # record ids: a random prefix of this process and a counter (no random draw, no syscall, per call)
        self._id_prefix = os.urandom(8).hex()
        self._ids = itertools.count()

    def record_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids):016x}"

    @property
    def embedded(self) -> bool:
        """Whether the upstream is the embedded model (the CLI names its alias; any other upstream, none)."""
        return bool(self.embedded_models)

    def cap_output(self, call: "Call", body: dict, path: str) -> dict | None:
        """The body to send the embedded model with its output limit capped (proxy.embedded_max_tokens), noted in
        the call's record; None to send it as it is (another upstream, or within the cap)."""
        if not self.embedded:
            return None
        capped = output_capped(body, path, self.settings.proxy.embedded_max_tokens)
        if capped is None:
            return None
        call.output_cap = {"limit": self.settings.proxy.embedded_max_tokens, "asked": capped[1]}
        return capped[0]

    def translates(self, path: str) -> bool:
        """Whether calls to this route go to the upstream as chat completions (proxy.translate)."""
        return self.settings.proxy.translate in translate.TRANSLATABLE.get(path, ())

    def door(self, headers: dict[str, str], scope: dict) -> tuple[int, str, str] | None:
        """Host and browser checks (tasks/core/request_guard.py): (status, message, kind) to refuse, or None.
        The answer depends only on the three headers and the local address, so it is remembered for the few
        combinations a running proxy sees (at most DOOR_MEMO, then forgotten wholesale: any client can send
        new Host values, and memory must not grow with them)."""
        local = (scope.get("server") or ("",))[0]
        key = (headers.get("host"), headers.get("origin"), headers.get("sec-fetch-site"), local)
        try:
            return self._door_memo[key]
        except KeyError:
            pass
        cfg = self.settings.proxy
        answer = door_refusal(headers, (cfg.host, local), cfg.allowed_hosts, cfg.allowed_origins, "proxy")
        if len(self._door_memo) >= DOOR_MEMO:
            self._door_memo.clear()
        self._door_memo[key] = answer
        return answer

    def _session(self, connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=self.settings.proxy.timeout_seconds),
            auto_decompress=False, skip_auto_headers=("User-Agent",))

    async def open(self) -> None:
        limit = self.settings.proxy.max_connections
        self.client = self._session(_PoolConnector(limit=limit, limit_per_host=limit))

    def fresh_client(self) -> aiohttp.ClientSession:
        """A client whose every call opens a new connection (and closes it after): the one retry's (`call_upstream`)."""
        if self._fresh is None:
            limit = self.settings.proxy.max_connections
            self._fresh = self._session(aiohttp.TCPConnector(limit=limit, limit_per_host=limit, force_close=True))
        return self._fresh

    async def aclose(self) -> None:
        for client in (self.client, self._fresh):
            if client is not None:
                await client.close()
        unrecorded = self.refusals.drain()
        if unrecorded:  # the refused calls counted since the last refused record
            self.log.record({"record_id": self.record_id(), "session": REFUSED_SESSION, "parent_session": None,
                             "role": None, "route": "(refusals)", "method": None, "path": None, "stream": False,
                             "status": 0, "error": f"{unrecorded} refused calls not recorded (rate limit)",
                             "model": None, "ts": time.time(), "latency_s": 0.0, "ttft_s": None, "request": None,
                             "response": None, "unrecorded_refusals": unrecorded})
        self.log.close()
        self.ledger.close()
        if self.shared is not None:
            self.shared.close()


_REUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("evolforge_proxy_reused", default=False)


class _PoolConnector(aiohttp.TCPConnector):
    """The pooled connector of the proxy's upstream calls; it notes, for the call being made (a context variable:
    each call is its own task), whether the connection it hands out had carried a call before (a pooled keep-alive
    connection the upstream may have closed meanwhile)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._used: weakref.WeakSet = weakref.WeakSet()

    async def connect(self, req, traces, timeout):
        conn = await super().connect(req, traces, timeout)
        proto = conn.protocol
        _REUSED.set(proto in self._used)
        self._used.add(proto)
        return conn


def _closed_before_reply(e: BaseException) -> bool:
    """Whether an upstream call failed because its reused keep-alive connection was found closed before any byte
    of a response came: the server had closed it (llama-server closes idle ones), the call is sent again."""
    if not _REUSED.get():
        return False
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return isinstance(e.message, str)  # not a partial response head
    return isinstance(e, aiohttp.ClientOSError) and not isinstance(e, aiohttp.ClientConnectorError)


async def call_upstream(state: ProxyState, call: "Call", method: str, url, data: bytes | None,
               headers: dict[str, str]) -> aiohttp.ClientResponse:
    """The upstream's response (its head read) to one call. A pooled connection found closed before any response
    byte (`_closed_before_reply`) is retried once, on a new connection (`fresh_client`), and the call's record
    names the retry (`upstream_retry`, its ledger row attempt 2); never once response bytes have come."""
    _REUSED.set(False)
    try:
        return await state.client.request(method, url, data=data, headers=headers)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        if not _closed_before_reply(e):
            raise
        call.retry = {"error": type(e).__name__, "at_s": round(time.perf_counter() - call.t0, 6)}
    return await state.fresh_client().request(method, url, data=data, headers=headers)


def check_bind(host: str, token: str | None) -> None:
    if not is_loopback(host) and not token:
        raise ProxyConfigError(
            f"refusing to bind the recording proxy to {host} without an access token: set the environment variable "
            "named by proxy.token_env (default EVOLFORGE_PROXY_TOKEN); clients then send it as "
            "X-Evolforge-Proxy-Token. Loopback (127.0.0.1) needs none.")


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(_error_payload(status, message, kind), status_code=status)


def _error_payload(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}


def _text(value: str | None, limit: int = MAX_ERROR_CHARS) -> str | None:
    """A string any JSON writer takes: at most `limit` characters, lone surrogates replaced."""
    if value is None:
        return None
    return value[:limit].encode("utf-8", "replace").decode("utf-8")


class Call:
    """One proxied call's bookkeeping, finished into exactly one record and one ledger row (`finish`)."""

    def __init__(self, state: ProxyState, request: Incoming, route: str):
        self.state = state
        self.t0 = time.perf_counter()
        self.ts = time.time()
        self.session = REFUSED_SESSION  # until the call is past the door
        self.route = route
        self.wire: Wire | None = None  # the API whose request and response are recorded (None: passed through)
        self.method = request.method
        self.path = request.path
        self.parent: str | None = None
        role = request.headers.get("x-evolforge-role") or request.headers.get("x-openforge-role")
        self.role = role[:MAX_ROLE_CHARS] if role else None
        self.body: dict | None = None
        self.stream = False
        self.forwarded = False  # sent to the upstream (a refused call costs nothing)
        self.status = 0
        self.error: str | None = None
        self.outcome: str | None = None  # set where a failure has a name of its own (malformed_response)
        self.response: dict | None = None
        self.usage: dict | None = None
        self.translation: dict | None = None  # the chat call made upstream for a translated call (proxy.translate)
        self.output_cap: dict | None = None  # the output limit the embedded model got instead of the client's
        self.retry: dict | None = None  # the upstream call was sent twice (`call_upstream`): why, and when
        self.ttft_s: float | None = None
        self.latency_s: float | None = None
        self.finished = False
        self._ledger_written = False

    def finish(self) -> None:
        """Write the record and its ledger row, once the response has gone out: on the event loop, no thread
        hop per call (two appends of one line each: O_APPEND writes locally, a buffer on object stores). Never
        raises, and writes once: a record that cannot be built is written in a minimal form."""
        if self.finished:
            return
        self.finished = True
        unrecorded = None
        if not self.forwarded and self.status != 200:  # refused by the proxy: rate-limited, capped records
            unrecorded = self.state.refusals.take()
            if unrecorded is None:
                with self.state.lock:
                    self.state.calls += 1
                return
            self.path = _text(self.path, MAX_REFUSED_CHARS)
            self.error = _text(self.error, MAX_REFUSED_CHARS)
            self.route = _text(self.route, MAX_REFUSED_CHARS)
            self.body = None
        try:
            rec, row = self._build()
            if unrecorded:
                rec["unrecorded_refusals"] = unrecorded
            self._write(rec, row)
        except Exception:  # noqa: BLE001 - a call must never go unrecorded
            log.exception("recording proxy: the record of a call to %s could not be built; a minimal one is written",
                          _text(self.path, 200))
            self.error = f"record could not be built: {self.error or ''}"[:MAX_ERROR_CHARS]
            self.body, self.response, self.usage, self.translation = None, None, None, None
            self._write(*self._build())

    def _build(self) -> tuple[dict, dict]:
        st = self.state
        latency = round(self.latency_s if self.latency_s is not None else time.perf_counter() - self.t0, 6)
        resp = self.response or {}
        body = self.body if isinstance(self.body, dict) else {}
        model = model_name(resp.get("model")) or model_name(body.get("model"))
        usage = self.usage or usage_of(resp.get("usage"))[0] or {}
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not self.forwarded:
            cost, source = 0.0, "not forwarded"
        elif model:
            cost, source = st.prices.cost(model, pt, ct, *cache_tokens(usage))  # cache reads / writes: own rates
        else:
            cost, source = None, "unknown model"
        failed = self.status != 200 or self.error
        outcome = "ok" if not failed else self.outcome or (f"http_{self.status}" if self.status != 200 else "error")
        rec = {
            "record_id": st.record_id(), "session": self.session, "parent_session": self.parent,
            "role": self.role, "route": self.route, "method": self.method, "path": self.path,
            "stream": self.stream, "status": self.status, "error": self.error, "model": model,
            "ts": self.ts, "latency_s": latency, "ttft_s": self.ttft_s,
            "request": self.wire.request_part(body) if body and self.wire else None, "response": self.response,
        }
        if self.translation is not None:
            rec["translation"] = self.translation
        if self.output_cap is not None:
            rec["output_cap"] = self.output_cap
        if self.retry is not None:
            rec["upstream_retry"] = self.retry
        row = dict(stage="proxy", task_id=self.session, model=_text(model), attempt=2 if self.retry else 1,
                   outcome=outcome,
                   http_status=self.status or None, prompt_tokens=pt, completion_tokens=ct, cost_usd=cost,
                   price_source=source, latency_s=latency, error=_text(self.error))
        return rec, row

    def _write(self, rec: dict, row: dict) -> None:
        st = self.state
        if not self._ledger_written:
            st.ledger.record(**row)
            self._ledger_written = True
        st.log.record(rec)  # last: a record on disk means its ledger row is there too
        with st.lock:
            st.calls += 1


class Incoming:
    """What the hot path needs of an ASGI request: method, path, query and lower-cased headers."""

    __slots__ = ("method", "path", "query", "headers", "path_params", "scope")

    def __init__(self, scope: dict, session: str | None):
        self.scope = scope
        self.method = scope["method"]
        self.path = scope["path"]
        self.query = scope.get("query_string") or b""
        self.headers = _headers(scope)
        self.path_params = {"session": session} if session is not None else {}


def _headers(scope: dict) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _session_of(request) -> str:
    """The session the call names: its path's (even empty), else the header's, else "default"."""
    if "session" in request.path_params:
        return request.path_params["session"]
    return request.headers.get("x-evolforge-session") or "default"


def _authorized(state: ProxyState, request) -> bool:
    return token_accepted(state.token, request.headers.get("x-evolforge-proxy-token"),
                          request.headers.get("authorization", ""))


def _forward_headers(state: ProxyState, request, api: str = "openai") -> dict[str, str]:
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


def _claim_session(state: ProxyState, session: str, parent: str | None) -> str | None:
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


class Reply:
    """The client's side of a call: whether the answer has started and ended (an unexpected error then knows
    whether a 500 can still be sent or the stream must be ended)."""

    __slots__ = ("send", "started", "ended")

    def __init__(self, send):
        self.send, self.started, self.ended = send, False, False

    async def start(self, status: int, headers: list) -> None:
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, more: bool = False) -> None:
        self.ended = not more
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def json(self, status: int, payload: dict) -> None:
        data = dumps(payload)
        await self.start(status, [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())])
        await self.body(data)


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
        log.exception("recording proxy: unexpected error on %s %s", call.method, _text(call.path, 200))
        call.error = f"proxy error: {type(e).__name__}"
        with contextlib.suppress(Exception):
            if not reply.started:
                call.status = 500
                await reply.json(500, _error_payload(500, "the recording proxy failed on this call "
                                                     f"({type(e).__name__}); it was recorded", "proxy_error"))
            elif not reply.ended:
                await reply.body(b"")
    finally:
        call.finish()  # after the response has gone out: recording never delays the agent


async def _serve(state: ProxyState, request: Incoming, call: Call, path: str, receive, reply: Reply) -> None:
    async def refuse(status: int, message: str, kind: str) -> None:
        """A JSON error to the client; the call is recorded as failed (by proxy_call, once this returns)."""
        call.status, call.error = status, message
        await reply.json(status, _error_payload(status, message, kind))

    refusal = state.door(request.headers, request.scope)
    if refusal:
        return await refuse(*refusal)
    if not _authorized(state, request):
        return await refuse(401, "missing or wrong proxy access token (X-Evolforge-Proxy-Token)", "unauthorized")
    session = _session_of(request)
    if not valid_session(session):
        call.session = INVALID_SESSION
        return await refuse(400, "bad session name: letters, digits, . _ : - ; at most 128, starting with a letter "
                            "or digit", "invalid_session")
    call.session = session
    parent = request.headers.get("x-evolforge-parent-session")
    call.parent = parent if valid_session(parent) else None
    problem = _claim_session(state, session, parent)
    if problem:
        return await refuse(409, problem, "session_conflict")
    limit = state.settings.proxy.max_body_bytes
    raw, size = await _read_body(receive, limit)
    if size > limit:
        return await refuse(413, f"request body of {size} bytes is over proxy.max_body_bytes ({limit})",
                            "body_too_large")
    refusal = json_body_refusal(request.headers.get("content-type"), bool(raw))
    if refusal:
        return await refuse(*refusal)
    recorded = path in RECORDED_ROUTES and request.method == "POST"
    wire = call.wire = WIRES[path] if recorded else None
    if raw and recorded:
        try:
            call.body = loads(raw)
        except ValueError as e:
            return await refuse(400, f"request body is not valid JSON: {str(e)[:200]}", "invalid_json")
        if not isinstance(call.body, dict):
            return await refuse(400, "request body must be a JSON object", "invalid_json")
        call.stream = call.body.get("stream") is True
    if any(part in (".", "..") for part in path.split("/")):
        return await refuse(400, "dot segments are not allowed in the path", "invalid_path")
    if recorded and wire is not None and state.translates(path):
        return await _serve_translated(state, request, call, path, receive, reply)
    if recorded and isinstance(call.body, dict) and (capped := state.cap_output(call, call.body, path)) is not None:
        raw = dumps(capped)  # the record keeps the client's body; `output_cap` says what the upstream got instead
    up = state.upstream
    url = f"{up.url}/{quote(path, safe=PATH_SAFE)}"
    if request.query:
        url += "?" + request.query.decode("latin-1")
    try:
        target = yarl.URL(url, encoded=True)
    except ValueError:
        return await refuse(400, "the path cannot be forwarded as a URL", "invalid_path")
    call.forwarded = True
    try:
        resp = await call_upstream(state, call, request.method, target, raw or None,
                          _forward_headers(state, request, api_of(path)))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
        return await refuse(502, f"upstream {up.shown} unreachable: {type(e).__name__}", "upstream_unreachable")
    call.status = resp.status
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1", "replace")) for k, v in resp.headers.items()
               if k.lower() in PASS_BACK]
    ctype = resp.headers.get("content-type", "").lower()
    if resp.status == 200 and (ctype.startswith("text/event-stream") or (call.stream and "json" not in ctype)):
        call.stream = True
        return await _relay(resp, call, receive, reply, headers, wire)
    try:
        data = await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return await refuse(502, f"upstream {up.shown} failed mid-response: {type(e).__name__}", "upstream_error")
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
            return await refuse(502, f"upstream {up.shown} returned a body that is not an {wire.name}: "
                                f"{problem}", "upstream_invalid_response")
        if resp.status == 200:
            call.response = wire.response_part(parsed)
            call.usage = wire.ledger_usage(parsed.get("usage"))
        else:
            call.error = _upstream_message(parsed, resp.status)
    elif resp.status != 200:
        call.error = f"upstream answered HTTP {resp.status}"
    await reply.start(resp.status, [*headers, (b"content-length", str(len(data)).encode())])
    await reply.body(data)


async def _relay(resp: aiohttp.ClientResponse, call: Call, receive, reply: Reply, headers: list,
                 wire: Wire | None) -> None:
    """Send the upstream's bytes as they come (no buffering); assemble the record on the side. A client that
    goes away stops the relay (and the upstream call) at once; an upstream that breaks the stream gets the
    client an SSE error event, not a silent cut."""
    wire = wire or WIRES["chat/completions"]  # an unrecorded route's stream: only its timing is kept
    asm = wire.assembler(call.t0)
    gone = asyncio.ensure_future(_disconnected(receive))
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


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


# ------------------------------------------------------------------ translation for chat-only upstreams
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


def _client_error(api: str, status: int, message: str, kind: str | None = None) -> dict:
    """An error body in the client's API: Anthropic's {"type": "error", "error": {...}} for Messages (its kind
    named by status when the proxy has none of its own), OpenAI's {"error": {...}} for Responses."""
    if api == "messages":
        body = translate.anthropic_error(status, message)
        if kind:
            body["error"]["type"] = kind
        return body
    return _error_payload(status, message, kind or "upstream_error")


def _translated_headers(state: ProxyState, request) -> dict[str, str]:
    """The forwarded headers less the client API's own (anthropic-*, openai-beta); a client's x-api-key (the
    anthropic SDK's, Claude Code's) becomes the bearer key a chat upstream reads, under the same rules as a
    client's Authorization (pass_client_key, a key may travel to the upstream)."""
    out = {k: v for k, v in _forward_headers(state, request, "openai").items()
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


async def _serve_translated(state: ProxyState, request: Incoming, call: Call, api: str, receive,
                            reply: Reply) -> None:
    """A Messages or Responses API call made upstream as a chat completion (proxy.translate), answered in the
    client's API, streamed or not. The record keeps the client's view; `call.translation` the chat call."""
    cfg, up, wire = state.settings.proxy, state.upstream, call.wire

    async def fail(status: int, message: str, kind: str | None = None, headers: list | None = None) -> None:
        call.status, call.error = status, message
        data = translate.to_json(_client_error(api, status, message, kind))
        await reply.start(status, [(b"content-type", b"application/json"),
                                   (b"content-length", str(len(data)).encode()), *(headers or ())])
        await reply.body(data)

    if call.body is None:
        return await fail(400, "request body must be a JSON object", "invalid_json")
    try:
        tr = (translate.messages_request(call.body, cfg.translate_model) if api == "messages"
              else translate.responses_request(call.body, state.history, cfg.translate_model))
    except translate.Untranslatable as e:
        return await fail(400, f"this {wire.name.rsplit(' ', 1)[0]} request cannot be made as a chat completion "
                          f"(proxy.translate): {e}", e.kind)
    if (capped := state.cap_output(call, tr.body, translate.CHAT_PATH)) is not None:
        tr.body = capped
    call.translation = tr.record()
    call.forwarded = True
    try:
        resp = await call_upstream(state, call, "POST", f"{up.url}/{translate.CHAT_PATH}", translate.to_json(tr.body),
                          _translated_headers(state, request))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
        return await fail(502, f"upstream {up.shown} unreachable: {type(e).__name__}", "upstream_unreachable")
    call.status = call.translation["status"] = resp.status
    rid = translate.new_id("resp_" if api == "responses" else "msg_")
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
        message = _upstream_message(parsed, resp.status)
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


async def _answer(state: ProxyState, call: Call, tr: translate.Translated, rid: str, part: dict,
                  reply: Reply) -> None:
    """A whole chat reply answered in the client's API: JSON, or the event stream the client asked for."""
    wire = call.wire
    call.translation["response"] = part
    if tr.stream:
        cls = translate.MessagesStream if tr.api == "messages" else translate.ResponsesStream
        events = cls.replay(part, call.t0, tr, wire.error_event, rid).take()
        asm = wire.assembler(call.t0)
        asm.feed(events)
        await reply.start(200, SSE_HEADERS)
        await reply.body(events)
        call.response, call.usage, call.ttft_s = asm.response_part(), asm.usage, asm.ttft_s
    else:
        body = (translate.chat_to_messages(part, tr, rid) if tr.api == "messages"
                else translate.chat_to_responses(part, tr, rid))
        data = translate.to_json(body)
        await reply.start(200, [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())])
        await reply.body(data)
        call.response, call.usage = wire.response_part(body), wire.ledger_usage(body["usage"])
    call.status = 200
    _with_tokens(call.response, part)
    call.translation["notes"] = tr.notes
    if tr.api == "responses" and tr.request.get("store") is not False:
        state.history.put(rid, [*tr.conversation, translate.assistant_message(part)])


async def _relay_translated(state: ProxyState, resp: aiohttp.ClientResponse, call: Call, tr: translate.Translated,
                            rid: str, receive, reply: Reply, fail) -> None:
    """A chat stream re-emitted in the client's API as it comes (or gathered into one reply when the client did
    not ask for a stream). A chat stream that breaks, ends without [DONE], sends an error or an event not of the
    chunk form ends the client's stream with its API's error event (a 502 when not streamed)."""
    wire = call.wire
    cls = translate.MessagesStream if tr.api == "messages" else translate.ResponsesStream
    chat = cls(call.t0, tr, wire.error_event, rid)
    asm = wire.assembler(call.t0)  # the client's view, rebuilt from the bytes it is sent

    async def send(data: bytes) -> None:
        if data:
            asm.feed(data)
            await reply.body(data, more=True)

    gone = asyncio.ensure_future(_disconnected(receive))
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
        state.history.put(rid, [*tr.conversation, translate.assistant_message(call.translation["response"])])


def _upstream_message(parsed, status: int) -> str:
    err = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(err, dict):
        return f"upstream HTTP {status}: {str(err.get('message'))[:300]}"
    if isinstance(err, str):
        return f"upstream HTTP {status}: {err[:300]}"
    return f"upstream HTTP {status}"


async def _capped_body(request: Request, limit: int) -> tuple[bytes | None, int]:
    """The body, or None once it passes `limit` bytes (the rest is drained, not kept)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            parts.append(chunk)
    return (b"".join(parts) if size <= limit else None), size


async def session_event(request: Request) -> Response:
    state: ProxyState = request.app.state.proxy
    if not _authorized(state, request):
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
    raw, size = await _capped_body(request, limit)
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
    if state.token and not _authorized(state, request):
        return JSONResponse({"ok": True})
    return JSONResponse({"ok": True, "upstream": state.upstream.shown, "calls": state.calls})


PATH_SAFE = "/:@!$&'()*+,;=-._~"
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
            refusal = state.door(_headers(scope), scope)
            if refusal:
                return await _send_json(send, refusal[0], _error_payload(*refusal))
        return await rest(scope, receive, send)

    app.state = rest.state
    allowed = state.settings.proxy.allowed_origins
    if not allowed:
        return app
    from starlette.middleware.cors import CORSMiddleware

    outer = CORSMiddleware(app, **cors_settings(allowed))
    outer.state = rest.state
    return outer

