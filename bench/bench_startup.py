"""From `evolforge run` to its first model call: Prefect's temporary server against a reused local one.

    .venv/bin/python bench/bench_startup.py [--repeat 3] [--seeds 20] [--ref COMMIT]   # bench/results/startup.json

Each case runs the real command (a fresh interpreter) over 20 seeds, 1 round, against testing/instant_server.py
(answers at once), per-round dedup off: a user's first small run. Measured from just before the command is
spawned to the start of its first model call (the pre-flight probe) and of its first evolve call, both from the
run's cost ledger (each call's end time minus its latency), and the whole command. Each repeat uses a fresh
PREFECT_HOME whose database one unmeasured command has created first. Cases, in one run:
  ephemeral    runner.prefect_server = "ephemeral": Prefect starts a temporary server inside the command
  reuse-cold   "reuse" with no server yet: the command starts the background server and waits for it
  reuse-warm   "reuse" with the server a previous command left running
  ref-warm     (with --ref) the same as reuse-warm, run by another commit's code: a temporary git worktree made
               importable as `evolforge` ahead of this venv's editable install (as bench_orchestration_ab.py does),
               right after reuse-warm in every repeat, on the same running server
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

from evolforge.testing.net import free_port, wait_up

ROOT = Path(__file__).resolve().parents[1]


def first_calls(out: Path) -> tuple[float, float]:
    rows = [json.loads(x) for f in (out / "ledger").glob("*.jsonl") for x in f.read_text().splitlines() if x.strip()]
    starts = {r["stage"]: [] for r in rows}
    for r in rows:
        starts[r["stage"]].append(r["ts"] - (r["latency_s"] or 0))
    return min(min(v) for v in starts.values()), min(starts.get("evolve", [float("nan")]))


def one(case: str, home: Path, base_url: str, seeds: Path, config: Path, work: Path, i: int,
        pythonpath: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "OPENAI_API_KEY", "EVOLFORGE_API_KEY")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(PREFECT_HOME=str(home), EVOLFORGE__RUNNER__PREFECT_SERVER="ephemeral" if case == "ephemeral" else "reuse",
               PREFECT_SERVER_ANALYTICS_ENABLED="false")
    out = work / f"{case}-{i}"
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "evolforge.cli", "run", "--seeds", str(seeds), "--out", str(out),
                        "--rounds", "1", "--base-url", base_url, "--config", str(config)],
                       env=env, capture_output=True, text=True)
    total = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"{case} failed:\n{r.stderr[-3000:]}")
    first, first_evolve = first_calls(out)
    return {"first_call_s": round(first - t0, 3), "first_evolve_call_s": round(first_evolve - t0, 3),
            "command_s": round(total, 3)}


def stop(home: Path) -> None:
    env = {**os.environ, "PREFECT_HOME": str(home)}
    subprocess.run([sys.executable, "-m", "evolforge.cli", "server", "stop"], env=env, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--ref", help="also time reuse-warm with this commit's code (e.g. the one before a change)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evolforge-bench-startup-"))
    shadow = None
    if a.ref:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(work / "ref-tree"), a.ref],
                       check=True, capture_output=True)
        (work / "shadow").mkdir()
        (work / "shadow" / "evolforge").symlink_to(work / "ref-tree")
        shadow = str(work / "shadow")
    seeds = work / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"List {i + 2} rivers of country {i}."}) + "\n"
                             for i in range(a.seeds)))
    config = work / "config.toml"
    config.write_text("[evol_instruct]\ndedup_each_round = false\n")
    port = free_port()
    upstream = subprocess.Popen([sys.executable, str(ROOT / "testing" / "instant_server.py"), "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    runs: dict[str, list[dict]] = {"ephemeral": [], "reuse-cold": [], "reuse-warm": [], **({"ref-warm": []} if a.ref else {})}
    try:
        wait_up(f"{base_url}/models")
        for i in range(a.repeat):
            home = work / f"home-{i}"
            one("ephemeral", home, base_url, seeds, config, work, 100 + i)  # the Prefect database exists in every case
            runs["ephemeral"].append(one("ephemeral", home, base_url, seeds, config, work, i))
            runs["reuse-cold"].append(one("reuse-cold", home, base_url, seeds, config, work, i))
            runs["reuse-warm"].append(one("reuse-warm", home, base_url, seeds, config, work, i))
            if shadow:
                runs["ref-warm"].append(one("ref-warm", home, base_url, seeds, config, work, i, shadow))
            stop(home)
            print(json.dumps({k: v[-1] for k, v in runs.items()}), flush=True)
    finally:
        upstream.terminate()
        if a.ref:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "ref-tree")],
                           check=False, capture_output=True)
    result = {"seeds": a.seeds, "repeat": a.repeat, "ref": a.ref, "runs": runs,
              "median": {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()},
              "load_avg_end": os.getloadavg()}
    print(json.dumps(result["median"], indent=2))
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "startup.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
