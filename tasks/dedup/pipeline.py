"""Deduplicate texts or a file in this process: exact -> MinHash+LSH -> embeddings, optionally against a
persistent index.

`dedup(texts, ids, settings, index_dir)` returns the kept ids and one row per dropped record saying why:
`duplicate_of` (the kept representative of its group), `method` (exact | minhash | embedding), `similarity` (to
that representative: 1.0, exact Jaccard, or static-model cosine), `matched_id` and `matched_similarity` (the
strongest verified edge that linked it; Jaccard, or the static cosine, or the full-model cosine when `detail` is
"full"). `dedup_file(path, text_field, out_dir, settings)` does the same for a jsonl / parquet / csv file and
writes OUT/kept.<fmt>, OUT/dropped.<fmt> and OUT/summary.json.

Both run the dedup engine (tasks/dedup/plan.py) here: its steps one after the other, in a fresh local work folder
that is removed when they return, with `dedup.shards` record shards. They are the steps, files and decisions of
the dedup flow on the workers (flows/dedup.py); only the scheduling differs. Each method groups the records still
alive by connected components of its verified pairs and keeps one per group (the rules: tasks/dedup/rules.py);
a group with an indexed record keeps that. The embedding method's weak edges do not chain unless
`dedup.embedding_grouping` is "components".

The rules are importable from here too (`components`, `_groups`, `leaders`, ...), and `_encoder(kind, settings)`
is the encoder every step of a dedup in this process uses (tests give it stand-ins).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.dedup_work import DedupWork
from evolforge.tasks.dedup import embedding as emb
from evolforge.tasks.dedup.distributed import decisions, run_step, write_records
from evolforge.tasks.dedup.plan import DedupJob, Step, run_plan
from evolforge.tasks.dedup.rules import (
    _confirm,
    _edge_detail,
    _embedding_groups,
    _groups,
    _leader_groups,
    components,
    leaders,
    numbers_substituted,
)

__all__ = ["DedupResult", "_confirm", "_edge_detail", "_embedding_groups", "_encoder", "_groups", "_leader_groups",
           "components", "dedup", "dedup_file", "leaders", "numbers_substituted"]

_encoder = emb.encoder


@dataclass
class DedupResult:
    kept_ids: list[str]
    dropped: list[dict]                       # id, duplicate_of, method, similarity, matched_id, matched_similarity, detail
    stats: dict = field(default_factory=dict)


def _here(work: DedupWork, s: DedupSettings):
    """The plan's executor in this process: each step in turn, with this module's `_encoder`, without markers (the
    folder is this call's own and removed when it returns), sharing one memo (the input table is read once)."""
    memo: dict = {}

    def execute(batch: list[Step]) -> list[dict]:
        return [run_step(step.kind, work.location, step.args(), s, encoder=_encoder, resumable=False, memo=memo)
                for step in batch]
    return execute


@emb.one_thread_math()   # decisions must not depend on the thread count (tasks/dedup/embedding.py)
def dedup(texts: Sequence[str] | Sequence[Mapping], ids: Sequence[str] | None = None, settings: DedupSettings | None = None,
          index_dir: str | Path | None = None, scores: Sequence[float] | None = None, text_field: str = "text",
          index_source: Mapping | None = None, progress: bool = False) -> DedupResult:
    """Deduplicate `texts` (strings, or records whose `text_field` holds the text) in input order,
    and against the index in `index_dir` (created if missing), which then receives the kept records.
    `ids` default to "0", "1", ...; `scores` are needed for keep="best".

    With an index, the whole call (load, dedup, append) holds the index lock (`index.index_lock`), so
    flows sharing the index take turns; `index_source` ({"run", "source", "round"}) tags the appended
    segment for `index.rollback_index`. With `progress`, each finished method is published as a "dedup"
    progress (tasks/core/progress.py: the CLI's progress bar)."""
    s = settings or DedupSettings()
    texts, ids, sc = _inputs(texts, ids, s, scores, text_field)
    if index_dir is not None and s.embedding:
        _encoder("static", s)  # load (or build) the model before taking the lock: others need not wait for it
    work = DedupWork.fresh(s.shard_dir, transient=index_dir is None)  # no Index step: see dedup_memory
    try:
        bounds = write_records(work, ids, texts, sc, s.shards)
        job = DedupJob(records=(len(ids), bounds), index=None if index_dir is None else str(index_dir),
                       index_source=None if index_source is None else dict(index_source))
        out = run_plan(job, s, work, _here(work, s), progress=progress)
        kept, dropped = decisions(work, ids, bounds, out["drop_steps"], out["alive_step"])
    finally:
        work.remove()
    return DedupResult(kept, dropped, out["stats"])


def _inputs(texts, ids, s: DedupSettings, scores, text_field: str):
    """Takes the caller's texts (strings or records), ids (None: "0", "1", ...) and scores; gives (texts as strings,
    ids as strings, keep="best" scores as an array or None). ValueError for ids that are not unique and one per
    text, or keep="best" without one score per text."""
    n = len(texts)
    texts = [t.get(text_field) if isinstance(t, Mapping) else t for t in texts]
    texts = ["" if t is None else str(t) for t in texts]
    ids = [str(i) for i in range(n)] if ids is None else [str(i) for i in ids]
    if len(ids) != n or len(set(ids)) != n:
        raise ValueError("ids must be unique and one per text")
    sc = None
    if s.keep == "best":
        if scores is None or len(scores) != n:
            raise ValueError("keep='best' needs one score per text")
        sc = np.asarray(scores, dtype=np.float64)
    return texts, ids, sc


@emb.one_thread_math()
def dedup_file(path: str | Path, text_field: str, out_dir: str | Path, settings: DedupSettings | None = None,
               id_field: str | None = None, index_dir: str | Path | None = None) -> dict:
    """Dedup a .jsonl/.parquet/.csv file on `text_field`.

    Writes OUT/kept.<fmt> (the kept rows, all columns, input order), OUT/dropped.<fmt>
    (dropped rows plus dedup_duplicate_of, dedup_method, dedup_similarity,
    dedup_matched_id, dedup_matched_similarity, dedup_detail) and OUT/summary.json.
    Ids are `id_field` values, else the 0-based row number. Returns the summary.
    """
    s = settings or DedupSettings()
    if index_dir is not None and s.embedding:
        _encoder("static", s)  # load (or build) the model before taking the lock: others need not wait for it
    work = DedupWork.fresh(s.shard_dir, transient=index_dir is None)  # no Index step: see dedup_memory
    try:
        job = DedupJob(input=str(path), text_field=text_field, id_field=id_field, out=str(out_dir),
                       index=None if index_dir is None else str(index_dir))
        return run_plan(job, s, work, _here(work, s), progress=True)
    finally:
        work.remove()
