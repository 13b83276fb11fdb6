"""The recording proxy under hostile traffic: N calls in, N records and N ledger rows out, no unhandled exception.

    flock /tmp/evolforge-bench.lock .venv/bin/python bench/bench_proxy_fuzz.py [--requests 3000] [--clients 16] [--seed 0]

The upstream is testing/hostile_upstream.py in its own process (every reply shape of its REPLIES and STREAMS:
`choices` as a dict, `message` as a string, `usage` as a list, stream deltas that are lists, tool-call indexes that
are not ints, junk, lone surrogates, JSON nested 50,000 deep, streams cut mid-event, ...). The proxy is `evolforge
proxy` in its own process, its stderr kept as its log (max_body_bytes lowered to 64 KiB so oversized bodies are
cheap). This process sends N calls from `--clients` concurrent httpx clients, each drawn by a seeded RNG from:
well-formed chat calls, models that are lists / dicts / ints / null / huge / lone surrogates, bodies that are not
JSON, nested past any parser's depth, not objects, over the size cap or not UTF-8, foreign Host and Origin headers,
text/plain and form bodies, bad session names (trailing newline, empty, too long), parent-session conflicts, dot
segments, other methods and routes, and clients that leave mid-stream; each picks an upstream reply shape.

Every call carries its number as `X-Evolforge-Role: fuzz-<i>` (the proxy records the role of every call, refused ones
too), so each call is matched to its record. Checked: every call got a well-formed answer (JSON, the upstream's own
bytes, or an SSE stream that ends cleanly; never uvicorn's bare 500 or a dropped connection unless the client itself
left), exactly one record per call with the status the client saw, as many ledger rows as calls, and no traceback in
the proxy's log. Writes bench/results/proxy_fuzz.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from evolforge.storage.ledger import read_ledger
from evolforge.storage.proxy_sets import ProxyLayout, iter_records
from evolforge.testing.hostile_upstream import REPLIES, STREAMS
from evolforge.testing.net import free_port, wait_up

ROOT = Path(__file__).resolve().parents[1]
MAX_BODY = 65536
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
SHAPES = [None] * 8 + sorted(REPLIES) + sorted(STREAMS)


def _j(obj) -> bytes:
    return json.dumps(obj).encode()  # ASCII escapes: a lone surrogate travels as \ud800


BODIES = {  # name -> (request body, its content type)
    "chat": (_j(CHAT), "application/json"),
    "chat_stream": (_j({**CHAT, "stream": True, "stream_options": {"include_usage": True}}), "application/json"),
    "model_list": (_j({**CHAT, "model": ["a", "b"]}), "application/json"),
    "model_dict": (_j({**CHAT, "model": {"$ne": 1}}), "application/json"),
    "model_int": (_j({**CHAT, "model": 7}), "application/json"),
    "model_null": (_j({**CHAT, "model": None}), "application/json"),
    "model_bool": (_j({**CHAT, "model": True}), "application/json"),
    "model_huge": (_j({**CHAT, "model": "m" * 20_000}), "application/json"),
    "model_surrogate": (_j({**CHAT, "model": "\ud800"}), "application/json"),
    "content_surrogate": (_j({"model": "m", "messages": [{"role": "user", "content": "\udfff"}]}), "application/json"),
    "messages_dict": (_j({"model": "m", "messages": {"role": "user"}, "stream": True}), "application/json"),
    "stream_yes": (_j({**CHAT, "stream": "yes"}), "application/json"),
    "tools_str": (_j({**CHAT, "tools": "all", "tool_choice": 5}), "application/json"),
    "not_json": (b"{not json", "application/json"),
    "deep": (b'{"model": "m", "messages": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", "application/json"),
    "big_int": (b'{"model": "m", "messages": [], "n": ' + b"9" * 400 + b"}", "application/json"),
    "nan": (b'{"model": "m", "messages": [], "temperature": NaN}', "application/json"),
    "list": (b"[1, 2, 3]", "application/json"),
    "string": (b'"hello"', "application/json"),
    "empty": (b"", "application/json"),
    "not_utf8": (b"\xff\xfe\x00{", "application/json"),
    "oversize": (_j({**CHAT, "pad": "x" * (MAX_BODY + 100)}), "application/json"),
    "text_plain": (_j(CHAT), "text/plain"),
    "form": (b"model=m&messages=hi", "application/x-www-form-urlencoded"),
    "multipart": (b"--x\r\n\r\nhi\r\n--x--\r\n", "multipart/form-data; boundary=x"),
    "no_type": (_j(CHAT), None),
    "json_charset": (_j(CHAT), "application/json; charset=utf-8"),
    "json_suffix": (_j(CHAT), "application/vnd.api+json"),
}
SESSIONS = ["s1", "s2", "agent-3"] * 8 + ["abc%0A", "", "-x", "x" * 200, "a%20b", "sess%C3%A9", "%2E%2E"]
PATHS = ["chat/completions"] * 12 + ["completions", "models", "embeddings", "responses", "%2E%2E/admin", "./chat/../x",
                                     "chat/completions?x=%00&y=\u00e9"]


def draw(rng: random.Random, i: int) -> dict:
    """One hostile call: method, path, headers, body, and whether the client leaves mid-stream."""
    name = rng.choice(["chat", "chat_stream"]) if rng.random() < 0.35 else rng.choice(sorted(BODIES))
    body, ctype = BODIES[name]
    session = rng.choice(SESSIONS)
    path = rng.choice(PATHS)
    prefix = "" if rng.random() < 0.2 else f"/s/{session}"
    headers = {"X-Evolforge-Role": f"fuzz-{i}"}
    if ctype:
        headers["Content-Type"] = ctype
    shape = rng.choice(SHAPES)
    if shape:
        headers["X-Hostile-Reply"] = shape
    roll = rng.random()
    if roll < 0.04:
        headers["Host"] = "rebind.attacker.example"
    elif roll < 0.08:
        headers["Origin"] = rng.choice(["http://rebind.attacker.example", "null"])
    elif roll < 0.10:
        headers["Sec-Fetch-Site"] = "cross-site"
    if rng.random() < 0.1:
        headers["X-Evolforge-Parent-Session"] = rng.choice(["s1", "s2", "agent-3", "bad name", session or "s1"])
    if rng.random() < 0.1:
        headers["X-Evolforge-Session"] = rng.choice(["h1", "bad\tname", ""])
    if rng.random() < 0.2:
        headers["Authorization"] = "Bearer sk-fuzz-client"
    method = "POST" if rng.random() < 0.9 else rng.choice(["GET", "PUT", "DELETE", "PATCH"])
    return {"i": i, "method": method, "url": f"{prefix}/v1/{path}", "headers": headers,
            "body": body if method not in ("GET",) else b"", "leave": rng.random() < 0.05}


UPSTREAM_BODIES = {body for _, _, body in REPLIES.values()}


def well_formed(status: int, ctype: str, data: bytes) -> bool:
    """An answer a client can act on: JSON, SSE, or the upstream's own bytes passed through."""
    if ctype.startswith("text/event-stream"):
        return True
    if data in UPSTREAM_BODIES:
        return True
    try:
        parsed = json.loads(data)
    except ValueError:
        return False
    if status >= 400:
        return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) and "type" in parsed["error"]
    return True


