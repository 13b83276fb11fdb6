"""Dedup whose per-record work runs on the workers: steps that exchange files, a driver that holds the plan only.

The dedup flow with `dedup.shards` = S > 1 (and no persistent index) runs these steps as Prefect tasks on the
configured runner (flows/dedup.py); each reads and writes files of one work folder (storage/dedup_work.py) and
returns counts and paths only:

    split              (1 task)   the input -> S record shards (id, text, score), contiguous row ranges
    prep/shard-s       (S tasks)  normalise, exact keys (sorted into S exact buckets), MinHash sketches
    exact/shard-b      (S tasks)  exact groups of bucket b (tasks/dedup/group_steps.py)
    collect-exact      (S tasks)  per record shard: its drops in record order, its alive mask
    minhash            (1 task)   the sketches of the records alive, concatenated into the shared arrays
    bands/shard-i      (S tasks)  LSH candidates and exact Jaccard of band range i (tasks/dedup/shards.py)
    hook, apply        (S tasks per round)  connected components of the pairs (tasks/dedup/graph.py)
    route              (S tasks)  every pair to the group shard of its component
    minhash-group      (S tasks)  per group shard: representatives, drops; then collect-minhash (S tasks)
    embed/shard-s      (S tasks)  static vectors of the shard's records alive
    embedding          (1 task)   the vectors concatenated; the k-means ANN plan (or the exact search when small)
    ann/shard-i        (S tasks)  the ANN search of query rows range i
    hook, apply, route            as above, over the neighbour pairs
    embedding-uncertain (S tasks) per group shard: the pairs the static model is unsure of
    confirm            (1 task)   the full-model budget over them, in the order of one merged search
    embedding-group    (S tasks)  confirmations, number guard, leader grouping; then collect-embedding (S tasks)
    write              (1 task)   kept.<fmt>, dropped.<fmt>, summary.json

The decisions are those of `pipeline.dedup` in one process with the same settings (S included): sketches and
static vectors are functions of one text each; a bucket holds every record of its exact key and a group shard
whole components with their edges in one merged search's order, and the one-process rules are applied to them
renumbered in record order, which keeps every tie-break. A step whose marker exists is not run again: a re-run
over the same input and settings reuses the finished steps, and a step whose worker was killed is redone alone.
Still one task each, on a worker: `minhash` and `embedding` (they write the shared arrays; `embedding` fits the
k-means plan on `ann_kmeans_sample` vectors and assigns every vector), `confirm` (the uncertain pairs and the
budget) and `write` (it reads the input again to write the outputs).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.dedup_work import (
    ArrayWriter,
    DedupWork,
    load_array,
    read_table,
    save_array,
    save_grouped,
    save_strings,
    write_table,
)
from evolforge.tasks.dedup import embedding as emb
from evolforge.tasks.dedup import graph
from evolforge.tasks.dedup import group_steps as gs
from evolforge.tasks.dedup import minhash as mh
from evolforge.tasks.dedup import pipeline as pl_
from evolforge.tasks.dedup import shards as sh
from evolforge.tasks.dedup.normalize import exact_keys, normalize_many
from evolforge.tasks.dedup.shard_tasks import peak_rss_mb, run_shard_files

_SKETCH = ("offsets", "values", "signatures", "band_keys")

def settings_fingerprint(s: DedupSettings) -> str:
    return hashlib.sha1(s.model_dump_json(exclude={"shard_dir", "step_tasks"}).encode()).hexdigest()[:16]


def work_for(input_path: str, out_dir: str, s: DedupSettings) -> DedupWork:
    """The work folder of this dedup of this input into this output folder: under `dedup.shard_dir` (a folder
    every worker sees, or an fsspec URL), else the system temporary folder."""
    base = s.shard_dir or str(Path(tempfile.gettempdir()) / "evolforge-dedup-work")
    return DedupWork.for_input(base, input_path, settings_fingerprint(s) + str(out_dir), s.shards)


def work_bytes(work: DedupWork) -> int:
    """Bytes of the work folder's files (what the shared store holds at the end of a run)."""
    return sum(size for _, size in work.files())


def work_files(work: DedupWork) -> dict[str, int]:
    """Files in the work folder per top-level step folder (the 100M simulation checks none grows with records)."""
    out: dict[str, int] = {}
    for rel, _ in work.files():
        top = rel.split("/", 1)[0]
        out[top] = out.get(top, 0) + 1
    return out


def remove_work(work: DedupWork) -> None:
    """The work folder, once the outputs are written."""
    work.remove()


def run_step(step: str, root: str, args: dict, s: DedupSettings) -> dict:
    """Run one step (module docstring) unless its marker says it finished; its record (counts, paths, worker)."""
    work = DedupWork(root)
    name = step + (f"-{args['phase']}" if "phase" in args else "") + (f"/r{args['round']:03d}" if "round" in args else "") \
        + (f"/shard-{args['shard']:05d}" if "shard" in args else "")
    done = work.done(name)
    if done is not None:
        return {**done, "reused": True}
    work.mark_started(name)
    t0, c0 = time.perf_counter(), time.process_time()
    with emb.one_thread_math():   # the same float32 bits in every worker, whatever its thread settings
        out = STEPS[step](work, s, **args)
    record = {**out, "step": name, "pid": os.getpid(), "seconds": time.perf_counter() - t0,
              "cpu_seconds": time.process_time() - c0, "peak_rss_mb": peak_rss_mb(), "attempts": work.attempts(name)}
    return work.mark_done(name, record)


