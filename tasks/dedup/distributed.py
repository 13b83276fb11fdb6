"""The steps of the dedup engine (tasks/dedup/plan.py): each runs in any process, one worker or this one, and
exchanges files of the work folder (storage/dedup_work.py) only.

    run_step(kind, work, args, settings)   one step unless its marker says it finished; its record (counts,
                                           paths, the worker's pid, seconds, CPU seconds, peak memory, attempts)
    work_for(input, out, settings, index)  the flow's work folder of a dedup (a re-run finds its finished steps)
    write_records(work, ids, texts, ...)   records into S record shards (the Split step; `dedup()` from memory)
    decisions(work, ids, bounds, ...)      the kept ids and the dropped records with their reasons, in order

Here: Split, History, Prep, Minhash, Bands, Embed, Embedding, Ann, the components' Hook / Apply / Route
(tasks/dedup/graph.py), Index and Write; the grouping steps (Exact, the groups, Confirm, Collect) are in
tasks/dedup/group_steps.py. Still one task each, on a worker: `minhash` and `embedding` (they write the shared
arrays; `embedding` fits the k-means plan on `ann_kmeans_sample` vectors and assigns every vector), `confirm`
(the uncertain pairs and the budget), `history`, `index` and `write` (it reads the input again to write the
outputs).
"""

from __future__ import annotations

import hashlib
import os
import resource
import time

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage import dedup_memory as memory
from evolforge.storage.dedup_work import (
    SKETCH_ARRAYS,
    ArrayWriter,
    DedupWork,
    PackedStrings,
    load_array,
    load_arrays,
    load_named,
    member,
    release,
    save_array,
    save_arrays,
    save_grouped,
    save_strings,
)
from evolforge.tasks.dedup import embedding as emb
from evolforge.tasks.dedup import graph
from evolforge.tasks.dedup import group_steps as gs
from evolforge.tasks.dedup import minhash as mh
from evolforge.tasks.dedup import shards as sh
from evolforge.tasks.dedup.index import DedupIndex, index_state
from evolforge.tasks.dedup.normalize import exact_keys, normalize_many
from evolforge.tasks.dedup.plan import (
    STEP_TYPES,
    Ann,
    Apply,
    Bands,
    Embed,
    Embedding,
    History,
    Hook,
    Index,
    Minhash,
    Prep,
    Route,
    Split,
    StepEnv,
    Write,
)
from evolforge.tasks.dedup.rules import _blank_sketches


def settings_fingerprint(s: DedupSettings) -> str:
    return hashlib.sha1(s.model_dump_json(exclude={"shard_dir", "step_tasks"}).encode()).hexdigest()[:16]


def work_for(input_path: str, out_dir: str, s: DedupSettings, index: str | None = None) -> DedupWork:
    """The work folder of this dedup of this input into this output folder (against this index in its present
    state): under `dedup.shard_dir` (a folder every worker sees, or an fsspec URL), else the system temporary
    folder."""
    key = settings_fingerprint(s) + str(out_dir) + (f"|{index}|{index_state(index)}" if index else "")
    return DedupWork.for_input(DedupWork.base(s.shard_dir), input_path, key, s.shards)


def run_step(step: str, root: str, args: dict, s: DedupSettings, encoder=None, resumable: bool = True,
             memo: dict | None = None) -> dict:
    """Run one step (plan.py) unless its marker says it finished; its record (counts, paths, worker). `encoder`:
    the encoders to use (default: this process's, tasks/dedup/embedding.py `encoder`). Not `resumable` (a dedup
    in one process, in a fresh folder that nothing resumes): no markers are read or written, and the steps share
    `memo` (the input table is read once)."""
    typed = STEP_TYPES[step](**args)
    work = DedupWork(root)
    name = typed.name
    if resumable:
        done = work.done(name)
        if done is not None:
            return {**done, "reused": True}
        work.mark_started(name)
    t0, c0 = time.perf_counter(), time.process_time()
    with emb.one_thread_math():   # the same float32 bits in every worker, whatever its thread settings
        out = STEPS[step](StepEnv(work, s, encoder or emb.encoder, memo), typed)
    record = {**out, "step": name, "pid": os.getpid(), "seconds": time.perf_counter() - t0,
              "cpu_seconds": time.process_time() - c0, "peak_rss_mb": peak_rss_mb()}
    if not resumable:
        return record
    return work.mark_done(name, {**record, "attempts": work.attempts(name)})


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: its own address space; ru_maxrss would carry a big parent's peak
    over fork + exec, as a Dask nanny's worker inherits the driver's)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def record_bounds(n: int, shards: int) -> list[list[int]]:
    """The record shards' row ranges [a, b): `shards` contiguous ranges (fewer for fewer records; one empty one
    for none)."""
    return [list(r) for r in emb.row_ranges(n, shards)] or [[0, 0]]


