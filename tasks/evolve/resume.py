"""What an evolve run does over its output folder besides the rounds themselves (flows/evolve.py calls these):

    reopen_for_retry(layout, settings, index)   a retry: reopen the failed or rejected batches (storage/rounds.py
                                         reopen_failed_batches) and roll this run's entries for the reopened round
                                         and later ones back out of the dedup index the retry names
                                         (tasks/evolve/dedup_round.py)
    SeedImport(record, seeds, settings)  the round-1 pool imported in a thread while the model endpoint starts; the
                                         run is recorded in run.json once it is there (storage/run_record.py)
    finished_rounds_after(layout, last)  rounds an earlier run over the folder finished beyond this run's
    rounds_note(asked, kept)             what the summary says about them (they stay in the datasets)
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from evolforge.config.settings import Settings
from evolforge.storage import rounds as round_store
from evolforge.storage.datasets import import_seeds
from evolforge.storage.fs import exists
from evolforge.storage.layout import RunLayout
from evolforge.storage.run_record import RunRecord
from evolforge.tasks.evolve.stage import retry_lines

log = logging.getLogger("evolforge.evolve")


def reopen_for_retry(layout: RunLayout, settings: Settings, index_dir: str, logger: Any = log) -> dict:
    """Make the run at `layout` redo only its failed work (what `evolforge retry` does first).

    Batches whose part holds records that failed with an error (or that have no part) are reopened, with later
    rounds and the final datasets moved aside (storage/rounds.py reopen_failed_batches). What this run put in
    the dedup index `index_dir` (the one the retry's parameters name, tasks/evolve/stage.py index_of) for the
    reopened round and the superseded later ones is rolled back (other runs' and nights' entries in a shared
    index stay; no other index is touched); an index locked by another run is rolled back by the redone dedup
    step instead. Returns {"round", "batches", "superseded_rounds", "index_rollback", "index_locked",
    "nothing_to_retry"} (nothing to retry: no batch reopened and the run had finished)."""
    from evolforge.tasks.dedup.index import IndexLocked
    from evolforge.tasks.evolve.dedup_round import rollback_run

    reopened = round_store.reopen_failed_batches(layout, time.strftime("%Y%m%dT%H%M%S"))
    retried = {"round": reopened.get("round"), "batches": reopened["batches"],
               "superseded_rounds": reopened["superseded_rounds"], "index_rollback": [], "index_locked": None,
               "nothing_to_retry": not reopened["batches"] and exists(layout.summary)}
    if reopened["batches"]:
        try:
            retried["index_rollback"] = rollback_run(layout, reopened["round"], index_dir, settings.dedup)
        except IndexLocked as e:  # the redone dedup step rolls it back too, once it gets the lock
            retried["index_locked"] = str(e)
    for line in retry_lines(retried):
        logger.info("%s", line)
    return retried


class SeedImport:
    """The seed file imported into the round-1 pool in a daemon thread (started at once; nothing to do when the
    pool is there already). `wait()` waits for it (raising what it raised), then records the run in run.json
    (once): the record of a first run takes the seed file's hash, and needs the import done. The record's notes
    (storage/run_record.py open_run: a seed file given under another path, a missing run.json) are logged first."""

    def __init__(self, record: RunRecord, seeds: str, settings: Settings, logger: Any = log):
        self.record, self.logger, self.layout = record, logger, record.layout
        for note in record.notes:
            logger.warning("%s", note)
        self._pending: list[_Background] = []
        if not exists(self.layout.round_input(1)):
            self._pending.append(_Background(
                import_seeds, seeds, self.layout.round_input(1), self.layout.rejects,
                batch_size=settings.evol_instruct.batch_size,
                **settings.input.model_dump(include={"instruction_field", "id_field", "domain_field", "max_chars"})))
        else:
            record.save()

    def wait(self) -> None:
        """The round-1 pool is there and the run recorded (the import's error is raised here, once)."""
        if self._pending:
            counts = self._pending.pop().result()
            self.logger.info("imported %d seeds (%d rejected -> %s)", counts["seeds"], counts["rejected"],
                             self.layout.rejects)
            self.record.save()  # appends this run to run.json's history; the first record is kept


class _Background:
    """A call in a daemon thread; `result()` waits for it and raises what it raised."""

    def __init__(self, fn: Callable, *args: Any, **kw: Any):
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn, args, kw), name="evolforge-seeds", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable, args: tuple, kw: dict) -> None:
        try:
            self._result = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread by result()
            self._error = e

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def finished_rounds_after(layout: RunLayout, last: int) -> list[int]:
    """Rounds after `last` that an earlier run over the folder finished (consecutive: each evolves the one before)."""
    found: list[int] = []
    r = last + 1
    while exists(layout.round_input(r)) and round_store.round_is_complete(layout, r):
        found.append(r)
        r += 1
    return found


def rounds_note(asked: int, kept: list[int]) -> str | None:
    """The summary's note when fewer rounds were asked than the folder holds finished (None otherwise)."""
    if not kept:
        return None
    return (f"{asked} rounds asked, but this run had finished rounds 1-{kept[-1]}: the datasets keep every finished "
            f"round (rounds {', '.join(map(str, kept))} were not run again); to get fewer rounds, use a new output "
            "folder")
