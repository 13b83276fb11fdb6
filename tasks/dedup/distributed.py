"""Dedup whose per-record work runs on the workers: steps that exchange files, a driver that holds the plan only.

The dedup flow with `dedup.shards` = S > 1 (and no persistent index) runs these steps as Prefect tasks on the
configured runner (flows/dedup.py); each reads and writes files of one work folder (storage/dedup_work.py) and
returns counts and paths only:

    split              (1 task)   the input -> S record shards (id, text, score), contiguous row ranges
    prep/shard-s       (S tasks)  normalise, exact keys, shingles and MinHash sketches of the shard's records
    exact              (1 task)   exact groups over all keys (records alive after it)
    minhash            (1 task)   the sketches of the records alive, concatenated into the shared arrays
    bands/shard-i      (S tasks)  LSH candidates and exact Jaccard of band range i (tasks/dedup/shards.py)
    minhash-group      (1 task)   the band shards' pairs merged, MinHash groups
    embed/shard-s      (S tasks)  static vectors of the shard's records alive
    embedding          (1 task)   the vectors concatenated; the k-means ANN plan (or the exact search when small)
    ann/shard-i        (S tasks)  the ANN search of query rows range i
    embedding-group    (1 task)   neighbours merged, full-model confirmation, number guard, leader grouping
    write              (1 task)   kept.<fmt>, dropped.<fmt>, summary.json

The decisions are those of `pipeline.dedup` in one process with the same settings (S included): every step
calls the same functions on the same arrays in the same order (sketches and static vectors are functions of
one text each, so computing them per shard changes nothing). A step whose marker exists is not run again: a
re-run over the same input and settings reuses the finished steps, and a step whose worker was killed is redone
alone. What is not distributed yet: the global steps (exact, the two groupings, the ANN plan) are one task
each, on a worker: their memory is O(records) on that worker (ids, keys, the alive mask, the pairs), not on
the driver.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.dedup_work import ArrayWriter, DedupWork, load_array, read_table, save_array, write_table
from evolforge.tasks.dedup import embedding as emb
from evolforge.tasks.dedup import minhash as mh
from evolforge.tasks.dedup import pipeline as pl_
from evolforge.tasks.dedup import shards as sh
from evolforge.tasks.dedup.index import empty_data
from evolforge.tasks.dedup.normalize import exact_groups, exact_keys, normalize_many
from evolforge.tasks.dedup.shard_tasks import peak_rss_mb, run_shard_files

_SKETCH = ("offsets", "values", "signatures", "band_keys")
_DROP_SCHEMA = pa.schema([("id", pa.string()), ("duplicate_of", pa.string()), ("method", pa.string()),
                          ("similarity", pa.float64()), ("matched_id", pa.string()),
                          ("matched_similarity", pa.float64()), ("detail", pa.string())])


def settings_fingerprint(s: DedupSettings) -> str:
    return hashlib.sha1(s.model_dump_json(exclude={"shard_dir"}).encode()).hexdigest()[:16]


def work_for(input_path: str, out_dir: str, s: DedupSettings) -> DedupWork:
    """The work folder of this dedup of this input into this output folder: under `dedup.shard_dir`, else the
    system temporary folder (a local folder every worker sees)."""
    base = Path(s.shard_dir) if s.shard_dir else Path(tempfile.gettempdir()) / "evolforge-dedup-work"
    return DedupWork.for_input(base, input_path, settings_fingerprint(s) + str(out_dir), s.shards)


def work_bytes(work: DedupWork) -> int:
    """Bytes of the work folder's files (what the shared store holds at the end of a run)."""
    return sum(f.stat().st_size for f in work.root.rglob("*") if f.is_file())


def remove_work(work: DedupWork) -> None:
    """The work folder, once the outputs are written."""
    shutil.rmtree(work.root, ignore_errors=True)


def run_step(step: str, root: str, args: dict, s: DedupSettings) -> dict:
    """Run one step (module docstring) unless its marker says it finished; its record (counts, paths, worker)."""
    work = DedupWork(root)
    name = step + (f"/shard-{args['shard']:05d}" if "shard" in args else "")
    done = work.done(name)
    if done is not None:
        return {**done, "reused": True}
    work.mark_started(name)
    t0, c0 = time.perf_counter(), time.process_time()
    out = STEPS[step](work, s, **args)
    record = {**out, "step": name, "pid": os.getpid(), "seconds": time.perf_counter() - t0,
              "cpu_seconds": time.process_time() - c0, "peak_rss_mb": peak_rss_mb()}
    return work.mark_done(name, record)


