"""The dedup engine's plan: its steps as typed records, in the order they run, and the driver that hands them out.

Every dedup runs this plan and nothing else: `dedup()` and `dedup_file()` in one process (tasks/dedup/pipeline.py:
each batch's steps one after the other, here) and the dedup flow on the workers (flows/dedup.py: each batch as
Prefect tasks, one per shard or per run of shards). A step reads and writes files of one work folder
(storage/dedup_work.py) and returns counts and paths only; the driver holds the plan and those records, never a
record's text, key, sketch or vector. S = `dedup.shards` record shards (fewer for fewer records); H = the records
of the persistent index when there is one:

    Split              (1)   the input file -> S record shards (ids, texts, scores), contiguous row ranges
    History            (1)   the index's records into the work folder: ids, texts, exact keys by bucket, sketches,
                             static and full-model vectors (with an index)
    Prep               (S)   normalise, exact keys (sorted into S exact buckets), MinHash sketches
    Exact              (S)   exact groups of bucket b (with the indexed records of that bucket)
    Collect            (S)   per record shard after a phase: its drops in record order, its alive mask
    Minhash            (1)   the indexed sketches, then those of the records alive: the shared arrays
    Bands              (S)   LSH candidates and exact Jaccard of band range i (tasks/dedup/shards.py)
    Hook, Apply        (S per round)  connected components of the pairs (tasks/dedup/graph.py)
    Route              (S)   every pair to the group shard of its component
    MinhashGroup       (S)   per group shard: representatives, drops
    Embed              (S)   static vectors of the shard's records alive
    Embedding          (1)   the indexed vectors, then those: the k-means ANN plan (or the exact search when small)
    Ann                (S)   the ANN search of query rows range i
    EmbeddingUncertain (S)   per group shard: the pairs the static model is unsure of
    Confirm            (1)   the full-model budget over them, in the order of one merged search
    EmbeddingGroup     (S)   confirmations, number guard, leader grouping
    Index              (1)   the kept records appended to the index (with an index)
    Write              (1)   kept.<fmt>, dropped.<fmt>, summary.json (with an output folder)

The decisions are those of the one-process rules (tasks/dedup/rules.py) over all records: sketches and static
vectors are functions of one text each; a bucket holds every record of its exact key and a group shard whole
components with their edges in one merged search's order, and the rules are applied to them renumbered in
record order (indexed records first), which keeps every tie-break. They depend on the settings (S included),
never on where the steps ran. A step whose marker exists is not run again (`distributed.run_step`).

`run_plan(job, settings, work, execute)` drives it: `execute(batch)` runs a batch of steps (all of one kind,
independent of each other) anywhere and returns their records in order.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Generator

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.dedup_work import DedupWork
from evolforge.tasks.core import progress as live_progress
from evolforge.tasks.dedup.graph import node_ranges
from evolforge.tasks.dedup.index import index_lock


@dataclass(frozen=True)
class Step:
    """One step of the plan: its kind and arguments (plain values, so a task can carry them as parameters)."""

    kind: ClassVar[str]

    def args(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def name(self) -> str:
        """The step's marker name: kind[-phase][/rNNN][/shard-NNNNN]."""
        return marker_name(self.kind, self.args())


def marker_name(kind: str, args: dict) -> str:
    return (kind + (f"-{args['phase']}" if "phase" in args else "") + (f"/r{args['round']:03d}" if "round" in args
            else "") + (f"/shard-{args['shard']:05d}" if "shard" in args else ""))


@dataclass(frozen=True)
class Split(Step):
    kind: ClassVar[str] = "split"
    input: str
    text_field: str
    id_field: str | None = None


@dataclass(frozen=True)
class History(Step):
    kind: ClassVar[str] = "history"
    index: str
    buckets: int


@dataclass(frozen=True)
class Prep(Step):
    kind: ClassVar[str] = "prep"
    shard: int
    bounds: list


@dataclass(frozen=True)
class Exact(Step):
    kind: ClassVar[str] = "exact"
    shard: int                 # the exact bucket
    bounds: list
    hist: int = 0


@dataclass(frozen=True)
class Collect(Step):
    kind: ClassVar[str] = "collect"
    shard: int
    phase: str
    bounds: list
    prev: str | None           # the phase before (None: every record alive before this one)
    senders: int               # exact buckets or group shards that wrote drops (0: the phase did not run)


