"""Sandbox throughput: sandboxed pytest runs per second versus the same runs without a sandbox.

    .venv/bin/python bench/bench_sandbox.py [--jobs 40] [--parallel N] [--rounds 3]

Each job is a small passing pytest file (3 tests) against a one-function solution.
- sandboxed:   `run_many(jobs, SandboxSettings(max_parallel=N))` (bwrap mode, all limits on);
- unsandboxed: the same command (`python -m pytest -q -p no:cacheprovider --tb=short`,
  PYTEST_DISABLE_PLUGIN_AUTOLOAD=1) in a plain subprocess (new session, as the sandbox
  uses one) in a temp dir, N at a time;
- unsandboxed_autoload: the same without PYTEST_DISABLE_PLUGIN_AUTOLOAD (what a bare
  `python -m pytest` costs with this venv's plugins), for reference only.
The rounds alternate the variants; the median wall time of each is reported.
Target: sandboxed time <= 1.5x unsandboxed time. Writes bench/results/sandbox.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.run import PYTEST_ARGS, SOLUTION_FILE, TEST_FILE, check_sandbox_available, run_many

RESULTS = Path(__file__).resolve().parent / "results" / "sandbox.json"
TARGET_RATIO = 1.5


def make_jobs(n: int) -> list[tuple[str, str]]:
    jobs = []
    for i in range(n):
        solution = f"def scale(x):\n    return x * {i + 2}\n"
        tests = (
            "from solution import scale\n\n"
            f"def test_one():\n    assert scale(1) == {i + 2}\n\n"
            f"def test_zero():\n    assert scale(0) == 0\n\n"
            f"def test_neg():\n    assert scale(-3) == {-3 * (i + 2)}\n"
        )
        jobs.append((solution, tests))
    return jobs


def _plain_one(job: tuple[str, str], python: str, autoload: bool) -> bool:
    with tempfile.TemporaryDirectory(prefix="evolforge-bench-") as d:
        Path(d, SOLUTION_FILE).write_text(job[0])
        Path(d, TEST_FILE).write_text(job[1])
        env = {"PATH": "/usr/bin:/bin", "HOME": d, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
        if not autoload:
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        # a new session like the sandbox's: with CFS autogroup on, that alone changes the CPU share under load
        r = subprocess.run([python, *PYTEST_ARGS], cwd=d, env=env, capture_output=True, timeout=120, start_new_session=True)
        return r.returncode == 0


def run_plain(jobs, python: str, parallel: int, autoload: bool) -> tuple[float, int]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        ok = sum(pool.map(lambda j: _plain_one(j, python, autoload), jobs))
    return time.perf_counter() - t0, ok


def run_sandboxed(jobs, settings: SandboxSettings) -> tuple[float, int, float]:
    t0 = time.perf_counter()
    results = run_many(jobs, settings)
    wall = time.perf_counter() - t0
    return wall, sum(r.passed for r in results), sum(r.duration_s for r in results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=40, help="test runs per round")
    ap.add_argument("--parallel", type=int, default=SandboxSettings().max_parallel, help="runs in flight (default: SandboxSettings().max_parallel)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    settings = SandboxSettings(max_parallel=args.parallel)
    check_sandbox_available(settings)
    jobs = make_jobs(args.jobs)
    load_before = os.getloadavg()
    run_sandboxed(jobs[:2], settings)  # warm the page cache for both variants
    run_plain(jobs[:2], settings.python, args.parallel, autoload=False)

    walls: dict[str, list[float]] = {"sandboxed": [], "unsandboxed": [], "unsandboxed_autoload": []}
    charged = []
    for rnd in range(args.rounds):
        wall, ok, sandbox_seconds = run_sandboxed(jobs, settings)
        assert ok == len(jobs), f"round {rnd}: only {ok}/{len(jobs)} sandboxed runs passed"
        walls["sandboxed"].append(wall)
        charged.append(sandbox_seconds / len(jobs))
        for name, autoload in (("unsandboxed", False), ("unsandboxed_autoload", True)):
            wall, ok = run_plain(jobs, settings.python, args.parallel, autoload)
            assert ok == len(jobs), f"round {rnd}: only {ok}/{len(jobs)} {name} runs passed"
            walls[name].append(wall)
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in walls.items()), flush=True)

    med = {k: statistics.median(v) for k, v in walls.items()}
    ratio = med["sandboxed"] / med["unsandboxed"]
    report = {
        "command": "python " + " ".join([os.path.relpath(__file__, Path.cwd())] + (argv if argv is not None else sys.argv[1:])),
        "jobs": args.jobs, "parallel": args.parallel, "rounds": args.rounds, "cpus": os.cpu_count(),
        "platform": platform.platform(), "python": platform.python_version(),
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": {k: [round(x, 3) for x in v] for k, v in walls.items()},
        "median_wall_seconds": {k: round(v, 3) for k, v in med.items()},
        "runs_per_second": {k: round(args.jobs / v, 2) for k, v in med.items()},
        "median_charged_sandbox_seconds_per_run": round(statistics.median(charged), 4),
        "ratio_sandboxed_over_unsandboxed": round(ratio, 3),
        "ratio_sandboxed_over_unsandboxed_autoload": round(med["sandboxed"] / med["unsandboxed_autoload"], 3),
        "target_ratio": TARGET_RATIO, "target_met": ratio <= TARGET_RATIO,
    }
    for k in walls:
        print(f"{k:>22}: {report['runs_per_second'][k]:6.2f} runs/s  (median {med[k]:.2f}s for {args.jobs} runs)")
    print(f"sandboxed / unsandboxed = {ratio:.2f}x (target <= {TARGET_RATIO}x): {'MET' if report['target_met'] else 'NOT MET'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