def write_records(work: DedupWork, ids: list[str], texts: list[str], scores, shards: int) -> list[list[int]]:
    """The records into record shards (scores: keep="best"'s, None / NaN read as -inf; None without); the bounds."""
    bounds = record_bounds(len(ids), shards)
    sc = None if scores is None else np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf)
    for k, (a, b) in enumerate(bounds):
        work.save_records(k, ids[a:b], texts[a:b], None if sc is None else sc[a:b])
    return bounds


def _alive_rows(work: DedupWork, phase: str, shard: int) -> np.ndarray:
    """Record shard `shard`'s local rows alive after `phase`."""
    return np.flatnonzero(load_array(work.alive(phase, shard)))


def decisions(work: DedupWork, ids: list[str], bounds: list, drop_steps: list[str],
              alive_step: str) -> tuple[list[str], list[dict]]:
    """(the kept ids in record order, the dropped records with their reasons: phase by phase, in record order);
    `ids` name the records, the work folder's history the indexed ones."""
    kept = [ids[a + i] for k, (a, _) in enumerate(bounds) for i in _alive_rows(work, alive_step, k).tolist()]
    drops = [(phase, gs.read_drops(work, phase, k)) for phase in drop_steps for k in range(len(bounds))]
    # an indexed record (a negative row) is named from the history's ids, all of them in one take
    wanted = sorted({-row - 1 for _, c in drops for col in ("dup_row", "matched_row") for row in c[col] if row < 0})
    hist = dict(zip(wanted, PackedStrings(work.history, "ids").take(wanted))) if wanted else {}

    def name(row: int) -> str:
        return ids[row] if row >= 0 else hist[-row - 1]

    dropped = [{"id": ids[r], "duplicate_of": name(d), "method": phase, "similarity": sim, "matched_id": name(m),
                "matched_similarity": msim, "detail": detail}
               for phase, c in drops
               for r, d, m, sim, msim, detail in zip(c["row"], c["dup_row"], c["matched_row"], c["similarity"],
                                                     c["matched_similarity"], c["detail"])]
    return kept, dropped


# ----------------------------------------------------------------- the steps

def step_split(env: StepEnv, st: Split) -> dict:
    import polars as pl

    from evolforge.storage.datasets import read_any_table

    s = env.s
    df, fmt = read_any_table(st.input)
    if env.memo is not None:
        env.memo["input"] = (st.input, df, fmt)
    if st.text_field not in df.columns:
        raise ValueError(f"{st.input}: no column {st.text_field!r} (columns: {df.columns})")
    n = df.height
    ids = [str(x) for x in df[st.id_field].to_list()] if st.id_field else [str(i) for i in range(n)]
    if len(set(ids)) != n:
        raise ValueError("ids must be unique and one per text")
    texts = ["" if t is None else str(t) for t in df[st.text_field].to_list()]
    scores = df[s.score_field].cast(pl.Float64).to_list() if s.keep == "best" else None
    return {"n": n, "bounds": write_records(env.work, ids, texts, scores, s.shards), "fmt": fmt}


def step_history(env: StepEnv, st: History) -> dict:
    """The index's records (raises IndexMismatch when it was built with other settings)."""
    s, work = env.s, env.work
    static = env.encoder("static", s) if s.embedding else None
    data = DedupIndex(st.index, s, static.fingerprint if static else "").load(static.dim if static else 0)
    save_strings(work.history, "ids", data.ids)
    save_strings(work.history, "texts", data.texts)
    if s.exact:
        save_grouped(work.bucketed(None), {"rows": np.arange(len(data), dtype=np.int64), "keys": data.exact},
                     gs.exact_buckets(data.exact, st.buckets), st.buckets)
    if s.minhash:
        save_arrays(work.history, {name: getattr(data.sketches, name) for name in SKETCH_ARRAYS})
    rows = np.array(sorted(data.full), np.int64)
    save_arrays(work.history, {"static": data.static, "full_rows": rows,
                               "full_vecs": np.stack([data.full[int(r)] for r in rows]) if len(rows)
                               else np.zeros((0, 0), np.float32)})
    return {"records": len(data), "state": index_state(st.index)}


