"""The one batch runtime (tasks/core/batch.py), as every batched stage uses it: resume, error rows for a
rejected record, fatal errors first, corrupt parts redone. Plain functions: no Prefect."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from evolforge.storage import parts
from evolforge.storage.datasets import import_seeds
from evolforge.storage.synthesis_sets import SynthLayout
from evolforge.tasks.core.batch import BatchSpec, close_gateways, run_batch, run_records
from evolforge.tasks.core.gateway import EndpointDown, GatewayError
from evolforge.tasks.synthesis.batch import run_synthesize_batch
from evolforge.testing.settings import make_settings

SCHEMA = pa.schema([("id", pa.string()), ("status", pa.string()), ("error", pa.string())])


def _spec(tmp_path, work, rows=("a", "b", "c")) -> BatchSpec:
    return BatchSpec(
        name="t", part=tmp_path / "parts" / "batch_00000.parquet", journal=tmp_path / "journal" / "batch_00000.jsonl",
        schema=SCHEMA, load_rows=lambda: [{"id": r} for r in rows], work=work,
        on_rejected=lambda row, err: {"id": row["id"], "status": "error", "error": str(err)[:50]}, concurrency=2)


def _rejected() -> GatewayError:
    return GatewayError("HTTP 400: bad request", retryable=False, fatal=False)


def test_a_rejected_record_becomes_an_error_row_and_the_batch_resumes_from_its_part(tmp_path):
    settings = make_settings("http://127.0.0.1:9/v1")
    calls = []

    def work(row, gw, journal):
        calls.append(row["id"])
        if row["id"] == "b":
            raise _rejected()
        return {"id": row["id"], "status": "ok", "error": None}

    spec = _spec(tmp_path, work)
    stats = run_batch(spec, settings, "http://127.0.0.1:9/v1", "run-1", tmp_path)
    assert stats["by_status"] == {"ok": 2, "error": 1} and not stats["skipped"]
    assert parts.read_part(spec.part).column("status").to_pylist() == ["ok", "error", "ok"]
    again = run_batch(spec, settings, "http://127.0.0.1:9/v1", "run-1", tmp_path)
    assert again["skipped"] and again["by_status"] == {"ok": 2, "error": 1} and sorted(calls) == ["a", "b", "c"]
    close_gateways("run-1")


def test_a_corrupt_part_is_quarantined_and_redone(tmp_path):
    settings = make_settings("http://127.0.0.1:9/v1")
    spec = _spec(tmp_path, lambda row, gw, journal: {"id": row["id"], "status": "ok", "error": None})
    spec.part.parent.mkdir(parents=True)
    spec.part.write_bytes(b"PAR1 not a parquet file")
    stats = run_batch(spec, settings, "http://127.0.0.1:9/v1", "run-2", tmp_path)
    assert stats["rows"] == 3 and not stats["skipped"]
    assert [p.name for p in spec.part.parent.iterdir() if p.name != spec.part.name]  # the corrupt one, moved aside
    close_gateways("run-2")


@pytest.mark.parametrize("transient", [GatewayError("HTTP 503", retryable=True, fatal=False), RuntimeError("boom")])
def test_transient_failures_fail_the_batch_but_every_record_finishes_first(tmp_path, transient):
    finished = []

    def fn(row):
        if row == 0:
            raise transient
        finished.append(row)
        return row

    with pytest.raises(type(transient)):
        run_records(fn, list(range(6)), workers=2, name="t")
    assert sorted(finished) == [1, 2, 3, 4, 5]
    assert not (tmp_path / "parts").exists()


def test_a_fatal_error_is_raised_before_an_earlier_transient_one():
    def fn(row):
        if row == 0:
            raise RuntimeError("transient")
        if row == 3:
            raise EndpointDown("endpoint down")
        return row

    with pytest.raises(EndpointDown):
        run_records(fn, list(range(5)), workers=1, name="t")


def test_synthesis_keeps_a_rejected_record_as_an_error_row(tmp_path, server):
    """Synthesis runs on the same runtime as evolve and reward: one HTTP 400 no longer fails its batch."""
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps(r) for r in [
        {"id": "m1", "instruction": "A shop sells 3 boxes of 4 apples each. How many apples in total?",
         "domain": "math"},
        {"id": "m2", "instruction": "A farm has 5 rows of 6 trees. How many trees?", "domain": "math"}]) + "\n")
    lay = SynthLayout(tmp_path / "out").ensure()
    import_seeds(str(seeds), lay.input, lay.rejects, batch_size=2, instruction_field="instruction", id_field="id",
                 domain_field="domain", max_chars=4000)
    settings = make_settings(server.base_url, synthesis={"concurrency": 1},
                             gateway={"backoff_base_seconds": 0.0, "timeout_seconds": 2.0})
    server.script("400")  # the first request (m1's proposal) is rejected as bad
    stats = run_synthesize_batch(lay.root, 0, settings, server.base_url, "run-3")
    close_gateways("run-3")
    rows = {r["task_id"]: r for r in parts.read_part(lay.seeds.part(0)).to_pylist()}
    assert rows["t-m1-math"]["status"] == "error" and "rejected" in rows["t-m1-math"]["reject_reason"]
    assert rows["t-m2-math"]["status"] in ("kept", "rejected") and stats["by_status"]["error"] == 1


def test_records_run_workers_at_a_time_in_row_order_on_threads_that_outlive_the_batch():
    """`workers` rows in flight, never more; results in row order; a second batch reuses the first one's
    threads instead of starting its own."""
    import threading
    import time

    lock = threading.Lock()
    state = {"now": 0, "max": 0}
    threads: list[set[threading.Thread]] = [set(), set()]  # the objects, not idents (an ident is reused)

    def work(batch: int):
        def fn(row: int) -> int:
            with lock:
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
                threads[batch].add(threading.current_thread())
            time.sleep(0.01)
            with lock:
                state["now"] -= 1
            return row * row
        return fn

    rows = list(range(40))
    assert run_records(work(0), rows, 4, "b0") == [r * r for r in rows]
    assert state["max"] == 4
    # a lane's thread counts itself idle just after its last row's result is set: wait for the four to say so
    # (ThreadPoolExecutor's own idle count), as a batch that follows another one by a moment would find them
    from evolforge.tasks.core.batch import _lane_pool

    deadline = time.monotonic() + 10
    while _lane_pool()._idle_semaphore._value < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    alive = set(threading.enumerate())
    assert run_records(work(1), rows, 4, "b1") == [r * r for r in rows]
    assert state["max"] == 4
    assert len(threads[0]) <= 4 and len(threads[1]) <= 4
    assert threads[1] <= alive, "the second batch started threads of its own"
