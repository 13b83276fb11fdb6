"""The recording proxy's state in one process: its settings, the upstream and its HTTP client, the record log and
the ledger, prices, the session tree it knows, the door's memo, the translated Responses' history, record ids.

- `ProxyState`: made by the server (tasks/proxy/server.py), opened and closed in the app's lifespan (the upstream
  client on the server's loop; records, ledger rows and the count of unrecorded refusals reach the store on close).
- `RefusalBudget`: a token bucket for the records of refused calls (`proxy.refused_records_per_second`, burst
  `proxy.refused_records_burst`); the calls past it are counted, not recorded.
- `output_capped`: a recorded call's output-token limit capped for the embedded model (`proxy.embedded_max_tokens`).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field

from evolforge.config.settings import Settings
from evolforge.storage.ledger import LedgerWriter
from evolforge.storage.proxy_sets import ProxyLayout, RecordLog, SessionParents
from evolforge.tasks.core.pricing import PriceBook
from evolforge.tasks.core.request_guard import door_refusal
from evolforge.tasks.proxy.translate import TRANSLATABLE
from evolforge.tasks.proxy.translate_responses import History
from evolforge.tasks.proxy.upstream import Upstream, UpstreamClient, operator_keys

REFUSED_SESSION = "(refused)"  # calls refused at the door: a name no client can give (guards.SESSION_RE)
DOOR_MEMO = 256  # door answers remembered (ProxyState.door)
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
        self.http = UpstreamClient(cfg.max_connections, cfg.timeout_seconds)  # opened on the server's loop
        self.calls = 0
        self.history = History(cfg.translate_history)  # translated Responses, for previous_response_id
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

    def cap_output(self, body: dict, path: str) -> tuple[dict, dict] | None:
        """The body to send the embedded model with its output limit capped (proxy.embedded_max_tokens), and what
        the call's record notes of it (`output_cap`); None to send it as it is (another upstream, or within the
        cap)."""
        if not self.embedded:
            return None
        capped = output_capped(body, path, self.settings.proxy.embedded_max_tokens)
        if capped is None:
            return None
        return capped[0], {"limit": self.settings.proxy.embedded_max_tokens, "asked": capped[1]}

    def translates(self, path: str) -> bool:
        """Whether calls to this route go to the upstream as chat completions (proxy.translate)."""
        return self.settings.proxy.translate in TRANSLATABLE.get(path, ())

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

    async def open(self) -> None:
        await self.http.open()

    async def aclose(self) -> None:
        await self.http.close()
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