def step_prep(env: StepEnv, st: Prep) -> dict:
    s, work = env.s, env.work
    texts = work.record_texts(st.shard)
    norms = normalize_many(texts, s)
    keys = exact_keys(norms)
    d = work.prep(st.shard)
    save_arrays(d, {"keys": keys})
    if s.exact:  # the keys, rows and texts by exact bucket, for the exact step's buckets
        save_grouped(work.bucketed(st.shard), {"rows": np.arange(len(keys), dtype=np.int64) + st.bounds[st.shard][0],
                                               "keys": keys}, gs.exact_buckets(keys, len(st.bounds)), len(st.bounds),
                     strings={"norms": norms})
    if s.minhash:
        sk = mh.sketch_many(norms, s)   # transient: read once, by the Minhash step (and by Index: not transient then)
        save_arrays(d, {name: getattr(sk, name) for name in SKETCH_ARRAYS}, transient=True)
    return {"records": len(texts)}


def step_minhash(env: StepEnv, st: Minhash) -> dict:
    """The indexed sketches, then those of the records alive after exact in record order: the band shards'
    shared arrays."""
    s, work, H = env.s, env.work, st.hist
    rows = [_alive_rows(work, "exact", k) for k in range(len(st.bounds))]
    prep = [load_named(work.prep(k), *SKETCH_ARRAYS) for k in range(len(st.bounds))]
    hist = load_named(work.history, *SKETCH_ARRAYS) if H else None
    L = H + int(sum(len(r) for r in rows))
    sizes = ([np.diff(hist["offsets"])] if H else []) + [np.diff(p["offsets"])[r] for p, r in zip(prep, rows)]
    total = int(sum(int(z.sum()) for z in sizes))
    d = work.shared("minhash")
    if not H and len(st.bounds) == 1:
        own = _owned_sketches(work.prep(0), rows[0])
        if own is not None:   # one shard, no index, its sketches in memory: they become the shared arrays in place
            paths = save_arrays(d, {name: getattr(own, name) for name in SKETCH_ARRAYS} | {"is_new": np.ones(L, bool)},
                                transient=True)
            return {"records": L, "inputs": paths,
                    "jobs": [{"bands": list(b)} for b in sh.band_ranges(s.bands, s.shards)]}
    w = {"signatures": ArrayWriter(d, "signatures", (L, s.num_perm), np.uint32),
         "band_keys": ArrayWriter(d, "band_keys", (L, s.bands), np.uint64),
         "values": ArrayWriter(d, "values", (total,), np.uint64)}
    if H:
        for name in ("signatures", "band_keys"):
            w[name].append(hist[name])
        w["values"].append(hist["values"][: int(hist["offsets"][-1])])
    block = 1 << 14
    # array by array, shard by shard, a block of rows at a time: no whole-array temporary, and each shard's array
    # released (an in-memory folder's transient one dropped) as soon as it is copied
    for name in ("signatures", "band_keys", "values"):
        for k, (p, r) in enumerate(zip(prep, rows)):
            a = p.pop(name)
            if name != "values":
                for j in range(0, len(r), block):
                    w[name].append(a[r[j: j + block]])
            else:
                off = p["offsets"]
                keep = np.zeros(len(off) - 1, bool)
                keep[r] = True
                for j in range(0, len(keep), block):  # the shingles of the rows alive
                    b = min(j + block, len(keep))
                    if keep[j:b].any():
                        w[name].append(a[off[j]: off[b]][np.repeat(keep[j:b], np.diff(off[j: b + 1]))])
            del a
            release(member(work.prep(k), name))
    paths = {k: v.close() for k, v in w.items()}
    release(*(member(work.prep(k), "offsets") for k in range(len(st.bounds))))
    sizes = np.concatenate([np.zeros(0, np.int64)] + sizes)
    paths.update(save_arrays(d, {"offsets": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                                 "is_new": np.arange(L) >= H}))
    return {"records": L, "inputs": paths,
            "jobs": [{"bands": list(b)} for b in sh.band_ranges(s.bands, s.shards)]}


