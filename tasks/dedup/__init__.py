"""Deduplication library: exact, MinHash + LSH and embedding near-duplicate removal.

    from evolforge.tasks.dedup import dedup, dedup_file
    from evolforge.config.sections.dedup import DedupSettings

    res = dedup(texts, ids, DedupSettings(), index_dir="indexes/my_dataset")
    res.kept_ids, res.dropped   # dropped: id, duplicate_of, method, similarity, matched_id, matched_similarity, detail

    dedup_file("data.jsonl", "instruction", "out/dedup", DedupSettings())

One engine: every dedup, in one process or on the workers, runs the same typed steps over one work folder
(storage/dedup_work.py); only the scheduling differs.
- plan:        the engine's steps (dataclasses) in order, and the driver that hands them out in batches.
- distributed: the steps themselves (run in any process; files in, files out), `run_step`, the work folder.
- group_steps: the deciding steps: one per exact bucket or group shard, then one per record shard.
- graph:       connected components of a phase's candidate graph in shard steps, and its edges routed to group shards.
- rules:       the decision rules the deciding steps apply (groups, representatives, leader grouping, number guard,
               the full model's budget).
- pipeline:    `dedup()` and `dedup_file()`: the plan in this process, its steps one after the other.
- shards:      one part of a search (MinHash bands, embedding query rows); the same pairs however they are split.
- normalize (exact keys), minhash (sketches, LSH, Jaccard), embedding (static + full encoders, ANN), index
  (persistent incremental index), stage (the dedup stage's parameters, check and descriptor), report.
Heavy dependencies (torch, sentence-transformers) load only when embeddings run; the pipeline itself loads on
first use of the names below, so importing the stage descriptor (every CLI start) stays light.
"""

__all__ = ["DedupResult", "components", "dedup", "dedup_file"]


def __getattr__(name):
    if name in __all__:
        from evolforge.tasks.dedup import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
