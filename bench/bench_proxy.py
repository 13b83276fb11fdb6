"""The recording proxy side by side with the LiteLLM proxy and with the bare upstream, in one run, for the three
wire APIs (chat completions, Responses, Messages), streamed and not.

    flock /tmp/evolforge-bench.lock .venv/bin/python bench/bench_proxy.py [--seconds 3] [--paced-seconds 3]
        [--clients 32] [--rate 100] [--repeat 3] [--apis chat,responses,messages] [--no-litellm]
                                                                                   # bench/results/proxy.json

Processes, all on this machine's 2 cores:
  upstream   testing/instant_server.py (asyncio, answers at once; each API in its own form; a stream is 8 text
             deltas in that API's events, sent as fast as they are written); a second one whose deltas come
             10 ms apart, for the stream-spread check.
  evolforge  `evolforge proxy --upstream <instant>/v1` (records to a temporary folder); a second one to the slow
             upstream. Sessions in the path (`/s/bench-<client>/v1/...`).
  evolforge-2w  the same with proxy.workers = 2 (two worker processes on the port, the session tree shared).
  litellm    the LiteLLM proxy (`litellm --config`, LITELLM_VERSION, in its own virtualenv outside the repository,
             built on first use: ensure_litellm_env), one model per API and upstream: `openai/scripted`
             (chat and Responses, forwarded to the upstream's /v1/chat/completions and /v1/responses) and
             `anthropic/scripted-messages` (forwarded to its /v1/messages); a master key (its clients send it),
             no database, no callbacks (it records nothing), LITELLM_LOG=ERROR, the local cost map.
  clients    this process: aiohttp, keep-alive, a connection per client.

Per API and streaming mode, the three sides take turns (the first side rotates), `--repeat` times:
  closed     `--clients` clients each sending its next call when the last is answered, for `--seconds`:
             calls/s, p50 / p99 latency (a stream: to its last byte; also to its first chunk), and the CPU
             milliseconds per call of the upstream, the proxy (its process and children) and the clients.
  paced      `--rate` calls/s for `--paced-seconds` (call i sent at i / rate, up to `--clients` in flight):
             p50 / p99; below saturation this is the proxy's own added latency.
  spread     (streams) 8 clients for `--spread-calls` calls against the slow upstream: time to the first chunk
             and from the first chunk to the last (8 deltas 10 ms apart: about 70 ms when nothing is buffered).
First, `--httpx-repeat` closed-loop chat rounds with httpx's AsyncClient instead of aiohttp, direct and through
the evolforge proxy: the client library's own ceiling on this machine.
"Added" figures are the median over repeats of (side - direct). The load average is read before and after each
round. At the end, every call the bench sent to the evolforge proxies (warm-up included) is compared with the
records and the ledger rows they wrote (one each per call).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from evolforge.storage.locks import lock_file
from evolforge.testing import cached_env
from evolforge.testing.net import free_port, wait_up

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Explain step by step how to add 2 and 3."
# 1.108.7 is the newest 1.108 release whose proxy extra installs from PyPI (1.108.8 to .14 pin
# litellm-enterprise / litellm-proxy-extras builds that were never published there).
LITELLM_VERSION = "1.108.7"
LITELLM_REQUIREMENTS = (f"litellm[proxy]=={LITELLM_VERSION}",)
LITELLM_KEY = "sk-bench-0123456789abcdef"
LITELLM_MARKER = ".evolforge-litellm-env.json"
# route, body, the model LiteLLM routes it by (and the slow upstream's)
APIS = {
    "chat": ("chat/completions", {"model": "scripted", "messages": [{"role": "user", "content": PROMPT}]}),
    "responses": ("responses", {"model": "scripted", "input": PROMPT}),
    "messages": ("messages", {"model": "scripted-messages", "max_tokens": 256,
                              "messages": [{"role": "user", "content": PROMPT}]}),
}
SIDES = ("direct", "evolforge", "evolforge-2w", "litellm")
EVO_SIDES = ("evolforge", "evolforge-2w")


# ------------------------------------------------------------------ LiteLLM's environment (outside the repository)
def litellm_env_dir() -> Path:
    """$EVOLFORGE_LITELLM_ENV, else ~/.cache/evolforge/bench-envs/litellm/<key of python + requirements>."""
    return cached_env.env_dir("EVOLFORGE_LITELLM_ENV", "bench-envs/litellm", LITELLM_REQUIREMENTS)


def ensure_litellm_env(timeout: float = 1800.0) -> Path:
    """The environment's root, built on first use (python -m venv, pip install litellm[proxy]); once per machine
    and requirements; concurrent builders wait on a lock; an interrupted build (no marker) is built again."""
    root = litellm_env_dir()
    if (root / LITELLM_MARKER).is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with lock_file(root.parent / f"{root.name}.lock", timeout=timeout, what="LiteLLM environment build"):
        if (root / LITELLM_MARKER).is_file():
            return root
        if root.exists():
            shutil.rmtree(root)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, capture_output=True, timeout=300)
            pip = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "--quiet",
                                  "--disable-pip-version-check", "--no-input", *LITELLM_REQUIREMENTS],
                                 capture_output=True, text=True, timeout=timeout)
            if pip.returncode != 0:
                raise RuntimeError(f"pip install of {LITELLM_REQUIREMENTS} failed:\n{pip.stderr[-3000:]}")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        (root / LITELLM_MARKER).write_text(json.dumps({"requirements": list(LITELLM_REQUIREMENTS)}))
    return root


def litellm_config(fast: int, slow: int) -> str:
    models = []
    for suffix, port in (("", fast), ("-slow", slow)):
        models.append(f"  - model_name: scripted{suffix}\n    litellm_params:\n      model: openai/scripted\n"
                      f"      api_base: http://127.0.0.1:{port}/v1\n      api_key: bench\n")
        models.append(f"  - model_name: scripted-messages{suffix}\n    litellm_params:\n"
                      f"      model: anthropic/scripted-messages\n      api_base: http://127.0.0.1:{port}\n"
                      f"      api_key: bench\n")
    return "model_list:\n" + "".join(models)


# ------------------------------------------------------------------ measuring
def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its live children so far (Linux /proc)."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 3)


@dataclass
class Side:
    name: str
    base: str
    slow_base: str
    pid: int | None  # the proxy's process (None: direct)
    headers: dict
    sessions: bool  # the session rides in the path

    def path(self, route: str, worker: int) -> str:
        return f"/s/bench-{worker}/v1/{route}" if self.sessions else f"/v1/{route}"


async def run_load(side: Side, api: str, stream: bool, clients: int, seconds: float = 0.0, rate: float = 0.0,
                   calls: int = 0, slow: bool = False) -> dict:
    """Closed loop (rate 0: each client sends again when answered, until `seconds` have passed or `calls` were
    sent) or paced (call i sent no earlier than i / rate after the start, `calls` of them)."""
    import aiohttp

    route, body = APIS[api]
    body = {**body, "stream": True} if stream else body
    if slow:
        body = {**body, "model": body["model"] + "-slow"} if side.name == "litellm" else body
    lat, first, spread, bad = [], [], [], []
    sent = [0]
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    start = time.perf_counter()
    deadline = start + seconds if seconds else float("inf")
    limit = calls or 10 ** 9
    async with aiohttp.ClientSession(base_url=side.slow_base if slow else side.base, connector=connector,
                                     headers=side.headers, timeout=timeout) as c:
        async def worker(w: int) -> None:
            path = side.path(route, w)
            while time.perf_counter() < deadline and sent[0] < limit:
                i = sent[0]
                sent[0] += 1
                if rate:
                    await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                t0 = time.perf_counter()
                try:
                    async with c.post(path, json={**body, "user": f"u{i}"}) as r:
                        t_first = None
                        if stream:
                            async for chunk in r.content.iter_any():
                                if chunk and t_first is None:
                                    t_first = time.perf_counter()
                        else:
                            await r.read()
                        status = r.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    bad.append(type(e).__name__)
                    continue
                t1 = time.perf_counter()
                if status != 200:
                    bad.append(status)
                    continue
                lat.append(t1 - t0)
                if t_first is not None:
                    first.append(t_first - t0)
                    spread.append(t1 - t_first)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(clients)))
        wall = time.perf_counter() - t0
    out = {"sent": sent[0], "ok": len(lat), "errors": len(bad), "first_errors": bad[:3],
           "calls_per_s": round(len(lat) / wall, 1), "p50_ms": ms(pct(lat, 0.5)), "p99_ms": ms(pct(lat, 0.99))}
    if stream:
        out.update(ttfc_p50_ms=ms(pct(first, 0.5)), first_to_last_p50_ms=ms(pct(spread, 0.5)))
    return out


async def run_httpx(side: Side, clients: int, seconds: float) -> dict:
    """The same closed loop of chat calls with httpx's AsyncClient (what the earlier bench and many agents use)."""
    import httpx

    route, body = APIS["chat"]
    lat: list[float] = []
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=side.base, headers=side.headers, limits=limits, timeout=120) as c:
        async def worker(w: int) -> None:
            path = side.path(route, w)
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                r = await c.post(path, json={**body, "user": f"h{len(lat)}"})
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(clients)))
        wall = time.perf_counter() - t0
    return {"sent": len(lat), "ok": len(lat), "calls_per_s": round(len(lat) / wall, 1), "p50_ms": ms(pct(lat, 0.5)),
            "p99_ms": ms(pct(lat, 0.99))}


