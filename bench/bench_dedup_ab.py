"""The dedup, this checkout against another commit, side by side in one run: one process, an index, the flow.

    flock /tmp/bench.lock .venv/bin/python bench/bench_dedup_ab.py --ref 466bc1f --n 100000 --repeat 3

Checks `--ref` out into a temporary git worktree (testing/ref_tree.py) and runs this file's child for each tree
in a fresh process, alternately (ref, this checkout, ref, ...), so both see the same machine load; the ref child
imports the ref tree's `evolforge` (a PYTHONPATH entry that shadows this venv's editable install) and calls only
what both trees have. Cases, on testing/near_dup_corpus.py's corpus (seed 0; written once as parquet):
  file      dedup_file() of n records, `dedup.shards` = 1 (the one-process path)
  file-s4   the same with `dedup.shards` = 4 (the shards one after the other in one process)
  index     dedup() of the second half against an index of the first half (as an evolve round against
            everything accepted before); timed: the second call
  rounds    10 dedup() calls of n / 100 records each against one growing index (an evolve run's rounds)
  flow-s4   the dedup flow, `dedup.shards` = 4, threads runner (2 workers), one standing Prefect server
Models are loaded (and the full model run once), and the MinHash permutations made (datasketch imported), before
the clock starts. Per run: wall and CPU seconds of the timed calls, records/s, the child's peak resident set (VmHWM,
MB: models and input included), and a digest of the decisions (kept ids, dropped rows with their reasons): the two
trees must decide the same. Writes bench/results/dedup_ab.json with every run, the median per tree and case, and the
load average before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ("file", "file-s4", "index", "rounds", "flow-s4")


def _digest(out: Path | None = None, kept=None, dropped=None) -> str:
    """The decisions: kept ids in order, dropped rows (id, duplicate_of, method, matched_id, detail, similarities)."""
    import polars as pl

    if out is not None:
        kept = pl.read_parquet(out / "kept.parquet")["id"].to_list()
        d = pl.read_parquet(out / "dropped.parquet")
        dropped = d.select("id", "dedup_duplicate_of", "dedup_method", "dedup_matched_id", "dedup_detail",
                           "dedup_similarity", "dedup_matched_similarity").rows()
    else:
        dropped = [(r["id"], r["duplicate_of"], r["method"], r["matched_id"], r["detail"], r["similarity"],
                    r["matched_similarity"]) for r in dropped]
    return hashlib.sha1(json.dumps([kept, dropped], default=float).encode()).hexdigest()[:16]


def _child(case: str, inp: str, work: Path) -> dict:
    import polars as pl

    from evolforge.config.sections.dedup import DedupSettings
    from evolforge.tasks.dedup.pipeline import _encoder, dedup, dedup_file

    s = DedupSettings(shards=4 if case.endswith("s4") else 1)
    _encoder("static", s)
    _encoder("full", s).encode(["warm up"])
    from evolforge.tasks.dedup.minhash import permutations

    permutations(s)   # datasketch imported (0.4 s) before the clock, in either tree (8144c87 defers it to first use)
    df = pl.read_parquet(inp)
    n = df.height
    out = work / f"out-{case}-{os.getpid()}"
    c0, t0 = time.process_time(), time.perf_counter()
    if case in ("file", "file-s4"):
        dedup_file(inp, "text", out, s, id_field="id")
        digest, records = _digest(out), n
    elif case == "index":
        texts, ids = df["text"].to_list(), df["id"].to_list()
        dedup(texts[: n // 2], ids[: n // 2], s, index_dir=out / "index")
        c0, t0 = time.process_time(), time.perf_counter()
        r = dedup(texts[n // 2:], ids[n // 2:], s, index_dir=out / "index")
        digest, records = _digest(kept=r.kept_ids, dropped=r.dropped), n - n // 2
    elif case == "rounds":
        texts, ids = df["text"].to_list(), df["id"].to_list()
        step, kept, dropped = max(1, n // 100), [], []
        for i in range(10):
            r = dedup(texts[i * step:(i + 1) * step], ids[i * step:(i + 1) * step], s, index_dir=out / "index",
                      index_source={"run": "bench", "source": "bench", "round": i + 1})
            kept += r.kept_ids
            dropped += r.dropped
        digest, records = _digest(kept=kept, dropped=dropped), 10 * step
    else:
        from evolforge.flows.dedup import DedupParams, dedup_flow

        dedup_flow(DedupParams(input=inp, text_field="text", id_field="id", out=str(out),
                               overrides={"dedup": {"shards": 4},
                                          "runner": {"kind": "threads", "max_workers": 2}}))
        digest, records = _digest(out), n
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"case": case, "records": records, "wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
            "records_per_s": round(records / wall, 1), "peak_rss_mb": _peak_rss_mb(), "decisions": digest}


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), MB."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmHWM:"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", help="the commit to compare with (e.g. the one before a refactor)")
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "dedup_ab.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a.child, a.input, Path(a.workdir))))
        return

    import polars as pl

    from evolforge.testing.near_dup_corpus import make_corpus
    from evolforge.testing.prefect_server import prefect_server
    from evolforge.testing.ref_tree import ref_tree

    work = Path(tempfile.mkdtemp(prefix="evolforge-dedup-ab-"))
    inp = work / "corpus.parquet"
    pl.DataFrame({"id": [f"r{i}" for i in range(a.n)], "text": make_corpus(a.n, seed=0).texts}).write_parquet(inp)
    head_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    result: dict = {"ref": a.ref, "head": head_rev, "n": a.n, "cpus": os.cpu_count(),
                    "load_avg_start": os.getloadavg(), "runs": []}
    (work / "server").mkdir()
    with ref_tree(a.ref, work) as (old_tree, shadow), prefect_server(work / "server") as (server_env, _):
        for i in range(a.repeat):
            for case in a.cases.split(","):
                for tree, path in (("ref", shadow), ("head", None)):
                    env = {**server_env, "PREFECT_LOGGING_LEVEL": "WARNING"}
                    env.pop("PYTHONPATH", None)
                    if path:
                        env["PYTHONPATH"] = path
                    load = os.getloadavg()
                    p = subprocess.run([sys.executable, __file__, "--child", case, "--input", str(inp), "--workdir",
                                        str(work)], env=env, capture_output=True, text=True, cwd=work)
                    if p.returncode:
                        raise SystemExit(f"{tree} {case} failed:\n{p.stderr[-4000:]}")
                    r = {**json.loads(p.stdout.strip().splitlines()[-1]), "tree": tree, "repeat": i,
                         "load_before": load, "load_after": os.getloadavg()}
                    result["runs"].append(r)
                    print(json.dumps(r), flush=True)
    runs = result["runs"]
    result["median"] = {case: {tree: {k: statistics.median(r[k] for r in runs if r["case"] == case and r["tree"] == tree)
                                      for k in ("wall_seconds", "cpu_seconds", "records_per_s", "peak_rss_mb")}
                               for tree in ("ref", "head")} for case in a.cases.split(",")}
    result["same_decisions"] = {case: len({r["decisions"] for r in runs if r["case"] == case}) == 1
                                for case in a.cases.split(",")}
    result["load_avg_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
