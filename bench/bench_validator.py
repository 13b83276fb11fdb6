"""The synthesis validator at work: tasks kept, repairs per task and cost per task by phase, with an independent
validator and with the proposer validating its own tasks.

    .venv/bin/python bench/bench_validator.py --n 40                 # the scripted endpoint, both settings
    .venv/bin/python bench/bench_validator.py --embedded --n 6       # the embedded 135M model (one model: no split)

Scripted: one scripted OpenAI-compatible endpoint (testing/scripted_server.py) answers the proposer and the
validator by model name; its seeds are a mix of kinds whose fault only a repair fixes (BUGGY code, a WRONGANSWER
math task, a SPLITVOTE the solvers disagree on) or that no repair fixes (STUBBORN), a fifth plain. Prices are set
per model (proposer 0.1/0.2, validator 1.0/2.0 USD per million input/output tokens), so the cost by phase says who
was paid for what. The scripted figures measure the loop's plumbing (which model is asked what, what it costs, what
is kept), not a model's skill. Embedded: `evolforge synthesize` on the sample seeds with the embedded model, which is
then proposer, validator and solver at once (the run says so). Writes bench/results/validator.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROPOSER, VALIDATOR = "smollm2-135m-instruct", "scripted"
PRICED = {"overrides": {PROPOSER: {"input_per_mtok": 0.1, "output_per_mtok": 0.2},
                        VALIDATOR: {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}}
KINDS = [("plain", "write an adder function.", "code"), ("buggy", "BUGGY: write an adder function.", "code"),
         ("wrong", "WRONGANSWER: 3 boxes with 4 pears each, how many pears?", "math"),
         ("split", "SPLITVOTE: 3 bags of 4 plums, how many plums?", "math"),
         ("stubborn", "WRONGANSWER STUBBORN: 3 crates of 4 figs, how many?", "math")]
KEEP = ("proposed", "kept", "yield", "repairs_per_task", "usd_per_task_by_phase", "models", "rejections", "warning")


def _figures(summary: dict, wall: float) -> dict:
    return {**{k: summary.get(k) for k in KEEP}, "wall_seconds": round(wall, 2)}


def scripted(n: int, work: Path) -> dict:
    from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow
    from evolforge.testing.scripted_server import ScriptedServer

    seeds = work / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"{k}-{i}", "instruction": f"{text} (variant {i})", "domain": d}) + "\n"
                             for i in range(n // len(KINDS)) for k, text, d in KINDS))
    out: dict = {}
    for name, validator in (("independent validator", VALIDATOR), ("proposer validates", None)):
        with ScriptedServer() as server:
            t = time.perf_counter()
            summary = synthesize_flow(SynthesizeParams(
                seeds=str(seeds), out=str(work / name.replace(" ", "-")), base_url=server.base_url,
                validator=validator,
                overrides={"synthesis": {"batch_size": 10, "prune_jaccard": 1.0, "max_repairs": 2},
                           "pricing": PRICED}))
            out[name] = {**_figures(summary, time.perf_counter() - t), "calls": len(server.posts())}
    return out


def embedded(n: int, work: Path) -> dict:
    import subprocess
    import sys

    seeds = work / "seeds.jsonl"
    rows = [json.loads(x) for x in (ROOT / "config" / "sample_seeds.jsonl").read_text().splitlines() if x.strip()]
    seeds.write_text("".join(json.dumps(r) + "\n" for r in rows[:n]))
    out_dir = work / "embedded"
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "evolforge.cli", "synthesize", "--seeds", str(seeds), "--out",
                        str(out_dir)], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "EVOLFORGE__RUNNER__PREFECT_SERVER": "ephemeral"})
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"synthesize failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return {"embedded": _figures(json.loads((out_dir / "summary.json").read_text()), wall)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--embedded", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "validator.json")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evolforge-validator-"))
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect-home"))
    result = {"load_before": os.getloadavg(), "n": a.n}
    result.update(embedded(a.n, work) if a.embedded else scripted(a.n, work))
    result["load_after"] = os.getloadavg()
    old = json.loads(a.out.read_text()) if a.out.exists() else {}
    old["embedded" if a.embedded else "scripted"] = result
    a.out.write_text(json.dumps(old, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