# ----------------------------------------------------------------- shared state of the global steps

def _ids_scores(work: DedupWork, n_shards: int, s: DedupSettings, texts: bool = False):
    tables = [read_table(work.records(k)) for k in range(n_shards)]
    ids = [x for t in tables for x in t.column("id").to_pylist()]
    sc = None
    if s.keep == "best":
        sc = np.nan_to_num(np.concatenate([t.column("score").to_numpy(zero_copy_only=False).astype(np.float64)
                                           for t in tables]), nan=-np.inf)
    txt = [x for t in tables for x in t.column("text").to_pylist()] if texts else []
    return ids, sc, txt


def _run_state(ids, sc, texts, alive, s: DedupSettings) -> pl_._Run:
    return pl_._Run(s=s, texts=texts, ids=ids, sc=sc, static=None, index=None, hist=empty_data(s), H=0,
                    alive=alive, steps=[], bar=None, stats={"seconds": {}})


def _save_drops(work: DedupWork, step: str, run: pl_._Run) -> str:
    cols = {f.name: [r[f.name] for r in run.dropped] for f in _DROP_SCHEMA}
    write_table(work.step(step) / "drops.parquet", pa.table(cols, schema=_DROP_SCHEMA))
    return save_array(work.step(step) / "alive.npy", run.alive)


def _alive(work: DedupWork, step: str) -> np.ndarray:
    return np.array(load_array(work.step(step) / "alive.npy"))


def _shard_rows(bounds: list[list[int]], alive: np.ndarray) -> list[np.ndarray]:
    """Per record shard: its local rows alive."""
    return [np.flatnonzero(alive[a:b]) for a, b in bounds]


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
    return {"n": n, "bounds": bounds, "fmt": fmt}


def step_prep(work: DedupWork, s: DedupSettings, shard: int) -> dict:
    texts = read_table(work.records(shard), ["text"]).column("text").to_pylist()
    norms = normalize_many(texts, s)
    d = work.step("prep") / f"shard-{shard:05d}"
    save_array(d / "keys.npy", exact_keys(norms))
    write_table(d / "norms.parquet", pa.table({"norm": pa.array(norms, pa.string())}))
    if s.minhash:
        sk = mh.sketch_many(norms, s)
        for name in _SKETCH:
            save_array(d / f"{name}.npy", getattr(sk, name))
    return {"records": len(texts)}


def step_exact(work: DedupWork, s: DedupSettings, bounds: list) -> dict:
    n_sh = len(bounds)
    ids, sc, _ = _ids_scores(work, n_sh, s)
    n = len(ids)
    run = _run_state(ids, sc, [], np.ones(n, bool), s)
    if s.exact:
        prep = [work.step("prep") / f"shard-{k:05d}" for k in range(n_sh)]
        keys = np.concatenate([np.zeros(0, np.uint64)] + [load_array(p / "keys.npy", mmap=False) for p in prep])
        norms = [x for p in prep for x in read_table(p / "norms.parquet").column("norm").to_pylist()]
        live = np.arange(n)
        first = exact_groups(keys, norms)
        own = np.flatnonzero(first != np.arange(n))
        p = np.stack([first[own], own], 1).astype(np.int64)
        g = pl_._groups(0, n, p, np.ones(len(p)), run.live_scores(live))
        run.record("exact", live, *g, np.ones(len(g[0])), ["normalized text"] * len(g[0]))
    _save_drops(work, "exact", run)
    return {"dropped": len(run.dropped), "alive": int(run.alive.sum())}


def step_minhash(work: DedupWork, s: DedupSettings, bounds: list) -> dict:
    """The sketches of the records alive after exact, in record order, as the shared arrays of the band shards."""
    rows = _shard_rows(bounds, _alive(work, "exact"))
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
    return {"paths": out["paths"]}


