"""The recording proxy's added latency, side by side with calling the upstream directly, in one run.

    .venv/bin/python bench/bench_proxy.py [--clients 32] [--calls 4000] [--stream-calls 400] [--repeat 3] [--rate 500]

The upstream is testing/instant_server.py (asyncio, answers at once; streams 8 chunks 10 ms apart), the proxy
is `evolforge proxy` in its own process, the load generator is this process: `--clients` concurrent
asyncio clients (aiohttp, keep-alive) sending chat completions. Direct and proxied rounds alternate
(`--repeat` times each), so both see the same machine. Reported per round: calls/s and the latency
percentiles of every call, at saturation (closed loop) and paced at --rate calls/s (32 clients in flight,
below saturation: the proxy's own added latency); the CPU milliseconds per call of the upstream, the proxy
and the clients; for streams the time to the first chunk and to the last, and the gap between
the first and the last chunk (no buffering: about 7 x 10 ms through the proxy as directly).
Writes bench/results/proxy.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from evolforge.testing.net import free_port

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "scripted", "messages": [{"role": "user", "content": "Explain step by step how to add 2 and 3."}]}


def wait_up(url: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(fn, pids: dict[str, int]) -> dict:
    """Run one load round; add the CPU milliseconds per call each process spent (this process: the clients)."""
    before = {k: cpu_s(p) for k, p in pids.items()}
    t0 = time.process_time()
    out = fn()
    out["cpu_ms_per_call"] = {k: round(1000 * (cpu_s(p) - before[k]) / out["calls"], 4) for k, p in pids.items()}
    out["cpu_ms_per_call"]["clients"] = round(1000 * (time.process_time() - t0) / out["calls"], 4)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def path_for(proxied: bool, w: int) -> str:
    return f"/s/bench-{w}/v1/chat/completions" if proxied else "/v1/chat/completions"


async def load(base: str, clients: int, calls: int, proxied: bool, rate: float = 0.0) -> dict:
    """`clients` workers, each sending its next call when the last one is answered (aiohttp: the load generator
    shares the 2 cores with the upstream and the proxy, so it must be cheap). rate 0: closed loop, as fast as
    the answers come (saturation); rate R: call i is sent no earlier than i / R seconds after the start (below
    saturation, the latency is the call's own, not the queue's)."""
    import aiohttp

    lat: list[float] = []
    queue = iter(range(calls))
    connector = aiohttp.TCPConnector(limit=clients)
    start = time.perf_counter()
    async with aiohttp.ClientSession(base_url=base, connector=connector) as c:
        async def worker(w: int):
            path = path_for(proxied, w)
            for i in queue:
                if rate:
                    await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                t0 = time.perf_counter()
                async with c.post(path, json={**BODY, "user": f"u{i}"}) as r:
                    await r.read()
                    assert r.status == 200, await r.text()
                lat.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(clients)))
        wall = time.perf_counter() - t0
    return {"calls": calls, "calls_per_s": round(calls / wall, 1), "p50_ms": round(1000 * pct(lat, 0.5), 3),
            "p90_ms": round(1000 * pct(lat, 0.9), 3), "p99_ms": round(1000 * pct(lat, 0.99), 3)}


async def load_stream(base: str, clients: int, calls: int, proxied: bool) -> dict:
    first, last, spread = [], [], []
    queue = iter(range(calls))
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        async def worker(w: int):
            for i in queue:
                t0 = time.perf_counter()
                async with c.stream("POST", path_for(proxied, w), json={**BODY, "stream": True, "user": f"s{i}"}) as r:
                    t_first = None
                    async for chunk in r.aiter_raw():
                        if chunk and t_first is None:
                            t_first = time.perf_counter()
                    t_last = time.perf_counter()
                first.append(t_first - t0)
                last.append(t_last - t0)
                spread.append(t_last - t_first)
        await asyncio.gather(*(worker(w) for w in range(clients)))
    return {"calls": calls, "ttfc_p50_ms": round(1000 * pct(first, 0.5), 3), "ttfc_p99_ms": round(1000 * pct(first, 0.99), 3),
            "total_p50_ms": round(1000 * pct(last, 0.5), 3), "first_to_last_chunk_p50_ms": round(1000 * pct(spread, 0.5), 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--stream-calls", type=int, default=400)
    ap.add_argument("--stream-clients", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=500.0, help="calls/s of the paced rounds (below saturation)")
    a = ap.parse_args()

    up_port, px_port = free_port(), free_port()
    work = Path(tempfile.mkdtemp(prefix="evolforge-bench-proxy-"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("OPENAI_API_KEY", None)
    env.pop("EVOLFORGE_API_KEY", None)
    upstream = subprocess.Popen([sys.executable, str(ROOT / "testing" / "instant_server.py"), "--port", str(up_port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = subprocess.Popen([sys.executable, "-m", "evolforge.cli", "proxy", "--upstream",
                              f"http://127.0.0.1:{up_port}/v1", "--port", str(px_port), "--out", str(work / "rec")],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    direct, proxied = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{px_port}"
    rounds: list[dict] = []
    try:
        wait_up(f"{direct}/v1/models")
        wait_up(f"{proxied}/healthz")
        asyncio.run(load(direct, 4, 200, False))  # warm both paths
        asyncio.run(load(proxied, 4, 200, True))
        for i in range(a.repeat):
            pids = {"upstream": upstream.pid, "proxy": proxy.pid}
            d = measured(lambda: asyncio.run(load(direct, a.clients, a.calls, False)), pids)
            p = measured(lambda: asyncio.run(load(proxied, a.clients, a.calls, True)), pids)
            dp = asyncio.run(load(direct, a.clients, int(a.rate * 4), False, a.rate))
            pp = asyncio.run(load(proxied, a.clients, int(a.rate * 4), True, a.rate))
            ds = asyncio.run(load_stream(direct, a.stream_clients, a.stream_calls, False))
            ps = asyncio.run(load_stream(proxied, a.stream_clients, a.stream_calls, True))
            rounds.append({"direct": d, "proxy": p, "direct_paced": dp, "proxy_paced": pp, "direct_stream": ds, "proxy_stream": ps})
            print(f"round {i + 1}: direct {d['calls_per_s']}/s p50 {d['p50_ms']} p99 {d['p99_ms']} ms | proxy "
                  f"{p['calls_per_s']}/s p50 {p['p50_ms']} p99 {p['p99_ms']} ms | at {a.rate:g}/s p50 direct {dp['p50_ms']} proxy "
                  f"{pp['p50_ms']} p99 direct {dp['p99_ms']} proxy {pp['p99_ms']} ms | stream ttfc p50 direct "
                  f"{ds['ttfc_p50_ms']} proxy {ps['ttfc_p50_ms']} ms", flush=True)
    finally:
        proxy.terminate()
        upstream.terminate()
        proxy.wait(timeout=30)
    recorded = sum(1 for f in (work / "rec" / "records").glob("*.jsonl") for _ in open(f))

    def med(kind: str, key: str) -> float:
        return statistics.median(r[kind][key] for r in rounds)

    result = {
        "clients": a.clients, "calls_per_round": a.calls, "repeat": a.repeat, "rounds": rounds,
        "added_p50_ms": round(med("proxy", "p50_ms") - med("direct", "p50_ms"), 3),
        "added_p99_ms": round(med("proxy", "p99_ms") - med("direct", "p99_ms"), 3),
        "paced_rate": a.rate,
        "paced_added_p50_ms": round(med("proxy_paced", "p50_ms") - med("direct_paced", "p50_ms"), 3),
        "paced_added_p99_ms": round(med("proxy_paced", "p99_ms") - med("direct_paced", "p99_ms"), 3),
        "throughput_ratio": round(med("proxy", "calls_per_s") / med("direct", "calls_per_s"), 3),
        "cpu_ms_per_call": {kind: {k: statistics.median(r[kind]["cpu_ms_per_call"][k] for r in rounds)
                                   for k in ("upstream", "proxy", "clients")} for kind in ("direct", "proxy")},
        "stream_added_ttfc_p50_ms": round(med("proxy_stream", "ttfc_p50_ms") - med("direct_stream", "ttfc_p50_ms"), 3),
        "stream_first_to_last_p50_ms": {"direct": med("direct_stream", "first_to_last_chunk_p50_ms"),
                                        "proxy": med("proxy_stream", "first_to_last_chunk_p50_ms")},
        "records_written": recorded, "load_avg_end": os.getloadavg(),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "proxy.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