async def send_all(base: str, calls: list[dict], clients: int) -> list[dict]:
    out: list[dict] = []
    queue = iter(calls)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as c:
        async def worker():
            for call in queue:
                res = {"i": call["i"], "status": None, "well_formed": False, "left": False, "transport_error": None}
                t0 = time.perf_counter()
                try:
                    req = c.build_request(call["method"], call["url"], headers=call["headers"],
                                          content=call["body"] or None)
                    r = await c.send(req, stream=True)
                    try:
                        res["status"] = r.status_code
                        ctype = r.headers.get("content-type", "")
                        if call["leave"] and ctype.startswith("text/event-stream"):
                            async for _ in r.aiter_raw():
                                break  # the client leaves after the first chunk
                            res["left"] = res["well_formed"] = True
                        else:
                            data = await r.aread()
                            res["well_formed"] = well_formed(r.status_code, ctype, data)
                            res["kind"] = _kind(data) if r.status_code >= 400 else None
                    finally:
                        await r.aclose()
                except httpx.HTTPError as e:
                    res["transport_error"] = f"{type(e).__name__}: {e}"[:200]
                res["latency_s"] = time.perf_counter() - t0
                out.append(res)
        await asyncio.gather(*(worker() for _ in range(clients)))
    return out


def _kind(data: bytes) -> str | None:
    try:
        return json.loads(data)["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    rng = random.Random(a.seed)
    calls = [draw(rng, i) for i in range(a.requests)]
    up_port, px_port = free_port(), free_port()
    work = Path(tempfile.mkdtemp(prefix="evolforge-bench-proxy-fuzz-"))
    (work / "config.toml").write_text(f"[proxy]\nmax_body_bytes = {MAX_BODY}\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "EVOLFORGE_API_KEY", "EVOLFORGE_PROXY_TOKEN")}
    env["PYTHONUNBUFFERED"] = "1"
    log_path = work / "proxy.log"
    upstream = subprocess.Popen([sys.executable, "-m", "evolforge.testing.hostile_upstream", "--port", str(up_port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(log_path, "wb") as log:
        proxy = subprocess.Popen([sys.executable, "-m", "evolforge.cli", "proxy", "--upstream",
                                  f"http://127.0.0.1:{up_port}/v1", "--port", str(px_port), "--out", str(work / "rec"),
                                  "--config", str(work / "config.toml")], env=env, stdout=log, stderr=log)
        base = f"http://127.0.0.1:{px_port}"
        load_before = Path("/proc/loadavg").read_text().strip()
        try:
            wait_up(f"{base}/healthz")
            t0 = time.perf_counter()
            results = asyncio.run(send_all(base, calls, a.clients))
            wall = time.perf_counter() - t0
        finally:
            load_after = Path("/proc/loadavg").read_text().strip()
            proxy.send_signal(signal.SIGINT)  # uvicorn's graceful stop: records and ledger rows are flushed
            proxy.wait(timeout=60)
            upstream.terminate()
            upstream.wait(timeout=30)

    layout = ProxyLayout(work / "rec")
    records = list(iter_records(layout))
    ledger_lines = sum(len(f.read_bytes().splitlines()) for f in (work / "rec" / "ledger").glob("*.jsonl"))
    try:
        outcomes = collections.Counter(read_ledger(work / "rec")["outcome"].to_list())
        ledger_error = None
    except Exception as e:  # noqa: BLE001 - what the proxy wrote may not even read back as a ledger
        outcomes, ledger_error = collections.Counter(), f"{type(e).__name__}: {str(e)[:160]}"
    roles = collections.Counter(r.get("role") for r in records)
    by_i = {r["i"]: r for r in results}
    status_of = {int(r["role"].split("-")[1]): r["status"] for r in records if (r.get("role") or "").startswith("fuzz-")}
    mismatched = [i for i, res in by_i.items()
                  if not res["left"] and res["status"] is not None and status_of.get(i) != res["status"]]
    log_text = log_path.read_text(errors="replace")
    tracebacks = log_text.count("Traceback")
    asgi_errors = log_text.count("Exception in ASGI application")
    result = {
        "requests": a.requests, "clients": a.clients, "seed": a.seed, "wall_s": round(wall, 2),
        "calls_per_s": round(a.requests / wall, 1),
        "records": len(records), "ledger_rows": ledger_lines, "ledger_unreadable": ledger_error,
        "calls_with_exactly_one_record": sum(1 for i in range(a.requests) if roles.get(f"fuzz-{i}") == 1),
        "record_status_differs_from_answer": len(mismatched),
        "answers_not_well_formed": sum(1 for r in results if not r["well_formed"] and not r["transport_error"]),
        "transport_errors": sum(1 for r in results if r["transport_error"]),
        "clients_left_mid_stream": sum(1 for r in results if r["left"]),
        "proxy_errors_500": sum(1 for r in results if r.get("kind") == "proxy_error"),
        "tracebacks_in_proxy_log": tracebacks, "asgi_exceptions_in_proxy_log": asgi_errors,
        "proxy_log_lines": len(log_text.splitlines()),
        "answers_by_status": dict(sorted(collections.Counter(str(r["status"]) for r in results).items())),
        "proxy_refusals_by_kind": dict(sorted(collections.Counter(r.get("kind") for r in results
                                                                  if r.get("kind")).items())),
        "ledger_outcomes": dict(sorted(outcomes.items())),
        "failed_records": sum(1 for r in records if r["error"] or r["status"] != 200),
        "latency_p50_ms": round(1000 * sorted(r["latency_s"] for r in results)[len(results) // 2], 2),
        "loadavg_before": load_before, "loadavg_after": load_after, "work_dir": str(work),
    }
    examples = [r["transport_error"] for r in results if r["transport_error"]][:5]
    if examples:
        result["transport_error_examples"] = examples
    print(json.dumps(result, indent=2))
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "proxy_fuzz.json").write_text(json.dumps(result, indent=2))
    ok = (len(records) == ledger_lines == a.requests and ledger_error is None and result["calls_with_exactly_one_record"] == a.requests
          and not mismatched and not result["answers_not_well_formed"] and not result["transport_errors"]
          and not tracebacks and not result["proxy_errors_500"])
    if not ok:
        print(f"FAILED: see {log_path}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
