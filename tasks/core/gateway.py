"""The model gateway: every model call of evolforge goes through `Gateway.chat`.

- one OpenAI-compatible base URL, one API key from the environment
  (`EVOLFORGE_API_KEY`, else `OPENAI_API_KEY`; never from a file, never logged:
  `mask_secret` is the only way it is ever shown); a key goes over plain http
  only to a loopback host unless `gateway.allow_key_over_http` says otherwise
  (`check_key_transport`);
- a model per stage (`[models]` in config);
- bounded concurrency (a semaphore per gateway, plus an optional Prefect
  global concurrency limit with slot decay), derived from the endpoint unless
  `gateway.concurrency` sets it (`derive_concurrency`: the embedded server's
  slots, REMOTE_CONCURRENCY for a remote endpoint);
- retries with exponential backoff and full jitter on 429, 5xx, timeouts,
  connection errors and malformed bodies, honouring Retry-After;
- no retry on 400/401/403/404/422: those fail at once with `GatewayError`,
  whose message names the base URL, the model and the likely fix;
- structured outputs (tasks/core/structured.py): a JSON call passes its reply's pydantic model and goes out
  with `response_format` json_schema (strict); an endpoint that rejects the field gets json_object, then no
  field (the prompt describes the JSON), and the mode that worked is remembered per endpoint and model;
- fail fast: when the endpoint is unreachable for `fail_fast_after`
  consecutive calls, every further call raises `EndpointDown` at once;
- stopping (tasks/core/stopping.py): once a signal stops the run, no call is sent (`RunStopped`), the
  connections of the calls in flight are shut down (`abort_in_flight`), and each cut-off call gets a
  `cancelled` ledger row; a reply that arrived is kept (ledgered and journaled: it was paid for);
- one cost-ledger row per attempt; a journal (see storage/journal.py) replays
  finished calls on resume so they are never sent twice;
- `check_models(stages)`: one minimal completion per distinct model of the
  stages a flow is about to use (what `evolforge preflight` prints), so a key the
  endpoint refuses or a model it does not serve stops the run before any work.

The calls go out on a plain pooled httpx client (JSON in, JSON out): importing the
openai SDK took 0.6 to 2 s of a command's start-up, and its request building was
client CPU per call; the gateway used only its transport, auth and error types.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import socket
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import httpcore
import httpx

from evolforge.config.settings import Settings
from evolforge.storage.journal import CallJournal
from evolforge.storage.ledger import LedgerWriter
from evolforge.tasks.core import llama_server, stopping, structured
from evolforge.tasks.core.json_parse import JSONParseFailure, extract_json
from evolforge.tasks.core.keys import (  # noqa: F401 - re-exported: the gateway's key API
    API_KEY_ENV,
    NO_KEY,
    InsecureKeyTransport,
    check_key_transport,
    is_loopback,
    mask_secret,
    read_api_key,
)
from evolforge.tasks.core.pricing import PriceBook
from evolforge.tasks.core.tls import tls_context, tls_problem

log = logging.getLogger("evolforge.gateway")

PREFLIGHT_PROMPT = "Reply with the word OK."  # the pre-flight probe: one minimal completion per model
RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529}
# Calls in flight against a remote endpoint when gateway.concurrency is 0 (a hosted API or a vLLM server batches
# far more than the embedded model's slots; its rate limits answer 429, which the gateway backs off from).
REMOTE_CONCURRENCY = 32


def derive_concurrency(settings: Settings, base_url: str, embedded: bool) -> tuple[int, str]:
    """The gateway's calls in flight and where the number comes from (what a run's first lines say).

    A remote endpoint: `gateway.concurrency` as given, or REMOTE_CONCURRENCY when it is 0 (the default). The
    embedded model: its server's capacity (llama_server.concurrency_cap: embedded.max_concurrent_calls, else one
    call per llama-server slot, read from its /props), lowered to `gateway.concurrency` when that is set and
    smaller: calls beyond the slots only queue in the server and run into the client timeout."""
    explicit = settings.gateway.concurrency
    if not embedded:
        if explicit:
            return explicit, "gateway.concurrency"
        return REMOTE_CONCURRENCY, "the default for a remote endpoint; gateway.concurrency sets another"
    root = base_url.rstrip("/").removesuffix("/v1")
    cap, why = llama_server.concurrency_cap(settings.embedded, root)
    if explicit and explicit < cap:
        return explicit, f"gateway.concurrency, under {why}"
    return cap, why


def model_roles() -> tuple[str, ...]:
    """Every role of the [models] section (each may name its own model; `default` is the fallback)."""
    from evolforge.config.sections.gateway import ModelMap

    return tuple(name for name in ModelMap.model_fields if name != "default")


class GatewayError(RuntimeError):
    """A call that cannot succeed by retrying (bad request, auth, unknown model) or ran out of retries."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False, fatal: bool = False):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.fatal = fatal or status in (401, 403, 404)


