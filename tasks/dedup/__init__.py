"""Deduplication library: exact, MinHash + LSH and embedding near-duplicate removal.

    from evolforge.tasks.dedup import dedup, dedup_file
    from evolforge.config.sections.dedup import DedupSettings

    res = dedup(texts, ids, DedupSettings(), index_dir="indexes/my_dataset")
    res.kept_ids, res.dropped   # dropped: id, duplicate_of, method, similarity, matched_id, matched_similarity, detail

    dedup_file("data.jsonl", "instruction", "out/dedup", DedupSettings())

Modules: normalize (exact keys), minhash (sketches, LSH, Jaccard), embedding
(static + full encoders, ANN), index (persistent incremental index), shards (band / query-row shards), pipeline.
stage (the dedup stage's parameters, check and descriptor), report, shard_tasks.
Heavy dependencies (torch, sentence-transformers) load only when embeddings run; the pipeline itself loads on
first use of the names below, so importing the stage descriptor (every CLI start) stays light.
- distributed: dedup whose per-record work runs on the workers: steps that exchange files, a driver that holds the
               plan only.
- graph:       connected components of a phase's candidate graph in shard steps, and its edges routed to group shards.
- group_steps: the grouping steps of the dedup on the workers: one task per bucket or group shard, then one per record
               shard.
"""

__all__ = ["DedupResult", "components", "dedup", "dedup_file"]


def __getattr__(name):
    if name in __all__:
        from evolforge.tasks.dedup import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