@dataclass(frozen=True)
class Minhash(Step):
    kind: ClassVar[str] = "minhash"
    bounds: list
    hist: int = 0


@dataclass(frozen=True)
class Bands(Step):
    kind: ClassVar[str] = "bands"
    shard: int
    inputs: dict
    job: dict


@dataclass(frozen=True)
class Hook(Step):
    kind: ClassVar[str] = "hook"
    phase: str
    round: int
    shard: int                 # the edge part
    part: dict
    ranges: list


@dataclass(frozen=True)
class Apply(Step):
    kind: ClassVar[str] = "apply"
    phase: str
    round: int
    shard: int                 # the node range
    parts: int
    ranges: list


@dataclass(frozen=True)
class Route(Step):
    kind: ClassVar[str] = "route"
    phase: str
    round: int
    shard: int                 # the edge part
    part: dict
    ranges: list
    groups: int


@dataclass(frozen=True)
class MinhashGroup(Step):
    kind: ClassVar[str] = "minhash-group"
    shard: int
    bounds: list
    parts: int
    n_nodes: int
    counts: list               # records alive per record shard when the phase started
    inputs: dict
    hist: int = 0


@dataclass(frozen=True)
class Embed(Step):
    kind: ClassVar[str] = "embed"
    shard: int
    bounds: list
    alive_step: str


@dataclass(frozen=True)
class Embedding(Step):
    kind: ClassVar[str] = "embedding"
    bounds: list
    dim: int
    hist: int = 0


@dataclass(frozen=True)
class Ann(Step):
    kind: ClassVar[str] = "ann"
    shard: int
    inputs: dict
    job: dict


@dataclass(frozen=True)
class EmbeddingUncertain(Step):
    kind: ClassVar[str] = "embedding-uncertain"
    shard: int
    parts: int
    n_nodes: int


@dataclass(frozen=True)
class Confirm(Step):
    kind: ClassVar[str] = "confirm"
    bounds: list
    groups: int
    n_nodes: int
    alive_step: str
    counts: list
    hist: int = 0


@dataclass(frozen=True)
class EmbeddingGroup(Step):
    kind: ClassVar[str] = "embedding-group"
    shard: int
    bounds: list
    parts: int
    n_nodes: int
    alive_step: str
    counts: list
    inputs: dict
    hist: int = 0


@dataclass(frozen=True)
class Index(Step):
    kind: ClassVar[str] = "index"
    index: str
    source: dict | None        # the appended segment's tag (tasks/dedup/index.py `rollback_index`)
    bounds: list
    alive_step: str            # the last phase: its alive records are the kept ones
    embedded_step: str | None  # the phase before the embedding phase (None: no embedding phase)
    embedded_counts: list
    hist: int
    state: str                 # the index's state when History read it: a retried step appends once


@dataclass(frozen=True)
class Write(Step):
    kind: ClassVar[str] = "write"
    input: str
    text_field: str
    id_field: str | None
    out_dir: str
    drop_steps: list
    alive_step: str
    stats: dict


STEP_TYPES: dict[str, type[Step]] = {t.kind: t for t in (
    Split, History, Prep, Exact, Collect, Minhash, Bands, Hook, Apply, Route, MinhashGroup, Embed, Embedding, Ann,
    EmbeddingUncertain, Confirm, EmbeddingGroup, Index, Write)}


@dataclass
class StepEnv:
    """What a step runs with: the work folder, the settings, the encoders of the process that runs it
    (`encoder(kind, settings)`: tasks/dedup/embedding.py `encoder`, or what the one-process caller passes), and in
    one process a memo its steps share (the flow's steps may each run in another process: none)."""

    work: DedupWork
    s: DedupSettings
    encoder: Callable[[str, DedupSettings], Any]
    memo: dict | None = None   # what a run in one process keeps between its steps (the input table read by Split)


@dataclass(frozen=True)
class DedupJob:
    """One dedup: its records (an input file the Split step reads, or `records` = (n, bounds) the caller wrote
    into the work folder), the index it runs against and extends, and the output folder Write fills."""

    input: str | None = None
    text_field: str = "text"
    id_field: str | None = None
    records: tuple[int, list] | None = None
    index: str | None = None
    index_source: dict | None = None
    out: str | None = None


Execute = Callable[[list[Step]], list[dict]]