# ----------------------------------------------------------------- alive masks

def _alive_rows(work: DedupWork, phase: str, shard: int) -> np.ndarray:
    """Record shard `shard`'s local rows alive after `phase`."""
    return np.flatnonzero(load_array(work.alive(phase, shard)))


# ----------------------------------------------------------------- the steps

def step_split(work: DedupWork, s: DedupSettings, input: str, text_field: str, id_field: str | None) -> dict:
    import polars as pl

    from evolforge.storage.datasets import read_any_table

    df, fmt = read_any_table(input)
    if text_field not in df.columns:
        raise ValueError(f"{input}: no column {text_field!r} (columns: {df.columns})")
    n = df.height
    ids = [str(x) for x in df[id_field].to_list()] if id_field else [str(i) for i in range(n)]
    if len(set(ids)) != n:
        raise ValueError("ids must be unique and one per text")
    texts = ["" if t is None else str(t) for t in df[text_field].to_list()]
    scores = df[s.score_field].cast(pl.Float64).to_list() if s.keep == "best" else None
    bounds = [list(r) for r in emb.row_ranges(n, s.shards)] or [[0, 0]]
    for k, (a, b) in enumerate(bounds):
        cols = {"id": pa.array(ids[a:b], pa.string()), "text": pa.array(texts[a:b], pa.string())}
        if scores is not None:
            cols["score"] = pa.array(scores[a:b], pa.float64())
        write_table(work.records(k), pa.table(cols))
        save_strings(work.record_arrays(k), "texts", texts[a:b])
        if scores is not None:
            sc = np.array([np.nan if x is None else x for x in scores[a:b]], np.float64)
            save_array(work.record_arrays(k) / "scores.npy", np.nan_to_num(sc, nan=-np.inf))
    return {"n": n, "bounds": bounds, "fmt": fmt}


def step_prep(work: DedupWork, s: DedupSettings, shard: int, bounds: list) -> dict:
    texts = read_table(work.records(shard), ["text"]).column("text").to_pylist()
    norms = normalize_many(texts, s)
    d = work.step("prep") / f"shard-{shard:05d}"
    keys = exact_keys(norms)
    if s.exact:  # the keys, rows and texts by exact bucket, for the exact step's buckets
        bucket = gs.exact_buckets(keys, len(bounds))
        order = np.argsort(bucket, kind="stable")
        save_grouped(d / "bucketed", {"rows": np.arange(len(keys), dtype=np.int64) + bounds[shard][0],
                                      "keys": keys}, bucket, len(bounds))
        save_strings(d / "bucketed", "norms", [norms[i] for i in order.tolist()])
    if s.minhash:
        sk = mh.sketch_many(norms, s)
        for name in _SKETCH:
            save_array(d / f"{name}.npy", getattr(sk, name))
    return {"records": len(texts)}