def step_minhash_group(work: DedupWork, s: DedupSettings, bounds: list, inputs: dict, parts: list) -> dict:
    ids, sc, _ = _ids_scores(work, len(bounds), s)
    run = _run_state(ids, sc, [], _alive(work, "exact"), s)
    live = np.flatnonzero(run.alive)
    L = len(live)
    p, sim, ncand = sh.merge_minhash([{k: load_array(v) for k, v in part.items()} for part in parts], L)
    g = pl_._groups(0, L, p, sim, run.live_scores(live))
    offsets, values = load_array(inputs["offsets"]), load_array(inputs["values"])
    rep_sim = mh.jaccard(offsets, values, np.stack([g[0], g[1]], 1)) if len(g[0]) else np.zeros(0)
    run.record("minhash", live, *g, rep_sim, ["jaccard"] * len(g[0]))
    _save_drops(work, "minhash-group", run)
    return {"dropped": len(run.dropped), "alive": int(run.alive.sum()), "minhash_candidates": ncand,
            "minhash_verified_pairs": len(p)}


def step_embed(work: DedupWork, s: DedupSettings, shard: int, bounds: list, alive_step: str) -> dict:
    a, b = bounds[shard]
    r = np.flatnonzero(_alive(work, alive_step)[a:b])
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
                "exact": {"pairs": save_array(d / "pairs.npy", p), "sims": save_array(d / "sims.npy", sim)}}
    plan = emb.ann_plan(E, s, None)
    inputs.update({k: save_array(d / f"{k}.npy", v) for k, v in plan.items()})
    jobs = [{"rows": list(r), "threshold": thr} for r in emb.row_ranges(L, s.shards)]
    return {"records": L, "inputs": inputs, "jobs": jobs}


def step_ann(work: DedupWork, s: DedupSettings, shard: int, inputs: dict, job: dict) -> dict:
    out = run_shard_files("ann", inputs, job, s, str(work.step("ann") / f"out-{shard:05d}"))
    return {"paths": out["paths"]}


def step_embedding_group(work: DedupWork, s: DedupSettings, bounds: list, alive_step: str, plan: dict,
                         parts: list) -> dict:
    ids, sc, texts = _ids_scores(work, len(bounds), s, texts=True)
    run = _run_state(ids, sc, texts, _alive(work, alive_step), s)
    live = np.flatnonzero(run.alive)
    E = load_array(plan["inputs"]["E"])
    if plan.get("exact"):
        p, sim = np.array(load_array(plan["exact"]["pairs"])), np.array(load_array(plan["exact"]["sims"]))
    else:
        p, sim = emb.merge_neighbors([{k: load_array(v) for k, v in part.items()} for part in parts], len(live))
    p, fsim, detail, _, counts = pl_._accept_edges(run, live, p, sim)
    g = pl_._embedding_groups(0, len(live), p, fsim, detail, s, run.live_scores(live))
    rep_sim = np.einsum("ij,ij->i", E[g[0]], E[g[1]]) if len(g[0]) else np.zeros(0)
    dt = pl_._edge_detail(p, detail, g[0], g[2], len(live))
    run.record("embedding", live, *g, rep_sim, dt)
    _save_drops(work, "embedding-group", run)
    return {"dropped": len(run.dropped), "alive": int(run.alive.sum()), **counts}


def step_write(work: DedupWork, s: DedupSettings, input: str, text_field: str, id_field: str | None,
               out_dir: str, drop_steps: list, alive_step: str, stats: dict) -> dict:
    from evolforge.storage.datasets import read_any_table
    from evolforge.storage.fs import location
    from evolforge.storage.layout import DedupOutLayout

    df, fmt = read_any_table(input)
    ids = [str(x) for x in df[id_field].to_list()] if id_field else [str(i) for i in range(df.height)]
    alive = _alive(work, alive_step)
    kept = [ids[i] for i in np.flatnonzero(alive).tolist()]
    dropped = [r for step in drop_steps for r in read_table(work.step(step) / "drops.parquet").to_pylist()]
    summary = pl_.write_outputs(df, fmt, location(input), text_field, ids, kept, dropped,
                                {**stats, "kept": len(kept)}, DedupOutLayout(out_dir))
    return {"kept": summary["kept"], "dropped": summary["dropped"], "summary": summary}


STEPS = {"split": step_split, "prep": step_prep, "exact": step_exact, "minhash": step_minhash,
         "bands": step_bands, "minhash-group": step_minhash_group, "embed": step_embed,
         "embedding": step_embedding, "ann": step_ann, "embedding-group": step_embedding_group,
         "write": step_write}
