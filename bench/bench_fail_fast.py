"""Fail fast: how long a user error takes to report, side by side with its reference.

    .venv/bin/python bench/bench_fail_fast.py [--rounds 5] [--reference-rounds 2]

- cli:       `evolforge run --seeds MISSING --out DIR` (the check runs before any Prefect server starts);
- cli_bad_rows / cli_bad_config / cli_unwritable_out: the other user errors of tests/cli/test_fail_fast.py;
- reference: the same missing seed file found inside the evolve flow called directly (what `evolforge run` did
  before: a temporary Prefect server starts, then the seed file is read), in a fresh process each round;
- status:    `evolforge status --out DIR` over a folder with rounds (reads checkpoints, starts nothing).
Each variant: wall time from process start to exit, median of the rounds; the variants alternate. Also
checked every time: exit status 2 and no output folder for the CLI variants. Writes bench/results/fail_fast.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVOLFORGE = Path(sys.executable).with_name("evolforge")


def timed(cmd: list[str], env: dict) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    return time.perf_counter() - t0, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reference-rounds", type=int, default=2)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVOLFORGE", "PREFECT_API"))}
    tmp = Path(tempfile.mkdtemp(prefix="evolforge-bench-ff-"))
    env["PREFECT_HOME"] = str(tmp / "prefect-home")
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    bad_rows = tmp / "bad.jsonl"
    bad_rows.write_text('{"prompt": "text in another column"}\n')
    bad_cfg = tmp / "bad.toml"
    bad_cfg.write_text('[evol_instruct]\nrounds = "many"\n')
    (tmp / "file").write_text("x")
    seeds = ROOT / "config" / "sample_seeds.jsonl"
    out = tmp / "out"
    variants = {
        "cli": [str(EVOLFORGE), "run", "--seeds", str(tmp / "missing.jsonl"), "--out", str(out)],
        "cli_bad_rows": [str(EVOLFORGE), "run", "--seeds", str(bad_rows), "--out", str(out)],
        "cli_bad_config": [str(EVOLFORGE), "run", "--seeds", str(seeds), "--out", str(out), "--config", str(bad_cfg)],
        "cli_unwritable_out": [str(EVOLFORGE), "run", "--seeds", str(seeds), "--out", str(tmp / "file" / "out")],
    }
    reference = [sys.executable, "-c", "import sys; from evolforge.flows.evolve import EvolveParams, evolve_flow\n"
                 "try:\n    evolve_flow(EvolveParams(seeds=sys.argv[1], out=sys.argv[2]))\n"
                 "except Exception as e:\n    print(e); sys.exit(2)", str(tmp / "missing.jsonl"), str(tmp / "ref-out")]
    times: dict[str, list[float]] = {k: [] for k in [*variants, "reference", "status"]}
    for r in range(args.rounds):
        for name, cmd in variants.items():
            seconds, rc = timed(cmd, env)
            assert rc == 2 and not out.exists(), (name, rc)
            times[name].append(seconds)
        if r < args.reference_rounds:
            seconds, rc = timed(reference, env)
            assert rc == 2, rc
            times["reference"].append(seconds)
        if r == 0:  # a folder with rounds for `status`
            rounds = tmp / "run" / "rounds" / "round_01"
            rounds.mkdir(parents=True)
        seconds, rc = timed([str(EVOLFORGE), "status", "--out", str(tmp / "run")], env)
        times["status"].append(seconds)
    result = {name: {"median_s": round(statistics.median(v), 3), "min_s": round(min(v), 3), "runs": len(v)}
              for name, v in times.items()}
    result["speedup_cli_vs_reference"] = round(result["reference"]["median_s"] / result["cli"]["median_s"], 1)
    result["load_average"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    dest = ROOT / "bench" / "results" / "fail_fast.json"
    dest.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