def run_plan(job: DedupJob, s: DedupSettings, work: DedupWork, execute: Execute, progress: bool = False,
             scheduled: Callable[[], dict] | None = None) -> dict:
    """Runs the plan's batches through `execute` (holding the index's lock throughout when there is an index).
    Returns the Write step's summary, or without an output folder {"stats", "bounds", "drop_steps",
    "alive_step"} for the caller to read the decisions from the work folder. `scheduled()` adds the scheduler's
    own figures to the stats (the flow: its Prefect task count) before they are written."""
    plan = _Plan(job, s, work, progress, scheduled)
    with index_lock(job.index, s) if job.index else contextlib.nullcontext():
        gen = plan.batches()
        results = None
        while True:
            try:
                batch = gen.send(results)
            except StopIteration as stop:
                return stop.value
            results = execute(batch)
            plan.records.extend(results)


class _Plan:
    def __init__(self, job: DedupJob, s: DedupSettings, work: DedupWork, progress: bool,
                 scheduled: Callable[[], dict] | None):
        self.job, self.s, self.work, self.scheduled = job, s, work, scheduled
        self.records: list[dict] = []
        self.stats: dict = {}
        self.phases = [m for m in ("exact", "minhash", "embedding") if getattr(s, m)] + (["index"] if job.index else [])
        self.bar = live_progress.StepProgress("dedup", len(self.phases), unit="steps") if progress else None
        self.started = time.perf_counter()

    def batches(self) -> Generator[list[Step], list[dict], dict]:
        job, s, st = self.job, self.s, self.stats
        if job.records is None:
            split = (yield [Split(job.input, job.text_field, job.id_field)])[0]
            n, bounds = split["n"], split["bounds"]
        else:
            n, bounds = job.records
        S = len(bounds)
        st.update(records=n, indexed_before=0, seconds={})
        if self.bar is not None:
            self.bar.update(detail=f"{n:,} records: {self.phases[0] if self.phases else 'nothing to do'}")
        H, state = 0, ""
        if job.index:
            h = (yield [History(job.index, S)])[0]
            H, state = h["records"], h["state"]
            st["indexed_before"] = H
        t = time.perf_counter()
        yield [Prep(k, bounds) for k in range(S)]
        if s.exact:
            yield [Exact(b, bounds, H) for b in range(S)]
        counts = yield from self._collect("exact", None, S if s.exact else 0, bounds)
        self._phase_done("exact", t, counts)
        drop_steps, alive = ["exact"], "exact"
        if s.minhash:
            t = time.perf_counter()
            counts = yield from self._minhash(bounds, counts, H)
            drop_steps.append("minhash")
            alive = "minhash"
            self._phase_done("minhash", t, counts)
        embedded = embedded_counts = None
        if s.embedding:
            t = time.perf_counter()
            embedded, embedded_counts = alive, counts
            counts = yield from self._embedding(bounds, counts, H, alive)
            drop_steps.append("embedding")
            alive = "embedding"
            self._phase_done("embedding", t, counts)
        st["kept"] = sum(counts)
        if job.index:
            t = time.perf_counter()
            yield [Index(job.index, job.index_source, bounds, alive, embedded, embedded_counts or [], H, state)]
            self._phase_done("index", t, counts, seconds_key="index_save")
        if self.bar is not None:
            self.bar.finish(detail=f"kept {st['kept']:,} of {n:,}")
        st.update(self._step_stats(), **(self.scheduled() if self.scheduled else {}))
        if job.out is None:
            return {"stats": st, "bounds": bounds, "drop_steps": drop_steps, "alive_step": alive}
        out = (yield [Write(job.input, job.text_field, job.id_field, job.out, drop_steps, alive, st)])[0]
        return out["summary"]

    def _minhash(self, bounds: list, counts: list, H: int):
        S, st = len(bounds), self.stats
        plan = (yield [Minhash(bounds, H)])[0]
        parts = yield [Bands(i, plan["inputs"], job) for i, job in enumerate(plan["jobs"])]
        n_parts = yield from self._components("minhash", [r["paths"] for r in parts], plan["records"], S)
        grouped = yield [MinhashGroup(g, bounds, n_parts, plan["records"], counts, plan["inputs"], H)
                         for g in range(S)]
        st.update(minhash_candidates=sum(r["candidates"] for r in parts),
                  minhash_verified_pairs=sum(r["pairs"] for r in grouped))
        return (yield from self._collect("minhash", "exact", S, bounds))

    def _embedding(self, bounds: list, counts: list, H: int, alive: str):
        S, st = len(bounds), self.stats
        enc = yield [Embed(k, bounds, alive) for k in range(S)]
        plan = (yield [Embedding(bounds, enc[0]["dim"], H)])[0]
        parts = plan.get("parts")
        if parts is None:
            parts = [r["paths"] for r in (yield [Ann(i, plan["inputs"], job) for i, job in enumerate(plan["jobs"])])]
        L = plan["records"]
        n_parts = yield from self._components("embedding", parts, L, S)
        yield [EmbeddingUncertain(g, n_parts, L) for g in range(S)]
        confirmed = (yield [Confirm(bounds, S, L, alive, counts, H)])[0]
        grouped = yield [EmbeddingGroup(g, bounds, n_parts, L, alive, counts, plan["inputs"], H) for g in range(S)]
        for key in ("embedding_candidates", "embedding_static_accepted", "embedding_uncertain",
                    "embedding_number_guarded"):
            st[key] = sum(r[key] for r in grouped)
        st.update(embedding_confirm_checked=confirmed["embedding_confirm_checked"],
                  embedding_confirmed=confirmed["embedding_confirmed"])
        return (yield from self._collect("embedding", alive, S, bounds))

    def _collect(self, phase: str, prev: str | None, senders: int, bounds: list):
        got = yield [Collect(k, phase, bounds, prev, senders) for k in range(len(bounds))]
        if senders:
            self.stats[f"dropped_{phase}"] = sum(r["dropped"] for r in got)
        return [r["alive"] for r in got]

    def _components(self, phase: str, parts: list[dict], n_nodes: int, groups: int):
        """Rounds of hook + apply until no label moves, then every edge routed to its group shard. With one part,
        its own components are the graph's: the labels are final after one round (a second would move none)."""
        ranges, r = [list(x) for x in node_ranges(n_nodes, groups)], 0
        while True:
            moved = yield [Hook(phase, r, e, part, ranges) for e, part in enumerate(parts)]
            if not sum(m["proposals"] for m in moved):
                break
            yield [Apply(phase, r, k, len(parts), ranges) for k in range(len(ranges))]
            r += 1
            if len(parts) == 1:
                break
        yield [Route(phase, r, e, part, ranges, groups) for e, part in enumerate(parts)]
        self.stats[f"{phase}_component_rounds"] = r + 1
        return len(parts)

    def _phase_done(self, name: str, started: float, counts: list, seconds_key: str | None = None) -> None:
        """The phase's wall seconds (stats `seconds`), and the progress bar moved past it."""
        self.stats["seconds"][seconds_key or name] = time.perf_counter() - started
        if self.bar is not None and name in self.phases:
            left = self.phases[self.phases.index(name) + 1:]
            self.bar.update(advance=1, detail=f"{name}: {self.stats.get('dropped_' + name, 0):,} dropped"
                            + (f"; next {left[0]} ({sum(counts):,} records left)" if left else ""))

    def _step_stats(self) -> dict:
        """summary.json `stats` entries from the step records: cost per step and worker, reuse, the work folder."""
        records, work = self.records, self.work
        workers: dict[str, float] = {}
        for r in records:
            workers[str(r["pid"])] = round(max(workers.get(str(r["pid"]), 0.0), r["peak_rss_mb"]), 1)
        files = work.files()
        per_top: dict[str, int] = {}
        for rel, _ in files:
            kind = DedupWork.kind_of(rel)
            per_top[kind] = per_top.get(kind, 0) + 1
        return {"shard_workers": workers, "steps": len(records) + (1 if self.job.out else 0),
                "shard_seconds": {kind: [round(r["seconds"], 3) for r in records if r["step"].startswith(step + "/")]
                                  for kind, step in (("minhash", "bands"), ("ann", "ann"))},
                "steps_reused": [r["step"] for r in records if r.get("reused")],
                "step_attempts": {r["step"]: r.get("attempts") or [r["pid"]] for r in records},
                "work_dir": work.location, "work_files": per_top, "work_bytes": sum(size for _, size in files),
                "worker_cpu_seconds": round(sum(r.get("cpu_seconds", 0.0) for r in records), 3),
                "steps_wall_seconds": round(time.perf_counter() - self.started, 3),
                "step_cost": {r["step"]: {"seconds": round(r["seconds"], 3), "cpu_seconds": round(r["cpu_seconds"], 3),
                                          "peak_rss_mb": round(r["peak_rss_mb"], 1)}
                              for r in records if "cpu_seconds" in r}}
