"""One task's tests against many solutions (what evolution does): pytest-form checks per second, this checkout
against another commit, side by side in one run.

    .venv/bin/python bench/bench_sandbox_repeat.py --ref d879a8f~1 [--solutions 4] [--repeat 3]

Each of HumanEval's 164 tasks, as the pytest file bench/bench_sandbox.py's pytest form uses, is checked
`--solutions` times in a row against its canonical solution (all must pass; the broken forms are left out: a failing
check costs more in pytest's report, and one of them, HumanEval/39, loops until its CPU limit) with warm workers,
2 checks in flight; one run is every task in turn. The runs alternate
between the two trees (a `git worktree` of --ref, imported through a PYTHONPATH entry: evolforge.testing.ref_tree),
so both see the same machine load. Writes bench/results/sandbox_repeat.json: every run's checks/s, the median per
tree and the load before and after.
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

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "sandbox_repeat.json"


def one_run(solutions: int, parallel: int) -> dict:
    """In a child process whose `evolforge` is the tree under test: one timed run, after starting the workers."""
    from evolforge.bench.bench_sandbox import humaneval_jobs, humaneval_problems, run_checks  # the tree's own
    from evolforge.config.sections.sandbox import SandboxSettings
    from evolforge.tasks.sandbox.pool import close_workers

    problems = humaneval_problems()
    good = humaneval_jobs(problems, [p["canonical_solution"] for p in problems], True)
    jobs = [job for job in good for _ in range(solutions)]
    settings = SandboxSettings(max_parallel=parallel).model_copy(update={"reuse_workers": True})
    warm = ("def f():\n    return 1\n", "from solution import *\n\n\ndef test_f():\n    assert f() == 1\n")
    run_checks([warm] * 4, settings)  # start the workers and their pytest (no file of the timed run)
    wall, ok = run_checks(jobs, settings)
    close_workers()
    assert all(ok), f"{ok.count(False)} canonical solutions failed"
    return {"checks": len(jobs), "wall_seconds": round(wall, 3), "checks_per_second": round(len(jobs) / wall, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", help="the commit to compare with")
    ap.add_argument("--solutions", type=int, default=4, help="solutions checked against each task's tests")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one_run:
        print(json.dumps(one_run(a.solutions, a.parallel)))
        return 0
    from evolforge.testing.ref_tree import ref_tree

    def run(pythonpath: str | None) -> dict:
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        cmd = [sys.executable, __file__, "--one-run", "--solutions", str(a.solutions), "--parallel", str(a.parallel)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, cwd=ROOT)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        return json.loads(proc.stdout.strip().splitlines()[-1])

    load_before, started = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    runs: dict[str, list[dict]] = {"ref": [], "head": []}
    with ref_tree(a.ref, Path(tempfile.mkdtemp(prefix="evolforge-sandbox-repeat-"))) as (_tree, shadow):
        for i in range(a.repeat):
            for name, path in (("ref", shadow), ("head", None)):
                runs[name].append(run(path))
                print(f"run {i + 1} {name}: {runs[name][-1]['checks_per_second']} checks/s", flush=True)
    head_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    median = {k: statistics.median(r["checks_per_second"] for r in v) for k, v in runs.items()}
    result = {"command": "python bench/bench_sandbox_repeat.py " + " ".join(sys.argv[1:]), "started": started,
              "ref": a.ref, "head": head_rev, "solutions_per_task": a.solutions, "parallel": a.parallel,
              "repeat": a.repeat, "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
              "loadavg_after": [round(x, 2) for x in os.getloadavg()], "runs": runs,
              "median_checks_per_second": median, "head_over_ref": round(median["head"] / median["ref"], 3)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_checks_per_second", "head_over_ref", "loadavg_before",
                                             "loadavg_after")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
