"""The orchestration benchmark, this checkout against another commit, side by side in one run.

    .venv/bin/python bench/bench_orchestration_ab.py --ref c5c717f --n 4000 --repeat 3

Checks `--ref` out into a temporary git worktree, makes it importable as `evolforge` (a PYTHONPATH entry that
shadows this venv's editable install), then runs each tree's own `bench/bench_orchestration.py` alternately
(ref, this checkout, ref, ...) with the same arguments, so both see the same machine load. Prints and writes
bench/results/orchestration_ab.json: every run's items/s and the median per tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from evolforge.testing.ref_tree import ref_tree

ROOT = Path(__file__).resolve().parents[1]


def run_bench(tree: Path, pythonpath: str | None, args: list[str]) -> dict:
    env = {**os.environ, "PREFECT_HOME": tempfile.mkdtemp(prefix="evolforge-ab-prefect-")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([sys.executable, str(tree / "bench" / "bench_orchestration.py"), *args], env=env,
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"bench in {tree} failed:\n{proc.stderr[-3000:]}")
    out = proc.stdout
    return json.loads(out[out.index("{"):out.rindex("}") + 1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", required=True, help="the commit to compare with (e.g. the one before a refactor)")
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-dedup", action="store_true")
    a = ap.parse_args()

    args = ["--n", str(a.n)] + (["--no-dedup"] if a.no_dedup else [])
    runs: dict[str, list[dict]] = {"ref": [], "head": []}
    with ref_tree(a.ref) as (old_tree, shadow):
        for i in range(a.repeat):
            for name, tree, path in (("ref", old_tree, shadow), ("head", ROOT, None)):
                r = run_bench(tree, path, args)
                runs[name].append(r)
                print(f"run {i + 1} {name}: {r['items_per_s_round']} items/s (round), "
                      f"{r['items_per_s_flow']} items/s (flow)", flush=True)
    head_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    result = {"ref": a.ref, "head": head_rev, "n": a.n, "dedup": not a.no_dedup, "runs": runs,
              "median_items_per_s_round": {k: statistics.median(r["items_per_s_round"] for r in v)
                                           for k, v in runs.items()},
              "median_items_per_s_flow": {k: statistics.median(r["items_per_s_flow"] for r in v)
                                          for k, v in runs.items()},
              "load_avg_end": os.getloadavg()}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "orchestration_ab.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