class EndpointDown(GatewayError):
    """The endpoint is unreachable; the run stops instead of failing every record one by one."""


class MalformedResponse(Exception):
    pass


class StatusError(Exception):
    """The endpoint answered with an HTTP error status (the body is in the message, the headers in `response`)."""

    def __init__(self, response: httpx.Response):
        try:
            body = response.text
        except Exception:  # noqa: BLE001 - an undecodable body is not worth a second error
            body = "<undecodable body>"
        super().__init__(f"Error code: {response.status_code} - {body[:500]}")
        self.status_code = response.status_code
        self.response = response


class CallTimeout(Exception):
    """The call did not finish within gateway.timeout_seconds."""


class ConnectionFailed(Exception):
    """The endpoint could not be reached, or dropped the connection before a whole reply."""


@dataclass
class CallResult:
    text: str
    model: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    latency_s: float = 0.0
    attempts: int = 1
    replayed: bool = False

    def to_journal(self) -> dict:
        return asdict(self)


@dataclass
class GatewayStats:
    calls: int = 0
    attempts: int = 0
    retries: int = 0
    replayed: int = 0
    failures: int = 0
    json_failures: int = 0
    format_downgrades: int = 0  # requests an endpoint rejected for their response_format (sent again without it)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **kw: int) -> None:
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("calls", "attempts", "retries", "replayed", "failures", "json_failures",
                                                  "format_downgrades")}


