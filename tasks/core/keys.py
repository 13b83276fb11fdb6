"""The API key: where it comes from, where it may go, how it is shown (light imports: the fail-fast checks
use it before anything heavy is loaded; tasks/core/gateway.py re-exports it).

The key comes from EVOLFORGE_API_KEY, else OPENAI_API_KEY (never from a file, never logged: `mask_secret` is
the only way it is ever shown); it goes over plain http only to a loopback host unless
`gateway.allow_key_over_http` says otherwise (`check_key_transport`).
"""

from __future__ import annotations

import hmac
import os
from urllib.parse import urlsplit

API_KEY_ENV = ("EVOLFORGE_API_KEY", "OPENAI_API_KEY")
NO_KEY = "sk-no-key-required"
# Environment variables that hold the secrets evolforge itself is configured with: the API keys, the Hugging Face
# token (`evolforge publish`) and the access tokens of the proxy and the sandbox service (their defaults; the
# configured names come from `secret_env_names`).
SECRET_ENV = (*API_KEY_ENV, "HF_TOKEN", "EVOLFORGE_PROXY_TOKEN", "EVOLFORGE_SANDBOX_TOKEN")


def secret_env_names(settings) -> tuple[str, ...]:
    """The names of the environment variables holding configured secrets (SECRET_ENV plus the token_env of the
    proxy and of the sandbox service as `settings` name them)."""
    names = [*SECRET_ENV, settings.proxy.token_env, settings.sandbox.service.token_env]
    return tuple(dict.fromkeys(n for n in names if n))


def configured_secrets(names: tuple[str, ...] = SECRET_ENV, environ: dict | None = None) -> dict[str, str]:
    """{variable: value} of the set, non-trivial ones among `names` (at least 8 characters and not NO_KEY: a
    placeholder such as `none` is no secret)."""
    environ = os.environ if environ is None else environ
    return {n: environ[n] for n in names if len(environ.get(n) or "") >= 8 and environ[n] != NO_KEY}


def read_api_key(environ: dict | None = None) -> str | None:
    environ = os.environ if environ is None else environ
    for name in API_KEY_ENV:
        if environ.get(name):
            return environ[name]
    return None


LOOPBACK_HOSTS = {"localhost", "ip6-localhost", "ip6-loopback"}


class InsecureKeyTransport(ValueError):
    """An API key would travel over plain http to a host that is not this machine."""


def is_loopback(host: str) -> bool:
    import ipaddress

    host = (host or "").strip("[]").lower()
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_key_transport(base_url: str, api_key: str | None, allow_http: bool) -> None:
    """Refuse to send a key over plain http to a non-loopback host unless explicitly allowed."""
    if not api_key or api_key == NO_KEY or allow_http:
        return
    url = urlsplit(base_url)
    if url.scheme == "http" and not is_loopback(url.hostname or ""):
        raise InsecureKeyTransport(
            f"refusing to send the API key over plain http to {url.hostname} ({base_url}): use https, or set "
            "gateway.allow_key_over_http = true (EVOLFORGE__GATEWAY__ALLOW_KEY_OVER_HTTP=true) for a trusted "
            "private network, or unset EVOLFORGE_API_KEY / OPENAI_API_KEY if the endpoint needs no key")


def mask_secret(secret: str | None) -> str:
    if not secret:
        return "(none)"
    if len(secret) <= 8:
        return "****"
    return f"{secret[:3]}...{secret[-2:]} ({len(secret)} chars)"


def token_accepted(expected: str | None, given: str | None, authorization: str = "") -> bool:
    """An access token check for the project's servers (proxy, sandbox service): no token configured accepts
    everything; else `given` (its own header or path part) or the bearer of `authorization`, compared in
    constant time."""
    if not expected:
        return True
    if given is None:
        given = authorization[7:] if authorization.lower().startswith("bearer ") else None
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())
