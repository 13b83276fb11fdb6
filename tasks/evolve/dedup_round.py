"""The dedup step of an evolution round, and the seeds' entry into the dedup index.

After every batch of a round is done, the round's accepted evolutions are
deduplicated (exact, MinHash + LSH, embeddings; see tasks/dedup/) against each
other and against the persistent index of everything accepted before (earlier
rounds and earlier nights). The decisions are written first
(`rounds/round_NN/dedup.parquet`), then applied to the parts (a duplicate
becomes `eliminated` with rule `duplicate_exact|minhash|embedding`, keeping
which record it duplicates and the similarity), so a run killed anywhere in
this step redoes it to the same result.

Every segment a run appends to the index carries the run's tag (OUT/dedup_run.json)
and the round (0 for the seeds). A dedup step first drops what this run appended for
its own round and any later one (an interrupted attempt of the step, or rounds that
`evolforge retry` superseded), all under the index lock, so it sees the index as it
was before this round of this run -- and other runs sharing the index keep theirs.
"""

from __future__ import annotations

import contextlib
import logging
import uuid

from evolforge.config.sections.dedup import DedupSettings
from evolforge.config.settings import Settings
from evolforge.storage import rounds as round_store
from evolforge.storage.folder import from_folder
from evolforge.storage.fs import AnyPath, exists, location, read_json, read_text, unlink, write_text_atomic
from evolforge.storage.layout import IndexLayout, RunLayout
from evolforge.tasks.dedup.index import index_lock, rollback_index

log = logging.getLogger("evolforge.dedup_round")


def run_index(layout: RunLayout, index_dir: AnyPath) -> tuple[AnyPath, dict]:
    """(the index this run's dedup steps use, the source tag of this run's segments).

    The first dedup step records a random tag for the run and its index in OUT/dedup_run.json. The index is
    always the one the run's parameters name (`dedup_index`, else OUT/dedup_index): a folder never chooses it.
    A later flow run over the folder that names another index than the recorded one is an error naming both:
    the run's seeds and earlier rounds are in the recorded index.
    """
    ref = read_json(layout.dedup_run) or {}
    indexes = layout.recorded_indexes(ref)  # kept relative to the folder too: a moved folder names them
    given = str(location(index_dir))
    if indexes and given not in indexes:
        raise ValueError(f"{layout.root} was deduplicated against the dedup index {indexes[-1]} (its "
                         f"{layout.dedup_run.name}), not {given}: its seeds and earlier rounds are there. Name that "
                         "index (--dedup-index, flow parameter dedup_index), or use a new output folder.")
    if not ref.get("run") or given not in indexes:
        wrote = [from_folder(layout.root, i) for i in ref.get("indexes", [])]
        ref = layout.index_record({"run": ref.get("run") or uuid.uuid4().hex,
                                   "source": ref.get("source") or str(layout.root)},
                                  wrote if given in indexes else [*wrote, given])
        round_store.write_json_atomic(layout.dedup_run, ref)
    return index_dir, {"run": ref["run"], "source": ref["source"]}


@contextlib.contextmanager
def index_transaction(index_dir: AnyPath, pending: AnyPath, settings: DedupSettings, run: str, from_round: int):
    """One dedup step of this run (its dedup call, index append and decisions) alone on the index, and
    all-or-nothing across a kill.

    Holds the index lock throughout. First drops what run `run` appended for rounds >= `from_round`
    (a previous attempt that died after appending but before its decisions were written; rounds a
    retry superseded), so the step sees the same history and reaches the same decisions. A `pending`
    manifest snapshot left by an older evolforge's interrupted step is restored first, as it did.
    """
    with index_lock(index_dir, settings):
        if exists(pending):
            manifest = IndexLayout(index_dir).manifest
            saved = read_text(pending)
            if saved == "":
                unlink(manifest)
            else:
                write_text_atomic(manifest, saved)
            unlink(pending)
            log.warning("rolled back dedup index %s to its state before an interrupted dedup step", index_dir)
        rollback_index(index_dir, run, from_round, settings)
        yield


def index_seeds(layout: RunLayout, settings: Settings, index_dir: AnyPath) -> dict:
    """Put the round-1 pool into the index once, so evolutions that copy a seed are caught."""
    from evolforge.tasks.dedup.pipeline import dedup

    marker = layout.seeds_indexed
    if exists(marker):
        return {}
    index_dir, source = run_index(layout, index_dir)
    table = round_store.read_row_groups_all(layout.round_input(1))
    with index_transaction(index_dir, layout.seeds_index_pending, settings.dedup, source["run"], 0):
        res = dedup(table.column("instruction").to_pylist(), table.column("id").to_pylist(), settings.dedup, index_dir,
                    index_source={**source, "round": 0})
        write_text_atomic(marker, str(len(res.kept_ids)))
    return res.stats


def dedup_round(layout: RunLayout, round_no: int, settings: Settings, index_dir: AnyPath) -> dict:
    """Dedup the round's accepted evolutions; return dropped counts per method."""
    from evolforge.tasks.dedup.pipeline import dedup

    if not exists(layout.round_dedup(round_no)):
        index_dir, source = run_index(layout, index_dir)
        ids, texts = round_store.accepted_records(layout, round_no)
        with index_transaction(index_dir, layout.round_dedup_pending(round_no), settings.dedup, source["run"], round_no):
            res = dedup(texts, ids, settings.dedup, index_dir, index_source={**source, "round": round_no}) if ids else None
            dropped = res.dropped if res else []
            stats = res.stats if res else {"records": 0}
            round_store.write_dedup_decisions(layout, round_no, dropped, stats)
        log.info("round %d dedup: %d of %d accepted evolutions are duplicates", round_no, len(dropped), len(ids))
    return round_store.apply_dedup_decisions(layout, round_no)


def rollback_run(layout: RunLayout, from_round: int, index_dir: AnyPath,
                 settings: DedupSettings | None = None) -> list[dict]:
    """Drop this run's rounds >= `from_round` from the index `index_dir` (`evolforge retry` of that round): the
    one the retry's parameters name, and only when the run wrote to it (OUT/dedup_run.json lists it); no other
    index the record lists is touched.

    Returns [{"index", "segments", "records", "full"}], or [] when there is nothing of this run to drop (no
    OUT/dedup_run.json: no dedup yet, or indexed by an evolforge before segments carried their run).
    """
    ref = read_json(layout.dedup_run) or {}
    index = str(location(index_dir))
    if not ref.get("run") or index not in layout.recorded_indexes(ref):
        return []
    return [{"index": index, **rollback_index(location(index), ref["run"], from_round, settings)}]
