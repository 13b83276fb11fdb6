"""What a local HTTP service of this project answers: the door checks that keep web pages out.

A server on loopback without a token is reachable from any web page the operator's browser opens: the page can
POST to it (a cross-origin "simple" request: text/plain, form-encoded or multipart, no preflight), and through
DNS rebinding (a name of the attacker's that resolves to 127.0.0.1) it can even read the answers. Three checks
close that, for every request, before anything else is done with it:

- `Host` must name this machine as the client reached it: a loopback name or address, the address the connection
  came in on, the configured bind address, or a name in `allowed_hosts` ("*": any). A rebinding page sends its
  own name. The port is not compared: an ssh tunnel or a port forward legitimately changes it, and a page on
  another port of this machine is cross-origin, which the next check refuses.
- A browser-originated request is refused: an `Origin` header, or `Sec-Fetch-Site` saying cross-site or
  same-site, unless the origin is in `allowed_origins` ("*": any). Agents, SDKs and verl send neither.
- A body must be JSON (`application/json` or `application/*+json`): the content types a page can send
  without a CORS preflight (text/plain, form, multipart) never are.

`door_refusal` returns (HTTP status, message, kind) for a refused request, else None; `json_body_refusal` does the
same for a body's content type. Pure functions over lower-cased header values (no framework).
"""

from __future__ import annotations

from typing import Iterable

from evolforge.tasks.core.keys import is_loopback

BROWSER_SITES = ("cross-site", "same-site")
COMMON_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})  # the names nearly every call uses: no parsing


def host_name(host_header: str) -> str:
    """The name of a Host header, without its port and IPv6 brackets, lower-cased."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h[1:]
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def host_allowed(host_header: str | None, local: Iterable[str], allowed_hosts: Iterable[str]) -> bool:
    if not host_header:  # HTTP/1.0 without Host: no browser sends that
        return True
    name = host_name(host_header)
    if name in COMMON_LOOPBACK or name in allowed_hosts or "*" in allowed_hosts:
        return True
    return name in {str(a).strip("[]").lower() for a in local if a} or is_loopback(name)


def origin_allowed(origin: str | None, fetch_site: str | None, allowed_origins: Iterable[str]) -> bool:
    if origin is not None:
        return "*" in allowed_origins or origin.strip().lower() in allowed_origins
    return fetch_site is None or fetch_site.strip().lower() not in BROWSER_SITES or "*" in allowed_origins


def door_refusal(headers: dict[str, str], local: Iterable[str], allowed_hosts: Iterable[str],
                 allowed_origins: Iterable[str], setting: str) -> tuple[int, str, str] | None:
    """(status, message, kind) when the request must be refused before anything else, else None. `headers`:
    lower-cased names; `local`: the addresses this server is reached at; `allowed_hosts` / `allowed_origins`:
    lower-cased, as the config sections normalise them; `setting`: where they live in the config (named in the
    messages)."""
    host = headers.get("host")
    if not host_allowed(host, local, allowed_hosts):
        return (403, f"Host {host_name(host)[:100]!r} is not this server (a web page or DNS rebinding sends its own name); "
                f"add it to {setting}.allowed_hosts if clients reach this server by that name", "forbidden_host")
    origin = headers.get("origin")
    if not origin_allowed(origin, headers.get("sec-fetch-site"), allowed_origins):
        who = f"origin {origin.strip()[:100]!r}" if origin is not None else "a cross-site page"
        return (403, f"browser requests are refused ({who}): add the page's origin to {setting}.allowed_origins to "
                "let it in", "forbidden_origin")
    return None


def is_json_content_type(value: str | None) -> bool:
    media = (value or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def json_body_refusal(content_type: str | None, has_body: bool) -> tuple[int, str, str] | None:
    """A 415 when the request has a body (or says it has one) that is not declared JSON."""
    if (has_body or content_type) and not is_json_content_type(content_type):
        return (415, f"the body must be JSON (Content-Type: application/json), not {content_type or 'undeclared'!r}",
                "unsupported_media_type")
    return None


def cors_settings(allowed_origins: list[str]) -> dict:
    """Keyword arguments of Starlette's CORSMiddleware for the configured origins (preflights answered, the
    answer readable by the page); only installed when some origin is allowed."""
    return {"allow_origins": list(allowed_origins), "allow_methods": ["GET", "POST", "OPTIONS"],
            "allow_headers": ["*"], "max_age": 600}
