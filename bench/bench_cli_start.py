"""How long a command takes before it does anything: this tree against another commit's, side by side.

    .venv/bin/python bench/bench_cli_start.py --ref COMMIT [--repeat 7]   # bench/results/cli_start.json

Each case is the real console script (.venv/bin/evolforge, a fresh interpreter), timed from spawn to exit, output
discarded:
  help            evolforge --help
  run-help        evolforge run --help
  synth-help      evolforge synthesize --help
  user-error      evolforge run --seeds /nonexistent/seeds.jsonl --out TMP/x   (exit 2, one line)
The reference is the same script run by COMMIT's code: a temporary git worktree made importable as `evolforge` ahead
of this venv's editable install (a PYTHONPATH entry holding a symbolic link named evolforge, as
bench_orchestration_ab.py does), so both use the same interpreter and libraries. In every repeat each case runs once
per tree, alternating which goes first, so load from other work falls on both alike. Two floors are measured the same
way: `python -c pass` and `python -c "import pydantic"` (the stages' flags are built from pydantic models).
Each case runs in two modes:
  source      the environment as it is: with PYTHONDONTWRITEBYTECODE set (as on the machine this was written on, whose
              venv holds no __pycache__) every start compiles every module it imports from source
  bytecode    PYTHONDONTWRITEBYTECODE unset and PYTHONPYCACHEPREFIX a temporary folder, filled by one unmeasured
              run of every case per tree first: the .pyc files a pip install compiles (nothing is written into the
              repository or the venv)
Reported per mode, case and tree: median and min seconds; the ratio is reference median / this tree's median. The load
average (/proc/loadavg) is recorded before and after: on a busy machine every figure is inflated.
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

from evolforge.testing.ref_tree import ref_tree

ROOT = Path(__file__).resolve().parents[1]
EVOLFORGE = Path(sys.executable).parent / "evolforge"
GOALS = {"help": 0.3, "run-help": 0.3, "synth-help": 0.3, "user-error": 0.5}  # issue 41, seconds


def cases(tmp: Path) -> dict[str, list[str]]:
    return {"help": ["--help"], "run-help": ["run", "--help"], "synth-help": ["synthesize", "--help"],
            "user-error": ["run", "--seeds", "/nonexistent/seeds.jsonl", "--out", str(tmp / "x")]}


def timed(argv: list[str], pythonpath: str | None, expect: int, pycache: str | None = None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pycache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    took = time.perf_counter() - t0
    if r.returncode != expect:
        sys.exit(f"{argv} exited {r.returncode}, expected {expect}:\n{r.stderr[-2000:]}")
    return took


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="the commit to compare with (e.g. the one before the lazy start)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cli_start.json"))
    a = ap.parse_args()
    ref = subprocess.run(["git", "-C", str(ROOT), "rev-parse", a.ref], capture_output=True, text=True,
                         check=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="evolforge-cli-start-") as tmp:
        work = Path(tmp)
        with ref_tree(ref, work) as (_, shadow):
            trees = {"this": None, "ref": shadow}
            runs = {name: [[EVOLFORGE, *argv], 2 if name == "user-error" else 0] for name, argv in cases(work).items()}
            floors = {"python -c pass": [sys.executable, "-c", "pass"],
                      "python -c 'import pydantic'": [sys.executable, "-c", "import pydantic"]}
            modes = {"source": None, "bytecode": str(work / "pycache")}
            times = {m: {name: {t: [] for t in trees} for name in runs} for m in modes}
            floor_times = {m: {name: [] for name in floors} for m in modes}
            for name, (argv, expect) in runs.items():  # the bytecode mode's .pyc files, written once
                for t in trees:
                    timed([str(x) for x in argv], trees[t], expect, modes["bytecode"])
            for argv in floors.values():
                timed(argv, None, 0, modes["bytecode"])
            load_before = load()
            for i in range(a.repeat):
                order = list(trees) if i % 2 == 0 else list(reversed(trees))
                for m, pycache in modes.items():
                    for name, (argv, expect) in runs.items():
                        for t in order:
                            times[m][name][t].append(timed([str(x) for x in argv], trees[t], expect, pycache))
                    for name, argv in floors.items():
                        floor_times[m][name].append(timed(argv, None, 0, pycache))
            load_after = load()

    def stats(xs: list[float]) -> dict:
        return {"median_s": round(statistics.median(xs), 3), "min_s": round(min(xs), 3),
                "all_s": [round(x, 3) for x in xs]}

    result = {
        "this": head + (" (with uncommitted changes)" if dirty else ""), "ref": ref, "repeat": a.repeat,
        "cpus": os.cpu_count(), "load_before": load_before, "load_after": load_after,
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
        "modes": {m: {
            "cases": {name: {"argv": [str(x) for x in argv[1:]], "goal_s": GOALS[name],
                             "this": stats(times[m][name]["this"]), "ref": stats(times[m][name]["ref"]),
                             "ref_over_this": round(statistics.median(times[m][name]["ref"])
                                                    / statistics.median(times[m][name]["this"]), 2)}
                      for name, (argv, _) in runs.items()},
            "floors": {name: stats(xs) for name, xs in floor_times[m].items()}} for m in modes},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"load {load_before} -> {load_after}; {a.repeat} repeats; this {head[:8]} vs ref {ref[:8]}")
    for m, r in result["modes"].items():
        print(f" {m}:")
        for name, c in r["cases"].items():
            print(f"  {name:11s} this {c['this']['median_s']:.3f}s (min {c['this']['min_s']:.3f})  ref "
                  f"{c['ref']['median_s']:.3f}s (min {c['ref']['min_s']:.3f})  {c['ref_over_this']}x  "
                  f"goal {c['goal_s']}s")
        for name, f in r["floors"].items():
            print(f"  floor {name}: {f['median_s']:.3f}s (min {f['min_s']:.3f})")
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