def _owned_sketches(prep, rows: np.ndarray) -> mh.Sketches | None:
    """A record shard's sketches, taken out of an in-memory folder (transient: this step is their one reader) and
    compacted in place to `rows`, without a second copy; None when they are files (or not all transient)."""
    taken = {name: memory.take(member(prep, name)) for name in SKETCH_ARRAYS}
    if any(a is None for a in taken.values()):
        for name, a in taken.items():   # put back as they were (cannot happen: all four are saved alike)
            if a is not None:
                save_array(member(prep, name), a, transient=True)
        return None
    sk = mh.Sketches(**taken)
    del taken
    sk.compact(rows, shrink=False)
    return sk


def _search_part(env: StepEnv, kind: str, step: str, part: int, inputs: dict, job: dict) -> dict[str, str]:
    """One part of a search on the memory-mapped shared arrays; the paths of its result."""
    return save_arrays(env.work.part(step, part), sh.run_shard(kind, load_arrays(inputs), job, env.s))


def step_bands(env: StepEnv, st: Bands) -> dict:
    paths = _search_part(env, "minhash", "bands", st.shard, st.inputs, st.job)
    return {"paths": paths, "candidates": int(load_array(paths["candidates"])[0])}


def step_embed(env: StepEnv, st: Embed) -> dict:
    r = _alive_rows(env.work, st.alive_step, st.shard)
    texts = env.work.record_strings(st.shard, "texts").take(r)
    E = env.encoder("static", env.s).encode(texts)
    # transient when the Embedding step copies it into the shared array (more than one record shard)
    save_array(env.work.vectors(st.shard), E, transient=len(st.bounds) > 1)
    return {"records": len(r), "dim": int(E.shape[1])}


def step_embedding(env: StepEnv, st: Embedding) -> dict:
    """The indexed vectors, then those of the records alive; the ANN plan and the search jobs (or the exact
    search)."""
    s, work, H = env.s, env.work, st.hist
    vec = ([load_named(work.history, "static")["static"]] if H else []) + \
        [load_array(work.vectors(k)) for k in range(len(st.bounds))]
    L = int(sum(len(v) for v in vec))
    d = work.shared("embedding")
    if not H and len(vec) == 1 and vec[0].dtype == np.float32 and vec[0].shape == (L, st.dim):
        inputs = {"E": str(work.vectors(0))}   # one record shard, no index: its vectors are the array, as they are
    else:
        w = ArrayWriter(d, "E", (L, st.dim), np.float32)
        for v in vec:
            w.append(v)
        inputs = {"E": w.close()}
        release(*(work.vectors(k) for k in range(len(st.bounds))))
    del vec
    E = load_array(inputs["E"])
    is_new = np.arange(L) >= H if H else None
    thr = s.static_candidate_cosine
    if L <= max(s.ann_exact_below, 2 * s.ann_cluster_size):
        p, sim = emb.exact_pairs(E, thr, is_new, max_neighbors=s.max_neighbors)
        return {"records": L, "inputs": inputs, "jobs": [], "parts": [save_arrays(d, {"pairs": p, "sims": sim})]}
    inputs.update(save_arrays(d, emb.ann_plan(E, s, is_new)))
    jobs = [{"rows": list(r), "threshold": thr} for r in emb.row_ranges(L, s.shards)]
    return {"records": L, "inputs": inputs, "jobs": jobs}


def step_ann(env: StepEnv, st: Ann) -> dict:
    return {"paths": _search_part(env, "ann", "ann", st.shard, st.inputs, st.job)}


def step_hook(env: StepEnv, st: Hook) -> dict:
    return {"proposals": graph.hook(env.work, st.phase, st.round, st.shard, st.part, st.ranges)}


def step_apply(env: StepEnv, st: Apply) -> dict:
    return {"changed": graph.apply(env.work, st.phase, st.round, st.shard, st.parts, st.ranges)}


def step_route(env: StepEnv, st: Route) -> dict:
    return {"edges": graph.route(env.work, st.phase, st.round, st.shard, st.part, st.ranges, st.groups)}