def measured(fn, pids: dict[str, int]) -> dict:
    """Run one load round; add the CPU milliseconds per answered call of each process (this one: the clients)."""
    before = {k: cpu_s(p) for k, p in pids.items()}
    t0 = time.process_time()
    load0 = os.getloadavg()[0]
    out = fn()
    n = max(1, out["ok"])
    out["cpu_ms_per_call"] = {k: round(1000 * (cpu_s(p) - before[k]) / n, 4) for k, p in pids.items()}
    out["cpu_ms_per_call"]["clients"] = round(1000 * (time.process_time() - t0) / n, 4)
    out["load_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    return out


def count_lines(folder: Path) -> int:
    return sum(sum(1 for _ in open(f, "rb")) for f in folder.glob("*.jsonl"))


# ------------------------------------------------------------------ the run
def start_processes(a, work: Path, stack) -> dict[str, Side]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "EVOLFORGE_API_KEY")}
    env["PYTHONUNBUFFERED"] = "1"
    ports = {k: free_port() for k in ("up", "up_slow", "evo", "evo_slow", "evo2", "evo2_slow", "litellm")}
    two = work / "workers-2.toml"
    two.write_text("[proxy]\nworkers = 2\n")
    procs = stack
    procs.append(subprocess.Popen([sys.executable, str(ROOT / "testing" / "instant_server.py"), "--port",
                                   str(ports["up"]), "--chunk-delay", "0"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL))
    procs.append(subprocess.Popen([sys.executable, str(ROOT / "testing" / "instant_server.py"), "--port",
                                   str(ports["up_slow"]), "--chunk-delay", "0.01"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL))
    up_pid = procs[0].pid
    evo = {}
    for key, up in (("evo", "up"), ("evo_slow", "up_slow"), ("evo2", "up"), ("evo2_slow", "up_slow")):
        if key.startswith("evo2") and not a.workers_side:
            continue
        log = open(work / f"{key}.log", "w")
        config = ["--config", str(two)] if key.startswith("evo2") else []
        evo[key] = subprocess.Popen([sys.executable, "-m", "evolforge.cli", "proxy", "--upstream",
                                     f"http://127.0.0.1:{ports[up]}/v1", "--port", str(ports[key]), "--out",
                                     str(work / f"rec-{key}"), *config], env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
    procs += evo.values()
    direct = f"http://127.0.0.1:{ports['up']}"
    sides = {
        "direct": Side("direct", direct, f"http://127.0.0.1:{ports['up_slow']}", None, {}, False),
        "evolforge": Side("evolforge", f"http://127.0.0.1:{ports['evo']}", f"http://127.0.0.1:{ports['evo_slow']}",
                          evo["evo"].pid, {}, True),
    }
    if a.workers_side:
        sides["evolforge-2w"] = Side("evolforge-2w", f"http://127.0.0.1:{ports['evo2']}",
                                     f"http://127.0.0.1:{ports['evo2_slow']}", evo["evo2"].pid, {}, True)
    if a.litellm:
        root = ensure_litellm_env()
        cfg = work / "litellm.yaml"
        cfg.write_text(litellm_config(ports["up"], ports["up_slow"]))
        lenv = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PYTHONPATH")}
        lenv.update(LITELLM_LOG="ERROR", LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_MASTER_KEY=LITELLM_KEY,
                    PYTHONUNBUFFERED="1")
        log = open(work / "litellm.log", "w")
        ll = subprocess.Popen([str(root / "bin" / "litellm"), "--config", str(cfg), "--host", "127.0.0.1",
                               "--port", str(ports["litellm"]), "--num_workers", "1"], env=lenv, cwd=work,
                              stdout=log, stderr=subprocess.STDOUT)
        procs.append(ll)
        base = f"http://127.0.0.1:{ports['litellm']}"
        sides["litellm"] = Side("litellm", base, base, ll.pid, {"authorization": f"Bearer {LITELLM_KEY}"}, False)
    wait_up(f"{direct}/v1/models")
    wait_up(f"http://127.0.0.1:{ports['up_slow']}/v1/models")
    for s in sides.values():
        if s.name in EVO_SIDES:
            wait_up(f"{s.base}/healthz")
            wait_up(f"{s.slow_base}/healthz")
        elif s.name == "litellm":
            wait_up(f"{s.base}/health/liveliness", timeout=180)
    sides["_upstream_pid"] = up_pid  # type: ignore[assignment]
    return sides


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=3.0, help="length of a closed-loop round")
    ap.add_argument("--rate", type=float, default=100.0, help="calls/s of the paced rounds (below saturation)")
    ap.add_argument("--paced-seconds", type=float, default=3.0)
    ap.add_argument("--spread-calls", type=int, default=80, help="streamed calls to the slow upstream (0: none)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--apis", default="chat,responses,messages")
    ap.add_argument("--modes", default="plain,stream")
    ap.add_argument("--no-litellm", dest="litellm", action="store_false")
    ap.add_argument("--no-workers-side", dest="workers_side", action="store_false",
                    help="leave out the evolforge proxy with proxy.workers = 2")
    ap.add_argument("--httpx-repeat", type=int, default=1, help="closed-loop chat rounds with httpx clients")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "proxy.json"))
    a = ap.parse_args()
    apis = a.apis.split(",")
    modes = [m == "stream" for m in a.modes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="evolforge-bench-proxy-"))
    load_start = os.getloadavg()
    t_start = time.time()
    procs: list[subprocess.Popen] = []
    rounds: list[dict] = []
    httpx_rounds: list[dict] = []
    sent_evo = 0
    try:
        sides = start_processes(a, work, procs)
        up_pid = sides.pop("_upstream_pid")
        names = [n for n in SIDES if n in sides]
        for api in apis:  # warm every path (imports, connections, caches)
            for stream in modes:
                for n in names:
                    r = asyncio.run(run_load(sides[n], api, stream, 4, calls=40))
                    if r["ok"] != 40:
                        sys.exit(f"warm-up of {n} {api} stream={stream} failed: {r}")
                    sent_evo += r["sent"] if n in EVO_SIDES else 0
        for n in ("direct", "evolforge") if a.httpx_repeat else ():  # httpx's connections and imports, unmeasured
            sent_evo += asyncio.run(run_httpx(sides[n], a.clients, 0.5))["sent"] if n == "evolforge" else 0
        for rep in range(a.httpx_repeat):  # the client library's own ceiling, beside the proxy's cost
            row = {}
            for n in ("direct", "evolforge"):
                s = sides[n]
                pids = {"upstream": up_pid, **({"proxy": s.pid} if s.pid else {})}
                row[n] = measured(lambda: asyncio.run(run_httpx(s, a.clients, a.seconds)), pids)
                sent_evo += row[n]["sent"] if n == "evolforge" else 0
            httpx_rounds.append(row)
            print(f"[httpx {rep + 1}] " + " | ".join(f"{n} {row[n]['calls_per_s']}/s p50 {row[n]['p50_ms']} cpu clients "
                                                    f"{row[n]['cpu_ms_per_call']['clients']}" for n in row), flush=True)
        turn = 0
        for rep in range(a.repeat):
            for api in apis:
                for stream in modes:
                    order = names[turn % len(names):] + names[:turn % len(names)]
                    turn += 1
                    row = {"repeat": rep, "api": api, "stream": stream, "order": order}
                    for n in order:
                        s = sides[n]
                        pids = {"upstream": up_pid, **({"proxy": s.pid} if s.pid else {})}
                        closed = measured(lambda: asyncio.run(run_load(s, api, stream, a.clients, seconds=a.seconds)),
                                          pids)
                        paced = measured(lambda: asyncio.run(run_load(s, api, stream, a.clients, rate=a.rate,
                                                                      calls=int(a.rate * a.paced_seconds))), pids)
                        row[n] = {"closed": closed, "paced": paced}
                        if stream and a.spread_calls:
                            row[n]["spread"] = asyncio.run(run_load(s, api, True, 8, calls=a.spread_calls, slow=True))
                        if n in EVO_SIDES:
                            sent_evo += closed["sent"] + paced["sent"] + (row[n].get("spread") or {}).get("sent", 0)
                    rounds.append(row)
                    print(f"[{rep + 1}] {api:9} {'stream' if stream else 'plain '} " + " | ".join(
                        f"{n} {row[n]['closed']['calls_per_s']}/s p50 {row[n]['closed']['p50_ms']} "
                        f"p99 {row[n]['closed']['p99_ms']} paced p50 {row[n]['paced']['p50_ms']} "
                        f"cpu {row[n]['closed']['cpu_ms_per_call'].get('proxy', 0)} "
                        f"err {row[n]['closed']['errors'] + row[n]['paced']['errors']}" for n in names)
                        + f" | load {row[names[0]]['closed']['load_1m'][0]}", flush=True)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    recs = [work / f"rec-{k}" for k in ("evo", "evo_slow", "evo2", "evo2_slow")]
    records = sum(count_lines(r / "records") for r in recs if r.exists())
    ledger = sum(count_lines(r / "ledger") for r in recs if r.exists())

    def med(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 3) if values else None

    summary = {}
    for api in apis:
        for stream in modes:
            rs = [r for r in rounds if r["api"] == api and r["stream"] == stream]
            key = f"{api}{' stream' if stream else ''}"
            summary[key] = {}
            for n in names:
                s = {"calls_per_s": med(r[n]["closed"]["calls_per_s"] for r in rs),
                     "p50_ms": med(r[n]["closed"]["p50_ms"] for r in rs),
                     "p99_ms": med(r[n]["closed"]["p99_ms"] for r in rs),
                     "paced_p50_ms": med(r[n]["paced"]["p50_ms"] for r in rs),
                     "paced_p99_ms": med(r[n]["paced"]["p99_ms"] for r in rs),
                     "errors": sum(r[n]["closed"]["errors"] + r[n]["paced"]["errors"] for r in rs),
                     "cpu_ms_per_call": {k: med(r[n]["closed"]["cpu_ms_per_call"].get(k) for r in rs)
                                         for k in ("upstream", "proxy", "clients")}}
                if n != "direct":
                    s["added_p50_ms"] = med(r[n]["closed"]["p50_ms"] - r["direct"]["closed"]["p50_ms"] for r in rs)
                    s["added_p99_ms"] = med(r[n]["closed"]["p99_ms"] - r["direct"]["closed"]["p99_ms"] for r in rs)
                    s["paced_added_p50_ms"] = med(r[n]["paced"]["p50_ms"] - r["direct"]["paced"]["p50_ms"] for r in rs)
                    s["paced_added_p99_ms"] = med(r[n]["paced"]["p99_ms"] - r["direct"]["paced"]["p99_ms"] for r in rs)
                if stream:
                    s["ttfc_p50_ms"] = med(r[n]["closed"].get("ttfc_p50_ms") for r in rs)
                    if a.spread_calls:
                        s["slow_ttfc_p50_ms"] = med(r[n]["spread"]["ttfc_p50_ms"] for r in rs)
                        s["slow_first_to_last_p50_ms"] = med(r[n]["spread"]["first_to_last_p50_ms"] for r in rs)
                summary[key][n] = s
    result = {
        "clients": a.clients, "seconds": a.seconds, "rate": a.rate, "paced_seconds": a.paced_seconds,
        "repeat": a.repeat, "litellm": LITELLM_VERSION if a.litellm else None,
        "summary": summary, "rounds": rounds, "httpx_rounds": httpx_rounds,
        "evolforge_calls_sent": sent_evo, "evolforge_records": records, "evolforge_ledger_rows": ledger,
        "load_avg_start": load_start, "load_avg_end": os.getloadavg(), "wall_s": round(time.time() - t_start, 1),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    if not (sent_evo == records == ledger):
        sys.exit(f"calls in {sent_evo}, records {records}, ledger rows {ledger}: not one each per call")


if __name__ == "__main__":
    main()
