"""Sandbox service throughput: checks/s through `evolforge sandbox-serve` (verl's own client) vs in-process.

    .venv/bin/python bench/bench_sandbox_service.py [--checks 60] [--concurrency 2] [--rounds 3]

One check = one stdin/stdout test case, as verl's code reward runs it: a small program reads its input and
prints an answer, compared with the expected output (every 5th program is wrong, so both outcomes are timed).
- service:    `evolforge sandbox-serve` in its own process (sandbox.service.max_concurrency = N), driven by
              verl's `check_correctness` (testing/sandbox_fusion_client.py), N checks in flight;
- in_process: `run_python_program` (tasks/sandbox/run.py) with the same settings, N threads, the same
              comparison (stdout without trailing newlines).
Both must reach the same verdicts. The rounds alternate the variants; the median wall time of each is reported.
The difference is the service's cost: HTTP + JSON + one event-loop hop per check. Writes
bench/results/sandbox_service.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.sandbox.run import check_sandbox_available, run_python_program
from evolforge.tasks.sandbox.service import free_port
from evolforge.testing.sandbox_fusion_client import VERL_VERSION, load_client

RESULTS = Path(__file__).resolve().parent / "results" / "sandbox_service.json"
TIMEOUT = 10


def make_checks(n: int) -> list[tuple[str, str, str]]:
    """(code, stdin, expected stdout); every 5th program answers wrongly."""
    checks = []
    for i in range(n):
        k = i % 7 + 2
        wrong = " + 1" if i % 5 == 4 else ""
        code = f"nums = list(map(int, input().split()))\nprint(sum(x * {k} for x in nums){wrong})\n"
        nums = list(range(i, i + 5))
        checks.append((code, " ".join(map(str, nums)), str(sum(x * k for x in nums))))
    return checks


def start_service(port: int, concurrency: int) -> subprocess.Popen:
    env = dict(os.environ, EVOLFORGE__SANDBOX__SERVICE__MAX_CONCURRENCY=str(concurrency),
               EVOLFORGE__SANDBOX__SERVICE__QUEUE_TIMEOUT_SECONDS="600")
    proc = subprocess.Popen([sys.executable, "-m", "evolforge.cli", "sandbox-serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/v1/ping", timeout=2).json() == "pong":
                return proc
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"sandbox-serve did not start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.2)


def run_service(client, url: str, checks, concurrency: int) -> tuple[float, list]:
    def one(check):
        code, stdin, expected = check
        return client.check_correctness(url, {"inputs": [stdin], "outputs": [expected]}, code, timeout=TIMEOUT)[0][0]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        verdicts = list(pool.map(one, checks))
    return time.perf_counter() - t0, verdicts


def run_in_process(settings: SandboxSettings, checks, concurrency: int) -> tuple[float, list]:
    def one(check):
        code, stdin, expected = check
        r = run_python_program(code, stdin, settings)
        return r.passed and r.stdout.rstrip("\n") == expected.rstrip("\n")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        verdicts = list(pool.map(one, checks))
    return time.perf_counter() - t0, verdicts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checks", type=int, default=60, help="checks per round")
    ap.add_argument("--concurrency", type=int, default=2, help="checks in flight (and the service's max_concurrency)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    settings = SandboxSettings(wall_timeout_seconds=TIMEOUT)  # what the service applies to a run_timeout of 10 s
    check_sandbox_available(settings)
    client = load_client()
    checks = make_checks(args.checks)
    expected = [i % 5 != 4 for i in range(args.checks)]
    port = free_port()
    proc = start_service(port, args.concurrency)
    url = f"http://127.0.0.1:{port}/run_code"
    try:
        load_before = os.getloadavg()
        run_service(client, url, checks[:4], args.concurrency)  # warm both paths
        run_in_process(settings, checks[:4], args.concurrency)
        walls: dict[str, list[float]] = {"service": [], "in_process": []}
        for rnd in range(args.rounds):
            for name, fn in (("service", lambda: run_service(client, url, checks, args.concurrency)),
                             ("in_process", lambda: run_in_process(settings, checks, args.concurrency))):
                wall, verdicts = fn()
                assert [v is True for v in verdicts] == expected, f"round {rnd}: {name} verdicts differ: {verdicts}"
                walls[name].append(wall)
            print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in walls.items()), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    med = {k: statistics.median(v) for k, v in walls.items()}
    report = {
        "command": "python " + " ".join([os.path.relpath(__file__, Path.cwd())] + (argv if argv is not None else sys.argv[1:])),
        "checks": args.checks, "concurrency": args.concurrency, "rounds": args.rounds, "cpus": os.cpu_count(),
        "verl_client": VERL_VERSION, "platform": platform.platform(), "python": platform.python_version(),
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "wall_seconds": {k: [round(x, 3) for x in v] for k, v in walls.items()},
        "median_wall_seconds": {k: round(v, 3) for k, v in med.items()},
        "checks_per_second": {k: round(args.checks / v, 2) for k, v in med.items()},
        "ratio_service_over_in_process": round(med["service"] / med["in_process"], 3),
        "service_overhead_ms_per_check": round((med["service"] - med["in_process"]) / args.checks * 1000 * args.concurrency, 1),
    }
    for k in walls:
        print(f"{k:>11}: {report['checks_per_second'][k]:6.2f} checks/s  (median {med[k]:.2f}s for {args.checks} checks)")
    print(f"service / in-process wall time = {report['ratio_service_over_in_process']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