def call_key(stage: str, model: str, messages: list[dict], params: dict, task_id: str, purpose: str = "") -> str:
    """Deterministic identity of a call, used to replay it from the journal."""
    blob = json.dumps([stage, model, messages, params, task_id, purpose], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _fix_hint(status: int | None, base_url: str, model: str) -> str:
    if status == 401:
        return "the API key was refused: set EVOLFORGE_API_KEY (or OPENAI_API_KEY) to a valid key for this endpoint"
    if status == 403:
        return "the key is not allowed to use this model or endpoint: check the key's permissions"
    if status == 404:
        return (f"the endpoint has no model {model!r} or no such path: check `[models]` in the config and that "
                f"base_url {base_url!r} ends with /v1 (list its models with `evolforge preflight`)")
    if status in (400, 422):
        return "the endpoint rejected the request: check max_new_tokens against the model's context and that the model supports chat"
    return "see the message above"


class Gateway:
    def __init__(
        self,
        settings: Settings,
        *,
        base_url: str,
        run_id: str,
        ledger: LedgerWriter | None = None,
        api_key: str | None = None,
        embedded_models: set[str] | frozenset = frozenset(),
        sleep: Callable[[float], None] = stopping.sleep,
    ):
        self.settings = settings
        self.cfg = settings.gateway
        self.base_url = base_url.rstrip("/")
        self.run_id = run_id
        self.ledger = ledger
        self.prices = PriceBook(settings.pricing, embedded_models)
        self.embedded_models = set(embedded_models)
        self._api_key = api_key if api_key is not None else (read_api_key() or NO_KEY)
        check_key_transport(self.base_url, self._api_key, self.cfg.allow_key_over_http)
        self.max_in_flight, self.concurrency_source = derive_concurrency(
            settings, self.base_url, bool(self.embedded_models))
        # retries are ours (counted, ledgered, Retry-After aware): the client itself never retries
        self._backend = _AbortableBackend()
        limits = httpx.Limits(max_connections=max(100, 2 * self.max_in_flight),
                              max_keepalive_connections=max(20, self.max_in_flight))
        transport = httpx.HTTPTransport(verify=tls_context(settings), limits=limits)  # gateway.ca_bundle
        pool = getattr(transport, "_pool", None)
        if pool is not None and hasattr(pool, "_network_backend"):
            pool._network_backend = self._backend  # its sockets, so a stop can cut the calls in flight
        self._client = httpx.Client(
            timeout=self.cfg.timeout_seconds, transport=transport,
            headers={"Authorization": f"Bearer {self._api_key}", "Content-Type": "application/json",
                     "Accept": "application/json"},
        )
        self._unregister_abort = stopping.on_abort(self.abort_in_flight)
        self._completions_url = self.base_url + "/chat/completions"
        self._sem = threading.BoundedSemaphore(self.max_in_flight)
        self._sleep = sleep
        self._down_lock = threading.Lock()
        self._consecutive_unreachable = 0
        self._down_reason: str | None = None
        self.stats = GatewayStats()

    # ------------------------------------------------------------------ public
    def model_for(self, stage: str) -> str:
        return self.settings.models.for_stage(stage)

    def max_tokens_for(self, requested: int) -> int:
        if self.embedded_models and self.settings.uses_embedded_model:
            return min(requested, self.settings.embedded.max_new_tokens)
        return requested

    def concurrency_line(self) -> str:
        """What a run's first lines say about the calls in flight."""
        return f"gateway: {self.max_in_flight} calls in flight (from {self.concurrency_source})"

    def describe(self) -> str:
        return f"{self.base_url} (key {mask_secret(self._api_key if self._api_key != NO_KEY else None)})"

    def chat(
        self,
        stage: str,
        messages: list[dict],
        *,
        task_id: str,
        purpose: str = "",
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        json_mode: bool = False,
        schema: type | None = None,
        journal: CallJournal | None = None,
        model: str | None = None,
    ) -> CallResult:
        """One chat completion. `json_mode`: the reply is JSON; `schema` (a pydantic model): the reply is JSON of
        that model's shape (response_format json_schema, strict; see tasks/core/structured.py)."""
        model = model or self.model_for(stage)
        params: dict[str, Any] = {}
        if temperature is not None:
            params["temperature"] = temperature
        if top_p is not None:
            params["top_p"] = top_p
        if max_tokens is not None:
            params["max_tokens"] = self.max_tokens_for(max_tokens)
        if json_mode or schema is not None:
            # the best format the call may use: the journal key is computed with it, whatever the endpoint takes
            best = self.cfg.structured_outputs if schema is not None else \
                structured.lower_mode(self.cfg.structured_outputs, "json_object")
            fmt = structured.response_format(best, schema, keep_lengths=self._keep_lengths(model))
            if fmt is not None:
                params["response_format"] = fmt
        key = call_key(stage, model, messages, params, task_id, purpose)
        if journal is not None:
            cached = journal.get(key)
            if cached is not None:
                self.stats.add(replayed=1)
                res = CallResult(**cached)
                res.replayed = True
                return res
        result = self._call_with_retries(stage, model, messages, params, task_id)
        if journal is not None:
            journal.put(key, result.to_journal())
        return result

    def chat_json(self, stage: str, messages: list[dict], *, expect: type | tuple = dict, **kw) -> tuple[Any, CallResult]:
        """A JSON call (pass `schema=` the reply's pydantic model for a schema-constrained one); returns
        (parsed or None, result). Unparseable output is counted, not raised; the caller validates the shape."""
        res = self.chat(stage, messages, json_mode=True, **kw)
        try:
            return extract_json(res.text, expect), res
        except JSONParseFailure as e:
            self.stats.add(json_failures=1)
            log.info("unparseable JSON from %s for task %s: %s", res.model, kw.get("task_id"), e)
            return None, res

    def check_reachable(self, stages: tuple[str, ...] | None = None,
                        extra_models: tuple[str, ...] = ()) -> list[dict]:
        """Before a run: one minimal completion per distinct model of the [models] roles `stages` (default: every
        role) plus `extra_models`. A refused key, an unknown model or a down endpoint raises here, naming the
        model and the roles."""
        url = self.base_url + "/models"
        try:  # a refused or hanging connection: down at once, without a completion's retries
            with httpx.Client(timeout=min(10.0, self.cfg.timeout_seconds), verify=tls_context(self.settings)) as c:
                c.get(url, headers={"Authorization": f"Bearer {self._api_key}"})
        except httpx.HTTPError as e:
            if (tls := tls_problem(self.base_url, e)) is not None:
                raise EndpointDown(tls) from None
            raise EndpointDown(
                f"model endpoint {self.base_url} is unreachable ({type(e).__name__}: {e}); "
                "start it, fix gateway.base_url, or leave base_url empty to use the embedded model"
            ) from None
        report = self.check_models(model_roles() if stages is None else stages, extra_models)
        failed = [r for r in report if not r["ok"]]
        if failed:
            first = failed[0]
            err = first["exception"]
            msg = (f"pre-flight failed for model {first['model']!r} (stages {', '.join(first['stages'])}) at "
                   f"{self.base_url}: {first['error']}")
            raise (EndpointDown(msg) if isinstance(err, EndpointDown) else GatewayError(
                msg, status=getattr(err, "status", None), retryable=getattr(err, "retryable", False),
                fatal=not getattr(err, "retryable", False)))
        return report

    def check_models(self, stages: tuple[str, ...] | list[str], extra_models: tuple[str, ...] = ()) -> list[dict]:
        """One minimal completion per distinct model of `stages`; a report row per model (never raises)."""
        by_model: dict[str, list[str]] = {}
        for stage in stages:
            by_model.setdefault(self.model_for(stage), []).append(stage)
        for model in extra_models:  # models no stage above uses (variant writers, module roles)
            if model not in by_model:
                by_model[model] = ["extra"]
        report = []
        for model, used_by in by_model.items():
            t0 = time.perf_counter()
            try:
                res = self.chat("preflight", [{"role": "user", "content": PREFLIGHT_PROMPT}],
                                task_id="preflight", purpose="preflight", max_tokens=4, temperature=0.0, model=model)
                report.append({"model": model, "stages": used_by, "ok": True,
                               "latency_s": round(time.perf_counter() - t0, 3), "reply": res.text[:40]})
            except GatewayError as e:
                report.append({"model": model, "stages": used_by, "ok": False, "error": str(e), "exception": e})
        return report

    def close(self) -> None:
        self._unregister_abort()
        self._client.close()

    def abort_in_flight(self) -> None:
        """Cut the calls in flight (a stopping run): their connections are shut down, so each returns at once
        with a connection error, which `_call_with_retries` ledgers as `cancelled` and turns into RunStopped."""
        self._backend.abort()

    def structured_mode(self, model: str | None = None, stage: str = "judge") -> str:
        """The response_format mode a schema call to `model` goes out with now (json_schema, json_object, prompt)."""
        model = model or self.model_for(stage)
        remembered = structured.remembered_mode(self.base_url, model)
        best = self.cfg.structured_outputs
        return structured.lower_mode(best, remembered) if remembered else best

    def _keep_lengths(self, model: str) -> bool:
        how = self.cfg.schema_string_lengths
        return how == "keep" or (how == "auto" and model in self.embedded_models)

    # ---------------------------------------------------------------- internals
    def _call_with_retries(self, stage: str, model: str, messages: list[dict], params: dict, task_id: str) -> CallResult:
        attempts_allowed = self.cfg.max_retries + 1
        last_err: Exception | None = None
        last_status: int | None = None
        self.stats.add(calls=1)
        requested = params.get("response_format")
        mode = structured.mode_of(requested)
        if requested is not None:  # a mode this endpoint and model took before, when lower than the asked one
            remembered = structured.remembered_mode(self.base_url, model)
            mode = structured.lower_mode(mode, remembered) if remembered else mode
        rejected: list[tuple[str, str]] = []  # (mode, why) the endpoint refused in this call
        sent = 0  # requests of this call (the ledger's attempt number); a format downgrade spends no retry
        attempt = 0
        while attempt < attempts_allowed:
            attempt += 1
            sent += 1
            stopping.check()  # a stopping run sends no new call
            if self._down_reason:
                raise EndpointDown(self._down_reason)
            retry_after: float | None = None
            status: int | None = None
            body_params = structured.with_format(params, _format_for(mode, requested)) if requested else params
            t0 = time.perf_counter()
            with self._slot():
                stopping.check()  # waited for a slot while the run was being stopped
                try:
                    text, finish, pt, ct = _unpack(self._post({"model": model, "messages": messages, **body_params}))
                except StatusError as e:
                    status = e.status_code
                    retry_after = _retry_after(e.response)
                    err: Exception = e
                except (CallTimeout, ConnectionFailed) as e:
                    err = e
                except (MalformedResponse, json.JSONDecodeError, ValueError, TypeError) as e:
                    err = MalformedResponse(str(e)) if not isinstance(e, MalformedResponse) else e
                else:
                    latency = time.perf_counter() - t0
                    cost, source = self.prices.cost(model, pt, ct)
                    self._record(stage, task_id, model, sent, "ok", 200, pt, ct, cost, source, latency, None)
                    self.stats.add(attempts=1)
                    self._mark_reachable()
                    if rejected:
                        structured.remember_mode(self.base_url, model, mode, rejected[0][0], rejected[0][1])
                    return CallResult(text, model, pt, ct, finish, latency, sent)
            latency = time.perf_counter() - t0
            self.stats.add(attempts=1)
            cut = stopping.requested() is not None and status is None  # cut off in flight by a stop
            outcome = "cancelled" if cut else _outcome(err, status)
            cost, source = self.prices.cost(model, 0, 0)
            self._record(stage, task_id, model, sent, outcome, status, None, None, cost, source, latency, _short(err))
            if stopping.requested() is not None:
                raise stopping.RunStopped()
            last_err, last_status = err, status
            if requested is not None and mode != "prompt" and structured.rejects_format(status, str(err)):
                # the endpoint does not take this response_format: the same call at once with the next mode
                rejected.append((mode, f"HTTP {status}: {_short(err)}"))
                mode = structured.next_mode(mode)
                self.stats.add(format_downgrades=1)
                self._mark_reachable()
                attempt -= 1
                continue
            if status is not None and status not in RETRYABLE_STATUS:
                self.stats.add(failures=1)
                raise GatewayError(
                    f"{model!r} at {self.base_url} answered HTTP {status} for stage {stage!r}: {_short(err)}. "
                    f"Likely fix: {_fix_hint(status, self.base_url, model)}",
                    status=status,
                ) from None
            if isinstance(err, ConnectionFailed):
                pass  # counted as unreachable only when retries are exhausted
            else:
                self._mark_reachable()
            if attempt < attempts_allowed:
                self.stats.add(retries=1)
                self._sleep(self._backoff(attempt, retry_after))
        self.stats.add(failures=1)
        if isinstance(last_err, ConnectionFailed):
            self._mark_unreachable(last_err)
        raise GatewayError(
            f"{model!r} at {self.base_url} failed {attempts_allowed} attempts for stage {stage!r} "
            f"(last: {_outcome(last_err, last_status)}: {_short(last_err)})",
            status=last_status,
            retryable=True,
        )

    def _post(self, body: dict) -> Any:
        """One chat completion request: the parsed JSON body, or StatusError / CallTimeout / ConnectionFailed /
        json.JSONDecodeError (a 2xx body that is not JSON)."""
        try:
            resp = self._client.post(self._completions_url, content=json.dumps(body, ensure_ascii=False).encode())
        except httpx.TimeoutException as e:
            raise CallTimeout(f"Request timed out after {self.cfg.timeout_seconds:g} s ({type(e).__name__})") from None
        except httpx.TransportError as e:  # refused, reset, closed or truncated mid-reply
            raise ConnectionFailed(f"Connection error ({type(e).__name__}: {e})") from None
        if resp.status_code >= 400:
            raise StatusError(resp)
        return json.loads(resp.content)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        cap = self.cfg.backoff_max_seconds
        if retry_after is not None:
            return min(retry_after, cap * 4)
        expo = min(cap, self.cfg.backoff_base_seconds * (2 ** (attempt - 1)))
        return random.uniform(expo / 2, expo)  # jitter in [expo/2, expo]

    def _slot(self):
        gateway = self

        class _Slot:
            def __enter__(self_inner):
                gateway._sem.acquire()
                name = gateway.cfg.global_concurrency_limit
                if name:
                    from prefect.concurrency.sync import rate_limit

                    try:
                        rate_limit(name, occupy=1, strict=True)
                    except Exception as e:
                        gateway._sem.release()
                        raise GatewayError(
                            f"gateway.global_concurrency_limit {name!r} could not be used ({type(e).__name__}: {e}). "
                            f"Create it with: prefect gcl create {name} --limit N --slot-decay-per-second R",
                            fatal=True,
                        ) from None

            def __exit__(self_inner, *exc):
                gateway._sem.release()

        return _Slot()

    def _record(self, stage, task_id, model, attempt, outcome, status, pt, ct, cost, source, latency, error) -> None:
        if self.ledger is None:
            return
        self.ledger.record(
            run_id=self.run_id, stage=stage, task_id=task_id, model=model, attempt=attempt, outcome=outcome,
            http_status=status, prompt_tokens=pt, completion_tokens=ct, cost_usd=cost, price_source=source,
            latency_s=round(latency, 4), error=error,
        )

    def _mark_reachable(self) -> None:
        with self._down_lock:
            self._consecutive_unreachable = 0

    def _mark_unreachable(self, err: Exception) -> None:
        with self._down_lock:
            self._consecutive_unreachable += 1
            if self._consecutive_unreachable >= self.cfg.fail_fast_after and not self._down_reason:
                self._down_reason = (
                    f"model endpoint {self.base_url} is down: {self._consecutive_unreachable} calls in a row "
                    f"could not connect after {self.cfg.max_retries} retries each ({_short(err)}). "
                    "Finished batches are checkpointed; start the endpoint and run again to resume."
                )
                log.error(self._down_reason)


def _format_for(mode: str, requested: dict | None) -> dict | None:
    """The response_format sent in `mode`, from the one the call asked for."""
    if requested is None or mode == "prompt":
        return None
    if mode == "json_object" or structured.mode_of(requested) == "json_object":
        return {"type": "json_object"}
    return requested


def _unpack(resp: Any) -> tuple[str, str | None, int | None, int | None]:
    """(text, finish_reason, prompt_tokens, completion_tokens) from a chat completion body (a dict)."""
    try:
        choice = resp["choices"][0]
        text = choice["message"].get("content")
    except (AttributeError, IndexError, TypeError, KeyError) as e:
        raise MalformedResponse(f"response has no choices[0].message.content ({str(resp)[:120]!r})") from e
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise MalformedResponse("message content is not a string")
    usage = resp.get("usage") or {}
    pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
    pt = pt if isinstance(pt, int) else None
    ct = ct if isinstance(ct, int) else None
    return text, choice.get("finish_reason"), pt, ct


def _retry_after(response: httpx.Response | None) -> float | None:
    if response is None:
        return None
    raw = response.headers.get("retry-after-ms")
    if raw:
        try:
            return max(0.0, float(raw) / 1000)
        except ValueError:
            pass
    raw = response.headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _outcome(err: Exception | None, status: int | None) -> str:
    if status is not None:
        return f"http_{status}"
    if isinstance(err, CallTimeout):
        return "timeout"
    if isinstance(err, ConnectionFailed):
        return "connection_error"
    if isinstance(err, MalformedResponse):
        return "malformed_response"
    return "error"


def _short(err: Exception | None) -> str:
    if err is None:
        return ""
    msg = str(err).replace("\n", " ")
    for name in API_KEY_ENV:  # defence in depth: never echo a key that a server reflected
        key = os.environ.get(name)
        if key and key in msg:
            msg = msg.replace(key, mask_secret(key))
    return msg[:300]


class _TrackedStream(httpcore.NetworkStream):
    """A connection's stream, known to its backend until closed (so a stop can shut it down)."""

    def __init__(self, stream, backend: "_AbortableBackend"):
        self._stream = stream
        self._backend = backend
        backend._streams.add(self)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, timeout)

    def close(self) -> None:
        self._backend._streams.discard(self)
        self._stream.close()

    def start_tls(self, *args, **kwargs):
        self._backend._streams.discard(self)
        return _TrackedStream(self._stream.start_tls(*args, **kwargs), self._backend)

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class _AbortableBackend(httpcore.SyncBackend):
    """httpcore's network backend, keeping its open streams so `abort` can shut them down: a read blocked on
    a slow reply returns at once (closing a client from another thread does not do that)."""

    def __init__(self) -> None:
        super().__init__()
        self._streams: weakref.WeakSet = weakref.WeakSet()

    def connect_tcp(self, *args, **kwargs):
        return _TrackedStream(super().connect_tcp(*args, **kwargs), self)

    def abort(self) -> None:
        for stream in list(self._streams):
            sock = stream.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
