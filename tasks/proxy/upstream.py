"""The upstream: where the proxy's calls go, with which operator key, and the HTTP client that makes them.

- `upstream_of(settings, url, env_key)` -> `Upstream`: the base URL without userinfo, as shown and written
  (`redact_url`: userinfo masked), Basic credentials from the URL's userinfo, and whether a key may travel to it
  (https, a loopback host, or gateway.allow_key_over_http: the gateway's own check, tasks/core/keys.py); checked
  before anything is served or written (InsecureKeyTransport, ProxyConfigError).
- `operator_keys(settings)`: the operator's key of each upstream API ("openai": Bearer, "messages": x-api-key);
  `api_of(path)`: which of the two a call under /v1 reaches.
- `check_bind(host, token)`: a bind address that is not loopback needs the access token.
- `UpstreamClient`: the calls' HTTP client (aiohttp, made on the server's event loop): pooled keep-alive
  connections (proxy.max_connections; proxy.timeout_seconds between reads), answers not decompressed (bytes pass
  through as sent). A call sent on a pooled connection the upstream had already closed (llama-server closes idle
  ones), found so before any byte of a response, is sent once more on a new connection and the caller is told
  (`on_retry`); never once response bytes have come, nor when the connection was a new one.
"""

from __future__ import annotations

import base64
import contextvars
import os
import weakref
from dataclasses import dataclass
from typing import Callable
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp

from evolforge.config.settings import Settings
from evolforge.tasks.core.gateway import InsecureKeyTransport, check_key_transport, is_loopback, read_api_key


class ProxyConfigError(ValueError):
    """The proxy cannot start as configured (e.g. a public bind address without an access token)."""


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


def check_bind(host: str, token: str | None) -> None:
    if not is_loopback(host) and not token:
        raise ProxyConfigError(
            f"refusing to bind the recording proxy to {host} without an access token: set the environment variable "
            "named by proxy.token_env (default EVOLFORGE_PROXY_TOKEN); clients then send it as "
            "X-Evolforge-Proxy-Token. Loopback (127.0.0.1) needs none.")


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


class UpstreamClient:
    """The HTTP client of the proxy's upstream calls: `open` on the server's event loop (the app's lifespan),
    `request` per call, `close` at shutdown."""

    def __init__(self, max_connections: int, read_timeout: float):
        self.max_connections, self.read_timeout = max_connections, read_timeout
        self.pooled: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # a new connection per call (and closed after): retries

    def _session(self, connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=self.read_timeout),
            auto_decompress=False, skip_auto_headers=("User-Agent",))

    async def open(self) -> None:
        n = self.max_connections
        self.pooled = self._session(_PoolConnector(limit=n, limit_per_host=n))

    async def close(self) -> None:
        for client in (self.pooled, self._fresh):
            if client is not None:
                await client.close()

    async def request(self, method: str, url, data: bytes | None, headers: dict[str, str],
                      on_retry: Callable[[str], None]) -> aiohttp.ClientResponse:
        """The upstream's response to one call, its head read. A pooled connection found closed before any
        response byte (`_closed_before_reply`) gets the call sent once more, on a new connection, after
        `on_retry(the first attempt's error)`; any other failure, and the second attempt's, is raised."""
        _REUSED.set(False)
        try:
            return await self.pooled.request(method, url, data=data, headers=headers)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            if not _closed_before_reply(e):
                raise
            on_retry(type(e).__name__)
        if self._fresh is None:
            n = self.max_connections
            self._fresh = self._session(aiohttp.TCPConnector(limit=n, limit_per_host=n, force_close=True))
        return await self._fresh.request(method, url, data=data, headers=headers)
