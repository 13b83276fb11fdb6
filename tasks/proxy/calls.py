"""One call through the proxy: what the hot path reads of the ASGI request (`Incoming`), what it sends back
(`Reply`; `refuse`: a JSON error), and its bookkeeping (`Call`), finished into exactly one record and one ledger
row once the response has gone out (`Call.finish`: never raises, writes once; a call the proxy refused is
recorded within the refusal budget, with at most MAX_REFUSED_CHARS of its path and error).
"""

from __future__ import annotations

import logging
import time

from evolforge.tasks.core.pricing import cache_tokens
from evolforge.tasks.proxy.recording import dumps, model_name, usage_of
from evolforge.tasks.proxy.state import REFUSED_SESSION, ProxyState
from evolforge.tasks.proxy.wires import Wire

log = logging.getLogger("evolforge.proxy")

MAX_ROLE_CHARS = 128
MAX_ERROR_CHARS = 2000
MAX_REFUSED_CHARS = 256  # of the path and the error in the record of a refused call (the client chose both)


def clipped(value: str | None, limit: int = MAX_ERROR_CHARS) -> str | None:
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
        self.retry: dict | None = None  # the upstream call was sent twice (UpstreamClient.request): why, and when
        self.ttft_s: float | None = None
        self.latency_s: float | None = None
        self.finished = False
        self._ledger_written = False

    def note_retry(self, error: str) -> None:
        """The upstream call is sent once more (UpstreamClient.request): the first attempt's error, and when."""
        self.retry = {"error": error, "at_s": round(time.perf_counter() - self.t0, 6)}

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
            self.path = clipped(self.path, MAX_REFUSED_CHARS)
            self.error = clipped(self.error, MAX_REFUSED_CHARS)
            self.route = clipped(self.route, MAX_REFUSED_CHARS)
            self.body = None
        try:
            rec, row = self._build()
            if unrecorded:
                rec["unrecorded_refusals"] = unrecorded
            self._write(rec, row)
        except Exception:  # noqa: BLE001 - a call must never go unrecorded
            log.exception("recording proxy: the record of a call to %s could not be built; a minimal one is written",
                          clipped(self.path, 200))
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
        row = dict(stage="proxy", task_id=self.session, model=clipped(model), attempt=2 if self.retry else 1,
                   outcome=outcome,
                   http_status=self.status or None, prompt_tokens=pt, completion_tokens=ct, cost_usd=cost,
                   price_source=source, latency_s=latency, error=clipped(self.error))
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
        self.headers = headers_of(scope)
        self.path_params = {"session": session} if session is not None else {}


def headers_of(scope: dict) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


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


def error_payload(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}


async def refuse(call: Call, reply: Reply, status: int, message: str, kind: str) -> None:
    """A JSON error to the client; the call is recorded as failed (by app.proxy_call, once the call returns)."""
    call.status, call.error = status, message
    await reply.json(status, error_payload(status, message, kind))
