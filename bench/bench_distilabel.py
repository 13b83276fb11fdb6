"""Whole-command throughput: `evolforge run` against distilabel's EvolInstruct, side by side, same endpoint.

    flock /tmp/evolforge-bench.lock .venv/bin/python bench/bench_distilabel.py [--sizes 2000,10000] [--repeat 2]
        [--concurrency 50] [--ref COMMIT] [--out bench/results/distilabel.json]

With `--ref`, a third side runs the same command from another commit (testing/ref_tree.py), in the same
rotation: this checkout against its past and against distilabel in one run.

Both sides evolve every item once (one evolution per item), with no answers and no judge, against the same
testing/instant_server.py (answers at once, so the pipelines themselves are measured), and are timed from
spawning the command to its exit (start-up, reading the input and writing the output included):

  distilabel  distilabel 1.5.3 in its own virtualenv (testing/distilabel_env.py, built on first use):
              Pipeline(LoadDataFromDicts >> EvolInstruct(num_evolutions=1, store_evolutions=False,
              generate_answers=False, llm=OpenAILLM(base_url=instant server))), pipeline.run(use_cache=False);
              the items come from the same jsonl file; DISTILABEL_LOG_LEVEL=WARNING (its INFO log prints a
              line per HTTP request).
  evolforge   `evolforge run --rounds 1` with evol_instruct.answer = false, equal_check = false,
              dedup_each_round = false: one evolve call per item, plus the run's one pre-flight probe call.

Each evolforge run also reports where its time went, from its own ledger's timestamps: `to_first_call_s`
(process start to the pre-flight probe: imports, settings, the Prefect server, the flow run), `calls_s` (the
first to the last call's end) and `after_last_call_s` (the last call to the process's exit: the final datasets,
card, plots, summary, the flow run's end). `cpu_s` is the command's user + system CPU (its process tree).

Concurrency is the same on both sides: `--concurrency` calls in flight. distilabel's OpenAILLM sends a whole
input batch at once (asyncio.gather), so its input_batch_size (and the loader's batch_size) is the concurrency;
evolforge gets gateway.concurrency and evol_instruct.concurrency. Calls are counted at the endpoint (a counter
around the instant server's reply), per command. Sides alternate (the first side changes every repeat).

evolforge reports to the reused local Prefect server (runner.prefect_server = "reuse", the default) in a fresh
PREFECT_HOME: an unmeasured first command starts it, as a user's first command does once per machine; each side
also has one unmeasured 20-item run first (bytecode caches). The server is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolforge.testing.net import free_port, wait_up
from evolforge.testing.ref_tree import ref_tree

ROOT = Path(__file__).resolve().parents[1]

# The instant server with a call counter: SIGUSR1 writes the number of chat calls answered so far to COUNT_FILE.
COUNTING_SERVER = r"""
import asyncio, signal, sys
from evolforge.testing import instant_server as s
port, count_file = int(sys.argv[1]), sys.argv[2]
calls = [0]
_completion = s.completion
def completion(req, text):
    calls[0] += 1
    return _completion(req, text)
s.completion = completion
def dump():
    with open(count_file + ".tmp", "w") as f:
        f.write(str(calls[0]))
    import os; os.replace(count_file + ".tmp", count_file)
async def main():
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump)
    await s.main(port)
asyncio.run(main())
"""

# distilabel's side: run with the distilabel environment's interpreter.
DISTILABEL_SCRIPT = r"""
import json, sys
from distilabel.models.llms import OpenAILLM
from distilabel.pipeline import Pipeline
from distilabel.steps import LoadDataFromDicts
from distilabel.steps.tasks import EvolInstruct

