"""Peak memory of an evolve run against the number of seeds, side by side in one run.

    .venv/bin/python bench/bench_memory.py [--sizes 2000 20000] [--rounds 2]   # bench/results/memory.json

Each size runs in its own process (a fresh interpreter, so one peak never hides another): seeds made up
locally (one template, a number changed: the dedup stage's worst case), `--rounds` Evol-Instruct rounds with
per-round dedup against testing/instant_server.py (answers at once), the default settings otherwise. Reported
per size: the flow process's peak RSS (ru_maxrss), wall time, records in the dedup index and the index's
in-memory bytes per record (what a round's dedup holds per indexed record: ids and texts, MinHash shingles,
signatures and band keys, static embeddings, full-model vectors where computed); then the ratio of the largest size's peak to the smallest's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolforge.testing.net import free_port

ROOT = Path(__file__).resolve().parents[1]


def child(n: int, rounds: int) -> dict:
    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="evolforge-bench-prefect-"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    work = Path(tempfile.mkdtemp(prefix="evolforge-bench-mem-"))
    seeds = work / "seeds.jsonl"
    with open(seeds, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"b{i:06d}",
                                 "instruction": f"Explain step by step how to compute {i} times {i % 97 + 3}."}) + "\n")
    port = free_port()
    server = subprocess.Popen([sys.executable, str(ROOT / "testing" / "instant_server.py"), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        from evolforge.flows.evolve import EvolveParams, evolve_flow

        start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t0 = time.time()
        summary = evolve_flow(EvolveParams(seeds=str(seeds), out=str(work / "out"), rounds=rounds,
                                           base_url=f"http://127.0.0.1:{port}/v1"))
        wall = time.time() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        records, per_record = index_cost(work / "out")
    finally:
        server.terminate()
    return {"seeds": n, "rounds": rounds, "peak_rss_mb": round(peak, 1), "rss_after_imports_mb": round(start_rss, 1),
            "wall_s": round(wall, 1), "evolved_records": summary["counts"]["evolved"],
            "index_records": records, "index_bytes_per_record": per_record}


def index_cost(out: Path) -> tuple[int, float]:
    """Records in the run's dedup index and the bytes per record of its arrays once loaded."""
    import numpy as np

    records, nbytes = 0, 0
    for f in sorted((out / "dedup_index").glob("*.npz")):  # segments, and full-model vectors computed later
        with np.load(f, allow_pickle=False) as z:
            nbytes += sum(z[k].nbytes for k in z.files)
            if f.name.startswith("seg-"):
                records += len(z["exact"])
    return records, round(nbytes / max(records, 1), 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a.rounds)), flush=True)
        return
    results = []
    for n in a.sizes:
        proc = subprocess.run([sys.executable, __file__, "--child", str(n), "--rounds", str(a.rounds)],
                              capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"size {n} failed:\n{proc.stderr[-3000:]}")
        results.append(json.loads(line[7:]))
        print(json.dumps(results[-1]), flush=True)
    out = {"runs": results, "peak_ratio_largest_to_smallest": round(results[-1]["peak_rss_mb"] / results[0]["peak_rss_mb"], 3),
           "load_avg_end": os.getloadavg()}
    print(json.dumps(out, indent=2))
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "memory.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