def step_index(env: StepEnv, st: Index) -> dict:
    """The kept records appended to the index: ids, texts, exact keys, sketches, static vectors and the full-model
    vectors the confirm step computed (for indexed records too), tagged with `source`."""
    s, work = env.s, env.work
    if index_state(st.index) != st.state:   # an earlier attempt of this step appended them (the flow holds the lock)
        return {"appended": 0}
    ids, texts, keys, sketches, vectors = [], [], [], [], []
    kept_rows = []
    for k, (a, _) in enumerate(st.bounds):
        r = _alive_rows(work, st.alive_step, k)
        kept_rows.append(r + a)
        ids += work.record_strings(k, "ids").take(r)
        texts += work.record_strings(k, "texts").take(r)
        keys.append(load_named(work.prep(k), "keys")["keys"][r])
        if s.minhash:
            sketches.append(mh.Sketches(**load_named(work.prep(k), *SKETCH_ARRAYS)).take(r))
        if s.embedding:
            vectors.append(load_array(work.vectors(k))[np.searchsorted(_alive_rows(work, st.embedded_step, k), r)])
    kept_rows = np.concatenate([np.zeros(0, np.int64)] + kept_rows)
    sk = mh.Sketches.concat(sketches, s) if s.minhash else _blank_sketches(len(ids), s)
    static = env.encoder("static", s) if s.embedding else None
    st_vecs = np.concatenate(vectors) if s.embedding else np.zeros((len(ids), 0), np.float32)
    DedupIndex(st.index, s, static.fingerprint if static else "").append(
        ids, texts, np.concatenate([np.zeros(0, np.uint64)] + keys), sk, st_vecs, _full_rows(env, st, kept_rows),
        st.source)
    return {"appended": len(ids)}


def _full_rows(env: StepEnv, st: Index, kept_rows: np.ndarray) -> dict[int, np.ndarray]:
    """The full-model vectors the confirm step computed, by their row in the index after the append: an indexed
    record keeps its row, a kept new record gets H + its position among the kept ones; others are left out."""
    if st.embedded_step is None or not env.s.confirm:
        return {}
    got = load_named(env.work.confirmed, "full_nodes", "full_vecs")
    nodes = np.asarray(got["full_nodes"], np.int64)
    if not len(nodes):
        return {}
    rows = gs.Records(env.work, st.bounds, env.s, st.hist).of_nodes(st.embedded_step, st.embedded_counts, nodes)
    position = {r: i for i, r in enumerate(kept_rows.tolist())}
    out = {}
    for i, (node, row) in enumerate(zip(nodes.tolist(), rows.tolist())):
        if node < st.hist:
            out[node] = np.asarray(got["full_vecs"][i])
        elif row in position:
            out[st.hist + position[row]] = np.asarray(got["full_vecs"][i])
    return out


def step_write(env: StepEnv, st: Write) -> dict:
    from evolforge.storage.datasets import read_any_table
    from evolforge.storage.dedup_sets import DedupOutLayout, write_outputs
    from evolforge.storage.fs import location

    read = (env.memo or {}).pop("input", None)
    df, fmt = read[1:] if read is not None and read[0] == st.input else read_any_table(st.input)
    ids = [str(x) for x in df[st.id_field].to_list()] if st.id_field else [str(i) for i in range(df.height)]
    kept, dropped = decisions(env.work, ids, record_bounds(len(ids), env.s.shards), st.drop_steps, st.alive_step)
    summary = write_outputs(df, fmt, location(st.input), st.text_field, ids, kept, dropped,
                            {**st.stats, "kept": len(kept)}, DedupOutLayout(st.out_dir))
    return {"kept": summary["kept"], "dropped": summary["dropped"], "summary": summary}


STEPS = {"split": step_split, "history": step_history, "prep": step_prep, "exact": gs.step_exact_bucket,
         "minhash": step_minhash, "bands": step_bands, "embed": step_embed, "embedding": step_embedding,
         "ann": step_ann, "hook": step_hook, "apply": step_apply, "route": step_route,
         "minhash-group": gs.step_minhash_group, "embedding-uncertain": gs.step_embedding_uncertain,
         "confirm": gs.step_confirm, "embedding-group": gs.step_embedding_group, "collect": gs.step_collect,
         "index": step_index, "write": step_write}
