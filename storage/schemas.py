"""Schemas of the files whose columns more than one module reads or writes (one definition each)."""

from __future__ import annotations

import pyarrow as pa

# Every evolution attempt: the parts of a round, dataset/lineage.parquet and dataset/evolved.parquet.
LINEAGE_SCHEMA = pa.schema(
    [
        ("id", pa.string()), ("parent_id", pa.string()), ("seed_id", pa.string()), ("round", pa.int32()),
        ("operation", pa.string()), ("direction", pa.string()), ("model", pa.string()), ("status", pa.string()),
        ("elimination_rule", pa.string()), ("instruction", pa.string()), ("answer", pa.string()),
        ("judge_verdict", pa.string()), ("domain", pa.string()), ("generation", pa.int32()), ("error", pa.string()),
        ("calls", pa.int32()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
        ("duplicate_of", pa.string()), ("dedup_similarity", pa.float64()),
    ]
)
LINEAGE_FIELDS = tuple(LINEAGE_SCHEMA.names)
