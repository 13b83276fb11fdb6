"""The recording proxy: an OpenAI-compatible server between an agent and its model endpoint."""

from __future__ import annotations

from pydantic import Field

from evolforge.config.sections._base import HostNames, Section, WebOrigins


class ProxySettings(Section):
    """`evolforge proxy`: forwards every call unchanged to `upstream`, records it, groups calls into sessions."""

    upstream: str = Field("", description="The model endpoint calls are forwarded to, e.g. http://gpu-box:8000/v1 "
                          "(an OpenAI-compatible base URL ending in /v1). Empty: the embedded model.")
    host: str = Field("127.0.0.1", description="Address to bind. Loopback by default; any other address needs an "
                      "access token (token_env) that clients must send.")
    port: int = Field(8787, ge=0, le=65535, description="Port to listen on (0: any free port).")
    token_env: str = Field("EVOLFORGE_PROXY_TOKEN", description="Environment variable holding the access token clients "
                           "send as `X-Evolforge-Proxy-Token` (or as their bearer key when the upstream key comes from "
                           "the environment). Required when host is not loopback; optional on loopback.")
    pass_client_key: bool = Field(True, description="Without EVOLFORGE_API_KEY / OPENAI_API_KEY set, forward the "
                                  "client's own Authorization header to the upstream (never recorded).")
    allowed_hosts: HostNames = Field(default_factory=list, description="Host names clients may reach the proxy by, "
                                     "besides loopback names and addresses and the address it is bound to (a request "
                                     "with another Host is refused: that is how a web page reaches a loopback server "
                                     "through DNS rebinding). Needed for a name on a non-loopback bind, e.g. "
                                     "[\"gpu-box\"]; [\"*\"] accepts any.")
    allowed_origins: WebOrigins = Field(default_factory=list, description="Web origins (scheme://host[:port]) whose "
                                       "pages may call the proxy from a browser. Browser-originated requests (an Origin "
                                       "header, or Sec-Fetch-Site cross-site / same-site) are refused unless their "
                                       "origin is listed; listed ones get CORS answers. Empty (default): no web page "
                                       "may call it; [\"*\"]: any page may (and spend the upstream key).")
    max_body_bytes: int = Field(8_000_000, ge=1024, description="Largest request body accepted (413 above).")
    max_event_bytes: int = Field(1_000_000, ge=1024, description="Largest body of a session event (POST "
                                 "/s/{session}/reward or /finish) accepted (413 above).")
    timeout_seconds: float = Field(600.0, gt=0, description="Upstream timeout per call (connect + read between chunks).")
    max_connections: int = Field(512, ge=1, description="Connections the proxy keeps to the upstream.")
    session_idle_seconds: float = Field(300.0, gt=0, description="A session with no call for this long counts as "
                                        "finished at export time (or when the agent POSTs /s/{session}/finish).")
    flush_seconds: float = Field(1.0, ge=0, description="Records on an object store are flushed within this window "
                                 "(local folders: every record at once).")

