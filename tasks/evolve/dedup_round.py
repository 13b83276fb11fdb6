"""The dedup step of an evolution round, and the seeds' entry into the dedup index.

After every batch of a round is done, the round's accepted evolutions are
deduplicated (exact, MinHash + LSH, embeddings; see tasks/dedup/) against each
other and against the persistent index of everything accepted before (earlier
rounds and earlier nights). The decisions are written first
(`rounds/round_NN/dedup.parquet`), then applied to the parts (a duplicate
becomes `eliminated` with rule `duplicate_exact|minhash|embedding`, keeping
which record it duplicates and the similarity), so a run killed anywhere in
this step redoes it to the same result.
"""

from __future__ import annotations

import contextlib
import logging

from evolforge.config.settings import Settings
from evolforge.storage import rounds as round_store
from evolforge.storage.fs import AnyPath, exists, read_text, unlink, write_text_atomic
from evolforge.storage.layout import IndexLayout, RunLayout

log = logging.getLogger("evolforge.dedup_round")


@contextlib.contextmanager
def index_transaction(index_dir: AnyPath, pending: AnyPath):
    """Make one dedup call and its index append all-or-nothing across a kill.

    The index manifest as it was before the call is saved in `pending`; if a
    previous attempt died after appending to the index but before its decisions
    were written, the manifest is rolled back first, so the retried call sees the
    same history and reaches the same decisions. `pending` is removed on success.
    """
    manifest = IndexLayout(index_dir).manifest
    if exists(pending):
        saved = read_text(pending)
        if saved == "":
            unlink(manifest)
        else:
            write_text_atomic(manifest, saved)
        log.warning("rolled back dedup index %s to its state before an interrupted dedup step", index_dir)
    else:
        write_text_atomic(pending, read_text(manifest) if exists(manifest) else "")
    yield
    unlink(pending)


def index_seeds(layout: RunLayout, settings: Settings, index_dir: AnyPath) -> dict:
    """Put the round-1 pool into the index once, so evolutions that copy a seed are caught."""
    from evolforge.tasks.dedup.pipeline import dedup

    marker = layout.seeds_indexed
    if exists(marker):
        return {}
    table = round_store.read_row_groups_all(layout.round_input(1))
    with index_transaction(index_dir, layout.seeds_index_pending):
        res = dedup(table.column("instruction").to_pylist(), table.column("id").to_pylist(), settings.dedup, index_dir)
        write_text_atomic(marker, str(len(res.kept_ids)))
    return res.stats


def dedup_round(layout: RunLayout, round_no: int, settings: Settings, index_dir: AnyPath) -> dict:
    """Dedup the round's accepted evolutions; return dropped counts per method."""
    from evolforge.tasks.dedup.pipeline import dedup

    if not exists(layout.round_dedup(round_no)):
        ids, texts = round_store.accepted_records(layout, round_no)
        with index_transaction(index_dir, layout.round_dedup_pending(round_no)):
            res = dedup(texts, ids, settings.dedup, index_dir) if ids else None
            dropped = res.dropped if res else []
            stats = res.stats if res else {"records": 0}
            round_store.write_dedup_decisions(layout, round_no, dropped, stats)
        log.info("round %d dedup: %d of %d accepted evolutions are duplicates", round_no, len(dropped), len(ids))
    return round_store.apply_dedup_decisions(layout, round_no)
