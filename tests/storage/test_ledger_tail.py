"""Pricing rounds incrementally: the ledger tail reads only new rows; the tally sums USD per task."""

from __future__ import annotations

import os

import polars as pl
import pytest

from evolforge.storage.ledger import LedgerTail, LedgerWriter, read_ledger
from evolforge.tasks.evolve.report import CostTally


@pytest.mark.parametrize("remote", [False, True])
def test_tail_reads_each_row_once_and_waits_for_a_torn_line(tmp_path, remote):
    out = "memory://ledger-tail-test/run" if remote else str(tmp_path)
    w = LedgerWriter(f"{out}/ledger", "run", flush_seconds=0)
    tail = LedgerTail(out)
    w.record(task_id="a", cost_usd=0.5, outcome="ok")
    w.record(task_id="b", cost_usd=None, outcome="ok")
    first = tail.new_rows()
    assert first["task_id"].to_list() == ["a", "b"]
    assert tail.new_rows().height == 0
    w.record(task_id="a", cost_usd=0.25, outcome="http_429")
    if not remote:  # a line still being written is not read until it is complete
        os.write(w._log._fd, b'{"task_id": "c", "cost_')
        assert tail.new_rows()["task_id"].to_list() == ["a"]
        os.write(w._log._fd, b'usd": 1.0, "outcome": "ok"}\n')
        assert tail.new_rows()["task_id"].to_list() == ["c"]
    else:
        assert tail.new_rows()["task_id"].to_list() == ["a"]
    w2 = LedgerWriter(f"{out}/ledger", "run", flush_seconds=0)  # another process's file appears later
    w2.record(task_id="d", cost_usd=2.0, outcome="ok")
    assert tail.new_rows()["task_id"].to_list() == ["d"]
    assert read_ledger(out).height == (5 if not remote else 4)


def test_cost_tally_sums_per_task_and_keeps_unpriced_apart():
    tally = CostTally()
    tally.add(pl.DataFrame({"task_id": ["a", "b", "a"], "cost_usd": [0.5, None, 0.25]}))
    tally.add(pl.DataFrame({"task_id": ["a", "c"], "cost_usd": [1.0, 2.0]}))
    assert tally.cost_of(pl.Series(["a"])) == pytest.approx(1.75)
    assert tally.cost_of(pl.Series(["a", "c"])) == pytest.approx(3.75)
    assert tally.cost_of(pl.Series(["b"])) is None  # only unpriced calls: unknown, never 0
    assert tally.cost_of(pl.Series(["zzz"])) is None
    assert tally.by_task.height == 3
