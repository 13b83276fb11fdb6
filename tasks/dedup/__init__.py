"""Deduplication library: exact, MinHash + LSH and embedding near-duplicate removal.

    from evolforge.tasks.dedup import dedup, dedup_file
    from evolforge.config.sections.dedup import DedupSettings

    res = dedup(texts, ids, DedupSettings(), index_dir="indexes/my_dataset")
    res.kept_ids, res.dropped   # dropped: id, duplicate_of, method, similarity, matched_id, matched_similarity, detail

    dedup_file("data.jsonl", "instruction", "out/dedup", DedupSettings())

Modules: normalize (exact keys), minhash (sketches, LSH, Jaccard), embedding
(static + full encoders, ANN), index (persistent incremental index), pipeline.
Heavy dependencies (torch, sentence-transformers) load only when embeddings run.
"""

from evolforge.tasks.dedup.pipeline import DedupResult, components, dedup, dedup_file

__all__ = ["DedupResult", "components", "dedup", "dedup_file"]
