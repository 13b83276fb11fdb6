"""The recording proxy: an OpenAI-compatible server between an agent and its model endpoint."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evolforge.config.sections._base import HostNames, Section, WebOrigins


class ProxySettings(Section):
    """`evolforge proxy`: forwards every call unchanged to `upstream`, records it, groups calls into sessions
    (or, with `translate`, maps Messages / Responses API calls to chat completions for a chat-only upstream)."""

    upstream: str = Field("", description="The model endpoint calls are forwarded to, e.g. http://gpu-box:8000/v1 "
                          "(an OpenAI-compatible base URL ending in /v1). Empty: the embedded model.")
    host: str = Field("127.0.0.1", description="Address to bind. Loopback by default; any other address needs an "
                      "access token (token_env) that clients must send.")
    port: int = Field(8787, ge=0, le=65535, description="Port to listen on (0: any free port).")
    token_env: str = Field("EVOLFORGE_PROXY_TOKEN", description="Environment variable holding the access token clients "
                           "send as `X-Evolforge-Proxy-Token` (or as their bearer key when the upstream key comes from "
                           "the environment). Required when host is not loopback; optional on loopback.")
    pass_client_key: bool = Field(True, description="For a call of an API with no operator key configured (see "
                                  "openai_key_env, anthropic_key_env), forward the client's own credential headers "
                                  "(Authorization, x-api-key, api-key) to the upstream (never recorded). false: "
                                  "every client credential header is stripped.")
    openai_key_env: str = Field("", description="Environment variable holding the operator's key for the OpenAI-style "
                                "APIs (chat completions, completions, Responses, everything else under /v1, and "
                                "Messages calls translated to chat); sent only as `Authorization: Bearer`, never on a "
                                "Messages call. Empty (default): EVOLFORGE_API_KEY, else OPENAI_API_KEY (the "
                                "gateway's). When set, the client's own credential headers are stripped from those "
                                "calls.")
    anthropic_key_env: str = Field("ANTHROPIC_API_KEY", description="Environment variable holding the operator's key "
                                   "for Anthropic's Messages API (/v1/messages and /v1/messages/*, forwarded as "
                                   "Messages); sent only as `x-api-key`, never on another API's call. When set, the "
                                   "client's own credential headers are stripped from those calls. Empty: none.")
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
    max_connections: int = Field(512, ge=1, description="Connections the proxy keeps to the upstream (per worker).")
    workers: int = Field(1, ge=1, le=64, description="Processes serving the port, each with its own event loop, "
                         "records file and ledger file (one record and one ledger row per call, whichever worker "
                         "took it). Sessions stay one tree across workers: each session's parent is kept in "
                         "PROXY_OUT/sessions.sqlite, which the first worker to see a session writes and the others "
                         "read. 1 (default) is enough below a few thousand calls/s; 2 lets a saturated proxy use a "
                         "second core. More than 1 needs a local output folder and cannot be combined with "
                         "translate = \"responses\" or \"both\" (previous_response_id chains are kept in one "
                         "process's memory). /healthz counts the calls of the worker that answers it.")
    session_idle_seconds: float = Field(300.0, gt=0, description="A session with no call for this long counts as "
                                        "finished at export time (or when the agent POSTs /s/{session}/finish).")
    refused_records_per_second: float = Field(20.0, ge=0, description="Calls the proxy refuses (door, token, "
                                              "session, body checks: never forwarded) are recorded at most at this "
                                              "rate per worker, with a burst of refused_records_burst; past it they "
                                              "are only counted (the next refused record, or one at shutdown, carries "
                                              "`unrecorded_refusals`), with no record and no ledger row, so a flood "
                                              "of refused calls cannot fill the disk. A refused record keeps at most "
                                              "256 characters of the path and of the error.")
    refused_records_burst: int = Field(200, ge=0, description="Refused calls recorded in a burst before "
                                       "refused_records_per_second applies.")
    flush_seconds: float = Field(1.0, ge=0, description="Records on an object store are flushed within this window "
                                 "(local folders: every record at once).")
    translate: Literal["off", "messages", "responses", "both"] = Field(
        "off", description="For an upstream that speaks only chat completions (vLLM's or SGLang's OpenAI server, "
        "llama-cpp-python, most hosted OpenAI-compatible APIs): which APIs the proxy translates to chat completions "
        "and back, requests, replies and streams alike (tasks/proxy/translate.py). \"off\" (default): every API "
        "passes through to the upstream as sent. \"messages\": Anthropic Messages API calls (POST /v1/messages: "
        "Claude Code, the anthropic SDK) go upstream as POST /v1/chat/completions; \"responses\": OpenAI Responses "
        "API calls (POST /v1/responses: Codex, the OpenAI Agents SDK) do; \"both\": both. The record keeps what the "
        "client sent and received (request, response) and the chat call actually made upstream under `translation`. "
        "messages/count_tokens and models still pass through.")
    translate_model: str = Field("", description="With `translate`: the model name sent upstream in place of the "
                                 "client's (e.g. Claude Code asks for claude-* names a vLLM server does not serve). "
                                 "Empty (default): the client's model name as sent. The ledger prices the model "
                                 "the upstream reports.")
    embedded_max_tokens: int = Field(1024, ge=0, description="When the upstream is the embedded model (no "
                                     "`upstream`): the most output tokens one call may ask of it. A chat or text "
                                     "completion, Messages or Responses call that sets no limit (max_tokens, "
                                     "max_completion_tokens, max_output_tokens) or a larger one is sent upstream with "
                                     "this one (Codex sets none, Claude Code asks 32000: on a CPU that is minutes per "
                                     "call); the record keeps what the client sent and names the cap under "
                                     "`output_cap`. 0: no cap. Other upstreams get every call as sent.")
    translate_history: int = Field(256, ge=0, le=100_000, description="With `translate` of the Responses API: how "
                                   "many translated responses the proxy keeps in memory (the most recent; never on "
                                   "disk) so that a later call's previous_response_id is expanded into the "
                                   "conversation it continues (a chat upstream keeps no state). A call naming a "
                                   "response no longer kept gets a 400 previous_response_not_found; 0 keeps none. "
                                   "Responses created with store=false are not kept.")
