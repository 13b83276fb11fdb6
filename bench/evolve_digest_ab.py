"""Behaviour unchanged: an evolve run against the scripted endpoint gives the same data in this checkout and in
another commit.

    .venv/bin/python bench/evolve_digest_ab.py --ref 42148e8

Starts one scripted OpenAI-compatible server (testing/scripted_server.py, this checkout's), then runs the same
`evolve` (the seeds below, 2 rounds, batch size 2) in a fresh process per tree, the `--ref` tree importable as
`evolforge` through a PYTHONPATH entry (testing/ref_tree.py). Each child prints a digest of what the run wrote:
the evolved rows and the lineage (instruction, output, status, operation, direction, round, elimination rule;
ids and parent links included: they are derived from content), and the counts of the summary. The two digests
must be equal; the rows are written to bench/results/evolve_digest_ab.json so a difference can be read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEEDS = [{"id": f"s{i}", "instruction": f"Compute {i} plus {i + 7} and explain the result number {i}."} for i in range(6)]
COLS = ("id", "parent_id", "seed_id", "round", "operation", "direction", "status", "elimination_rule")


def _child(base_url: str, work: Path) -> dict:
    import polars as pl

    from evolforge.flows.evolve import EvolveParams, evolve_flow
    from evolforge.storage.layout import RunLayout

    seeds = work / "seeds.jsonl"
    seeds.write_text("".join(json.dumps(r) + "\n" for r in SEEDS))
    out = work / f"out-{os.getpid()}"
    summary = evolve_flow(EvolveParams(seeds=str(seeds), out=str(out), rounds=2, base_url=base_url,
                                       overrides={"evol_instruct": {"batch_size": 2, "concurrency": 1},
                                                  "gateway": {"backoff_base_seconds": 0.0}}))
    lay = RunLayout(out)
    lineage = pl.read_parquet(lay.lineage)
    evolved = pl.read_parquet(lay.evolved)
    rows = {"lineage": sorted(json.dumps({k: r.get(k) for k in COLS}, sort_keys=True, default=str)
                              for r in lineage.to_dicts()),
            "evolved": sorted(json.dumps({k: r.get(k) for k in ("id", "instruction", "output", "status")},
                                         sort_keys=True, default=str) for r in evolved.to_dicts()),
            "counts": summary["counts"], "rounds": [{k: r.get(k) for k in ("attempts", "accepted")}
                                                    for r in summary["rounds"]]}
    return {"digest": hashlib.sha1(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16], "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "evolve_digest_ab.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a.child, Path(a.workdir))))
        return
    from evolforge.testing.ref_tree import ref_tree
    from evolforge.testing.scripted_server import ScriptedServer

    work = Path(tempfile.mkdtemp(prefix="evolforge-evolve-digest-"))
    result: dict = {"ref": a.ref, "head": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                                         capture_output=True, text=True).stdout.strip()}
    with ref_tree(a.ref, work) as (_, shadow), ScriptedServer() as server:
        for tree, path in (("ref", shadow), ("head", None)):
            env = {**os.environ, "PREFECT_HOME": tempfile.mkdtemp(prefix="evolforge-digest-prefect-"),
                   "PREFECT_LOGGING_LEVEL": "WARNING", "EVOLFORGE__RUNNER__PREFECT_SERVER": "ephemeral"}
            env.pop("PYTHONPATH", None)
            if path:
                env["PYTHONPATH"] = path
            p = subprocess.run([sys.executable, __file__, "--child", server.base_url, "--workdir", str(work)],
                               env=env, capture_output=True, text=True, cwd=work)
            if p.returncode:
                raise SystemExit(f"{tree} failed:\n{p.stderr[-4000:]}")
            result[tree] = json.loads(p.stdout.strip().splitlines()[-1])
    result["same"] = result["ref"]["digest"] == result["head"]["digest"]
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({"ref": result["ref"]["digest"], "head": result["head"]["digest"], "same": result["same"]}))
    raise SystemExit(0 if result["same"] else 1)


if __name__ == "__main__":
    main()