def step_minhash(work: DedupWork, s: DedupSettings, bounds: list) -> dict:
    """The sketches of the records alive after exact, in record order, as the shared arrays of the band shards."""
    rows = [_alive_rows(work, "exact", k) for k in range(len(bounds))]
    prep = [work.step("prep") / f"shard-{k:05d}" for k in range(len(bounds))]
    L = int(sum(len(r) for r in rows))
    sizes = [np.diff(load_array(p / "offsets.npy"))[r] for p, r in zip(prep, rows)]
    total = int(sum(int(z.sum()) for z in sizes))
    d = work.step("minhash")
    w = {"signatures": ArrayWriter(d / "signatures.npy", (L, s.num_perm), np.uint32),
         "band_keys": ArrayWriter(d / "band_keys.npy", (L, s.bands), np.uint64),
         "values": ArrayWriter(d / "values.npy", (total,), np.uint64)}
    block = 1 << 14
    for p, r in zip(prep, rows):
        off = load_array(p / "offsets.npy")
        w["signatures"].append(load_array(p / "signatures.npy")[r])
        w["band_keys"].append(load_array(p / "band_keys.npy")[r])
        vals = load_array(p / "values.npy")
        keep = np.zeros(len(off) - 1, bool)
        keep[r] = True
        for a in range(0, len(keep), block):  # the shingles of the rows alive, a block of rows at a time
            b = min(a + block, len(keep))
            if keep[a:b].any():
                w["values"].append(vals[off[a]: off[b]][np.repeat(keep[a:b], np.diff(off[a: b + 1]))])
    paths = {k: v.close() for k, v in w.items()}
    sizes = np.concatenate([np.zeros(0, np.int64)] + sizes)
    paths["offsets"] = save_array(d / "offsets.npy", np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
    paths["is_new"] = save_array(d / "is_new.npy", np.ones(L, bool))
    return {"records": L, "inputs": paths,
            "jobs": [{"bands": list(b)} for b in sh.band_ranges(s.bands, s.shards)]}


def step_bands(work: DedupWork, s: DedupSettings, shard: int, inputs: dict, job: dict) -> dict:
    out = run_shard_files("minhash", inputs, job, s, str(work.step("bands") / f"out-{shard:05d}"))
    return {"paths": out["paths"], "candidates": int(load_array(out["paths"]["candidates"])[0])}


def step_embed(work: DedupWork, s: DedupSettings, shard: int, bounds: list, alive_step: str) -> dict:
    r = _alive_rows(work, alive_step, shard)
    texts = read_table(work.records(shard), ["text"]).column("text").to_pylist()
    E = pl_._encoder("static", s).encode([texts[i] for i in r.tolist()])
    save_array(work.step("embed") / f"shard-{shard:05d}" / "vectors.npy", E)
    return {"records": len(r), "dim": int(E.shape[1])}


def step_embedding(work: DedupWork, s: DedupSettings, bounds: list, dim: int) -> dict:
    """The vectors of the records alive, concatenated; the ANN plan and the search jobs (or the exact search)."""
    vec = [load_array(work.step("embed") / f"shard-{k:05d}" / "vectors.npy") for k in range(len(bounds))]
    L = int(sum(len(v) for v in vec))
    d = work.step("embedding")
    w = ArrayWriter(d / "E.npy", (L, dim), np.float32)
    for v in vec:
        w.append(v)
    inputs = {"E": w.close()}
    E = load_array(inputs["E"])
    thr = s.static_candidate_cosine
    if L <= max(s.ann_exact_below, 2 * s.ann_cluster_size):
        p, sim = emb.exact_pairs(E, thr, None, max_neighbors=s.max_neighbors)
        return {"records": L, "inputs": inputs, "jobs": [],
                "parts": [{"pairs": save_array(d / "pairs.npy", p), "sims": save_array(d / "sims.npy", sim)}]}
    plan = emb.ann_plan(E, s, None)
    inputs.update({k: save_array(d / f"{k}.npy", v) for k, v in plan.items()})
    jobs = [{"rows": list(r), "threshold": thr} for r in emb.row_ranges(L, s.shards)]
    return {"records": L, "inputs": inputs, "jobs": jobs}


def step_ann(work: DedupWork, s: DedupSettings, shard: int, inputs: dict, job: dict) -> dict:
    out = run_shard_files("ann", inputs, job, s, str(work.step("ann") / f"out-{shard:05d}"))
    return {"paths": out["paths"]}


def step_hook(work: DedupWork, s: DedupSettings, phase: str, round: int, shard: int, part: dict,
              ranges: list) -> dict:
    return {"proposals": graph.hook(work, phase, round, shard, part, ranges)}


def step_apply(work: DedupWork, s: DedupSettings, phase: str, round: int, shard: int, parts: int,
               ranges: list) -> dict:
    return {"changed": graph.apply(work, phase, round, shard, parts, ranges)}


def step_route(work: DedupWork, s: DedupSettings, phase: str, round: int, shard: int, part: dict,
               ranges: list, groups: int) -> dict:
    return {"edges": graph.route(work, phase, round, shard, part, ranges, groups)}


def step_write(work: DedupWork, s: DedupSettings, input: str, text_field: str, id_field: str | None,
               out_dir: str, drop_steps: list, alive_step: str, stats: dict) -> dict:
    from evolforge.storage.datasets import read_any_table
    from evolforge.storage.dedup_sets import DedupOutLayout
    from evolforge.storage.fs import location

    df, fmt = read_any_table(input)
    ids = [str(x) for x in df[id_field].to_list()] if id_field else [str(i) for i in range(df.height)]
    bounds = [list(r) for r in emb.row_ranges(len(ids), s.shards)] or [[0, 0]]
    kept = [ids[a + i] for k, (a, _) in enumerate(bounds) for i in _alive_rows(work, alive_step, k).tolist()]
    dropped = []
    for phase in drop_steps:
        for k in range(len(bounds)):
            t = read_table(work.drops(phase, k))
            dropped.extend({"id": ids[r["row"]], "duplicate_of": ids[r["dup_row"]], "method": r["method"],
                            "similarity": r["similarity"], "matched_id": ids[r["matched_row"]],
                            "matched_similarity": r["matched_similarity"], "detail": r["detail"]}
                           for r in t.to_pylist())
    summary = pl_.write_outputs(df, fmt, location(input), text_field, ids, kept, dropped,
                                {**stats, "kept": len(kept)}, DedupOutLayout(out_dir))
    return {"kept": summary["kept"], "dropped": summary["dropped"], "summary": summary}


STEPS = {"split": step_split, "prep": step_prep, "exact": gs.step_exact_bucket, "minhash": step_minhash,
         "bands": step_bands, "embed": step_embed, "embedding": step_embedding, "ann": step_ann,
         "hook": step_hook, "apply": step_apply, "route": step_route, "minhash-group": gs.step_minhash_group,
         "embedding-uncertain": gs.step_embedding_uncertain, "confirm": gs.step_confirm,
         "embedding-group": gs.step_embedding_group, "collect": gs.step_collect, "write": step_write}
