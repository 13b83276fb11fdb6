"""What `evolforge proxy` prints when it starts: where it records, and how each client reaches it.

Each client takes the proxy's address its own way (tests/tasks/proxy/test_proxy_setup.py uses the printed forms
with the real SDKs; tests/tasks/proxy/test_proxy_agent_clis.py runs the CLIs):
- OpenAI-style clients (Codex CLI: Responses API; the openai SDK) take a base URL ending in /v1, so the session
  rides in the path: http://HOST:PORT/s/SESSION/v1.
- Anthropic-style clients (Claude Code; the anthropic SDK) add /v1/messages to their base URL themselves: theirs
  is the proxy's root, http://HOST:PORT, and the session goes in the `X-Evolforge-Session` header
  (ANTHROPIC_CUSTOM_HEADERS for Claude Code: "Name: value" lines). A base URL ending in /v1 (or /s/SESSION/v1)
  makes Claude Code call .../v1/v1/messages, which it reports as a model that "may not exist".
- With an access token (proxy.token_env set in the environment), clients send it in `X-Evolforge-Proxy-Token`;
  the banner names the environment variable, never the token.
"""

from __future__ import annotations

from evolforge.config.settings import Settings

SESSION_HEADER = "X-Evolforge-Session"
TOKEN_HEADER = "X-Evolforge-Proxy-Token"
ANY_ADDRESS = {"", "0.0.0.0", "::", "[::]"}


def root_url(host: str, port: int) -> str:
    """The proxy's address as a client on this machine writes it (a bind to every address: loopback)."""
    host = "127.0.0.1" if host in ANY_ADDRESS else host
    return f"http://[{host}]:{port}" if ":" in host and not host.startswith("[") else f"http://{host}:{port}"


def banner(settings: Settings, upstream_shown: str, out: str, token_set: bool, embedded: bool) -> str:
    """The start banner: the proxy's address, the upstream (credentials masked), the records folder, and for each
    client the base URL, session and token settings as it takes them. `token_set`: an access token is configured
    (its variable is named, its value never printed); `embedded`: the upstream is the embedded model."""
    cfg = settings.proxy
    root = root_url(cfg.host, cfg.port)
    openai_url = f"{root}/s/SESSION/v1"
    env = cfg.token_env
    model = settings.embedded.alias if embedded else "<a model the upstream serves>"
    lines = [
        f"recording proxy on {root} -> {upstream_shown}; records in {out}",
        "  SESSION below: a name for one agent run (letters, digits, . _ : -); calls naming none are recorded under "
        "\"default\".",
        "  Codex CLI (Responses API), in $CODEX_HOME/config.toml:",
        f'      model = "{model}"',
        '      model_provider = "evolforge"',
        "      [model_providers.evolforge]",
        '      name = "evolforge recording proxy"',
        f'      base_url = "{openai_url}"',
        '      wire_api = "responses"',
    ]
    if token_set:
        lines.append(f'      env_http_headers = {{ "{TOKEN_HEADER}" = "{env}" }}')
    headers = f"{SESSION_HEADER}: SESSION"
    custom = f'"{headers}"$\'\\n\'"{TOKEN_HEADER}: ${env}"' if token_set else f'"{headers}"'
    lines += [
        "  Claude Code (Messages API): the proxy root, no /v1 (Claude Code adds /v1/messages; /s/SESSION/v1 breaks "
        "it); the session in a header:",
        f"      export ANTHROPIC_BASE_URL={root}",
        f"      export ANTHROPIC_CUSTOM_HEADERS={custom}",
        "      export ANTHROPIC_API_KEY=...   # the upstream's key; any text when the proxy holds one or for the "
        "embedded model",
    ]
    token_kw = f'"{TOKEN_HEADER}": os.environ["{env}"]'
    lines += [
        f'  openai SDK:    OpenAI(base_url="{openai_url}"'
        + (f", default_headers={{{token_kw}}})" if token_set else ")"),
        f'  anthropic SDK: Anthropic(base_url="{root}", default_headers={{"{SESSION_HEADER}": "SESSION"'
        + (f", {token_kw}}})" if token_set else "})"),
    ]
    if token_set:
        lines.append(f"  access token: clients send ${env} as {TOKEN_HEADER} (a call without it gets 401).")
    if embedded:
        e = settings.embedded
        cap = cfg.embedded_max_tokens
        lines.append(f"  embedded model {e.alias}: a context of {e.n_ctx} tokens per slot (embedded.n_ctx; an agent "
                     "CLI's first call needs 8192), output "
                     + (f"capped at {cap} tokens per call (proxy.embedded_max_tokens)" if cap else "not capped")
                     + "; free (cost 0 in the ledger).")
        if e.stall_seconds:
            lines.append(f"  its stall watchdog kills it after {e.stall_seconds:g} s without a token "
                         "(embedded.stall_seconds): reading an agent CLI's first prompt on a CPU can take longer; "
                         "EVOLFORGE__EMBEDDED__STALL_SECONDS=0 turns it off.")
    return "\n".join(lines)