seeds, base_url, concurrency, cache_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
data = [{"instruction": json.loads(line)["instruction"]} for line in open(seeds) if line.strip()]
with Pipeline(name="evolforge-bench", cache_dir=cache_dir) as pipeline:
    load = LoadDataFromDicts(data=data, batch_size=concurrency)
    evolve = EvolInstruct(
        llm=OpenAILLM(model="scripted", base_url=base_url, api_key="bench", max_retries=3,
                      generation_kwargs={"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 1024}),
        num_evolutions=1, store_evolutions=False, generate_answers=False, input_batch_size=concurrency)
    load >> evolve
if __name__ == "__main__":
    distiset = pipeline.run(use_cache=False)
    rows = distiset["default"]["train"]
    print(json.dumps({"rows": len(rows), "evolved": sum(1 for x in rows["evolved_instruction"] if x)}))
"""


class Counter:
    def __init__(self, proc: subprocess.Popen, path: Path):
        self.proc, self.path = proc, path

    def read(self) -> int:
        self.path.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.time() + 10
        while not self.path.exists():
            if time.time() > deadline:
                raise RuntimeError("the counting server did not report its count")
            time.sleep(0.01)
        return int(self.path.read_text())


def write_seeds(path: Path, n: int) -> None:
    path.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"List {i % 9 + 2} rivers of country {i}."})
                            + "\n" for i in range(n)))


def run_distilabel(python: str, script: Path, seeds: Path, base_url: str, concurrency: int, work: Path,
                   tag: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "PYTHONPATH")}
    env.update(DISTILABEL_LOG_LEVEL="WARNING", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    log = work / f"distilabel-{tag}.log"
    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run([python, str(script), str(seeds), base_url, str(concurrency), str(work / f"dl-cache-{tag}")],
                           env=env, stdout=subprocess.PIPE, stderr=f, text=True, cwd=work)
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"distilabel failed ({log}):\n{log.read_text()[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"wall_s": round(wall, 3), "rows": out["rows"], "evolved": out["evolved"]}


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_evolforge(seeds: Path, base_url: str, config: Path, home: Path, work: Path, tag: str,
                  pythonpath: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "OPENAI_API_KEY", "EVOLFORGE_API_KEY", "PYTHONPATH")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    if pythonpath:  # another commit's tree shadows this checkout's editable install
        env["PYTHONPATH"] = pythonpath
    out = work / f"evolforge-{tag}"
    log = work / f"evolforge-{tag}.log"
    cpu0 = _children_cpu()
    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run([str(ROOT / ".venv" / "bin" / "evolforge"), "run", "--seeds", str(seeds), "--out", str(out),
                            "--rounds", "1", "--base-url", base_url, "--config", str(config)],
                           env=env, stdout=f, stderr=subprocess.STDOUT, cwd=work)
    t1 = time.time()
    cpu = _children_cpu() - cpu0
    if r.returncode != 0:
        sys.exit(f"evolforge failed ({log}):\n{log.read_text()[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    rnd = summary["rounds"][0]
    calls = sorted((row["ts"], row["latency_s"]) for f in (out / "ledger").rglob("*.jsonl")
                   for line in f.read_bytes().splitlines() if line.strip() for row in [json.loads(line)])
    first = calls[0][0] - calls[0][1]  # ts is when a call ended
    last = max(ts for ts, _ in calls)
    return {"wall_s": round(t1 - t0, 3), "cpu_s": round(cpu, 2), "rows": rnd["attempts"], "evolved": rnd["accepted"],
            "to_first_call_s": round(first - t0, 2), "calls_s": round(last - first, 2),
            "after_last_call_s": round(t1 - last, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="2000,10000")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--ref", help="also run evolforge from this commit (side 'evolforge-ref'), in the same rotation")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "distilabel.json"))
    a = ap.parse_args()
    from evolforge.testing.distilabel_env import ensure_distilabel_env

    dl_env = ensure_distilabel_env()
    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="evolforge-bench-distilabel-"))
    script = work / "distilabel_evol.py"
    script.write_text(DISTILABEL_SCRIPT)
    config = work / "config.toml"
    config.write_text(f"[gateway]\nconcurrency = {a.concurrency}\n\n[evol_instruct]\nanswer = false\n"
                      f"equal_check = false\ndedup_each_round = false\nconcurrency = {a.concurrency}\n")
    home = work / "prefect-home"
    port = free_port()
    count_file = work / "calls.count"
    server = subprocess.Popen([sys.executable, "-c", COUNTING_SERVER, str(port), str(count_file)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}/v1"
    counter = Counter(server, count_file)
    sizes = [int(x) for x in a.sizes.split(",")]
    sides = ["distilabel", "evolforge"] + (["evolforge-ref"] if a.ref else [])
    runs: dict[int, dict[str, list[dict]]] = {n: {side: [] for side in sides} for n in sizes}
    head_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    with contextlib.ExitStack() as stack:
        ref_path = stack.enter_context(ref_tree(a.ref, work))[1] if a.ref else None
        try:
            wait_up(f"{base_url}/models")
            warm = work / "seeds-20.jsonl"
            write_seeds(warm, 20)
            run_evolforge(warm, base_url, config, home, work, "warmup")  # starts the reused Prefect server
            if ref_path:
                run_evolforge(warm, base_url, config, home, work, "warmup-ref", ref_path)
            run_distilabel(dl_env.python, script, warm, base_url, a.concurrency, work, "warmup")
            turn = 0
            for n in sizes:
                seeds = work / f"seeds-{n}.jsonl"
                write_seeds(seeds, n)
                for i in range(a.repeat):
                    order = sides[turn % len(sides):] + sides[:turn % len(sides)]  # the first side rotates
                    turn += 1
                    for side in order:
                        before = counter.read()
                        load = os.getloadavg()[0]
                        if side == "distilabel":
                            r = run_distilabel(dl_env.python, script, seeds, base_url, a.concurrency, work,
                                               f"{n}-{i}")
                        else:
                            r = run_evolforge(seeds, base_url, config, home, work, f"{n}-{i}-{side}",
                                              ref_path if side == "evolforge-ref" else None)
                        r.update(calls=counter.read() - before, items_per_s=round(n / r["wall_s"], 1),
                                 load_1m_at_start=round(load, 2))
                        runs[n][side].append(r)
                        print(json.dumps({"items": n, "side": side, "repeat": i, **r}), flush=True)
        finally:
            subprocess.run([sys.executable, "-m", "evolforge.cli", "server", "stop"],
                           env={**os.environ, "PREFECT_HOME": str(home)}, capture_output=True)
            server.terminate()
    table = []
    for n in sizes:
        med = {side: statistics.median(r["wall_s"] for r in v) for side, v in runs[n].items()}
        row = {"items": n, **{f"{side}_wall_s": round(s, 2) for side, s in med.items()},
               **{f"{side}_items_per_s": round(n / s, 1) for side, s in med.items()},
               **{f"{side}_calls": runs[n][side][0]["calls"] for side in med},
               "ratio_evolforge_over_distilabel": round(med["distilabel"] / med["evolforge"], 2)}
        for side in sides[1:]:
            for k in ("cpu_s", "to_first_call_s", "calls_s", "after_last_call_s"):
                row[f"{side}_{k}"] = round(statistics.median(r[k] for r in runs[n][side]), 2)
        if a.ref:
            row["ratio_ref_over_distilabel"] = round(med["distilabel"] / med["evolforge-ref"], 2)
        table.append(row)
    result = {"distilabel": dl_env.version, "head": head_rev, "ref": a.ref, "concurrency": a.concurrency,
              "repeat": a.repeat, "table": table, "runs": {str(n): v for n, v in runs.items()},
              "load_avg_start": load_start, "load_avg_end": os.getloadavg()}
    print(json.dumps(table, indent=2))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
