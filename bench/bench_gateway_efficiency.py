"""Gateway efficiency against the embedded model: pipeline evolve throughput / bare client throughput.

    .venv/bin/python bench/bench_gateway_efficiency.py [--n 24] [--concurrency 4] [--max-tokens 96]

One embedded llama.cpp server serves both sides. The bare side sends the very
prompts the pipeline sends (same operations, same sampling, temperature 0 so
the completions are identical) from a plain thread pool with the OpenAI SDK at
the same concurrency. The pipeline side is the evolve flow with answers and the
Equal judge switched off, so it makes exactly one evolve call per record.
Throughput is completion tokens per second over the span of the calls (first
start to last end). Runs bare, pipeline, bare, and compares with the mean bare.
Target (issue 2): ratio >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    a = ap.parse_args()
    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="evolforge-bench-prefect-"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

    import openai
    from prefect import flow

    from evolforge.config.settings import SAMPLE_SEEDS, load_settings
    from evolforge.flows.evolve import EvolveParams, evolve_flow
    from evolforge.storage.ledger import read_ledger
    from evolforge.tasks.core.embedded_model import embedded_server
    from evolforge.tasks.evolve.evolution import choose_operation
    from evolforge.tasks.evolve.prompts import evolve_messages

    seeds = [json.loads(l) for l in open(SAMPLE_SEEDS)][: a.n]
    evo = {"answer": False, "equal_check": False, "temperature": 0.0, "max_new_tokens": a.max_tokens,
           "concurrency": a.concurrency, "batch_size": max(1, a.n)}
    settings = load_settings(overrides={"evol_instruct": evo}, environ={})
    cfg = settings.evol_instruct
    model = settings.models.for_stage("evolve")
    jobs = [evolve_messages(choose_operation(cfg, s["id"], s["domain"], 1), s["instruction"]) for s in seeds]

    @flow
    def warm_up() -> int:
        return 1

    warm_up()
    results: dict = {"n": a.n, "concurrency": a.concurrency, "max_tokens": a.max_tokens}
    with embedded_server(settings.embedded, Path(tempfile.mkdtemp())) as url:
        client = openai.OpenAI(base_url=url, api_key="sk-no-key-required", max_retries=0, timeout=600)

        def bare_call(messages):
            r = client.chat.completions.create(model=model, messages=messages, max_tokens=a.max_tokens,
                                               temperature=cfg.temperature, top_p=cfg.top_p)
            return r.usage.completion_tokens

        def bare() -> dict:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(a.concurrency) as ex:
                toks = sum(ex.map(bare_call, jobs))
            dt = time.perf_counter() - t0
            return {"seconds": round(dt, 2), "completion_tokens": toks, "tokens_per_s": round(toks / dt, 2),
                    "calls_per_s": round(len(jobs) / dt, 3)}

        bare_call(jobs[0])  # warm the model
        results["bare_1"] = bare()
        out = Path(tempfile.mkdtemp()) / "out"
        seeds_file = out.parent / "seeds.jsonl"
        seeds_file.write_text("\n".join(json.dumps(s) for s in seeds) + "\n")
        evolve_flow(EvolveParams(seeds=str(seeds_file), out=str(out), rounds=1, base_url=url,
                                 overrides={"evol_instruct": evo, "gateway": {"concurrency": a.concurrency}}))
        led = read_ledger(out)
        span = float((led["ts"]).max() - (led["ts"] - led["latency_s"]).min())
        toks = int(led["completion_tokens"].sum())
        results["pipeline"] = {"seconds": round(span, 2), "completion_tokens": toks,
                               "tokens_per_s": round(toks / span, 2), "calls_per_s": round(led.height / span, 3)}
        results["bare_2"] = bare()
    bare_tps = (results["bare_1"]["tokens_per_s"] + results["bare_2"]["tokens_per_s"]) / 2
    results["ratio_tokens_per_s"] = round(results["pipeline"]["tokens_per_s"] / bare_tps, 3)
    bare_cps = (results["bare_1"]["calls_per_s"] + results["bare_2"]["calls_per_s"]) / 2
    results["ratio_calls_per_s"] = round(results["pipeline"]["calls_per_s"] / bare_cps, 3)
    print(json.dumps(results, indent=2))
    dest = ROOT / "bench" / "results"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "gateway_efficiency.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
