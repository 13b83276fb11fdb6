"""`evolforge status`: a run's checkpoints read back (batches done / failed / pending, records, calls, cost)
without starting anything; `has_checkpoints` decides the resume hint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from evolforge.cli.status import stage_status as folder_status
from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.storage.folder import StageFolder, read_marker
from evolforge.storage.layout import RunLayout
from evolforge.storage.parts import read_part, write_table_atomic
from evolforge.storage.status import has_checkpoints

pytestmark = pytest.mark.usefixtures("prefect_harness")


def evolve_run(tmp_path, server):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Compute {i} plus {i + 7} and explain."}) + "\n"
                             for i in range(5)))
    evolve_flow(EvolveParams(seeds=str(seeds), out=str(tmp_path / "out"), rounds=2, base_url=server.base_url,
                             overrides={"evol_instruct": {"batch_size": 2, "concurrency": 2},
                                        "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 2.0}}))
    return RunLayout(tmp_path / "out")


def status_cli(out) -> subprocess.CompletedProcess:
    """`evolforge status` in a fresh process that also proves Prefect was never imported."""
    code = ("import sys; from evolforge.cli import main; rc = main(sys.argv[1:]); "
            "assert 'prefect' not in sys.modules, 'status imported Prefect'; sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, "status", "--out", str(out)], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.long("a real evolve run in each of three states: ~10 s CPU measured, at the budget")
def test_status_of_an_evolve_run_done_failed_pending(tmp_path, server):
    lay = evolve_run(tmp_path, server)
    # the evolve stage's marker: its kind and, once finished, its counts (what status reads the kind from)
    marker = read_marker(lay.root)
    assert marker["kind"] == "evolve" and marker["finished_at"]
    assert marker["counts"] == {"rounds": 2, "lineage": 10, "evolved": 15, "final_pool": 5, "sft": 10}
    st = folder_status(lay.root)
    assert st["kind"] == "evolve" and st["finished"]
    assert [(u["unit"], u["batches"], u["done"], u["failed"], u["pending"], u["records"], u["records_done"])
            for u in st["units"]] == [("round 1", 3, 3, 0, 0, 5, 5), ("round 2", 3, 3, 0, 0, 5, 5)]
    assert all(u["complete"] for u in st["units"])
    assert sum(u["accepted"] for u in st["units"]) == 10  # the scripted judge keeps every evolution
    assert st["cost"]["calls"] == len(server.posts()) + len(server.probes) and st["cost"]["tokens"] > 0
    assert has_checkpoints(lay.root) and not has_checkpoints(tmp_path / "nothing")

    # a failed batch (a record with an error) and a pending one (its part never written)
    part = lay.part(2, 0)
    t = read_part(part)
    status = pc.if_else(pa.array([True] + [False] * (t.num_rows - 1)), "error", t.column("status"))
    write_table_atomic(t.set_column(t.schema.get_field_index("status"), "status", status), part)
    lay.part(2, 2).unlink()
    r2 = folder_status(lay.root)["units"][1]
    assert (r2["done"], r2["failed"], r2["pending"], r2["failed_batches"], r2["errors"]) == (1, 1, 1, [0], 1)
    assert r2["records_done"] == 4 and r2["accepted"] == 3 and not r2["complete"]

    proc = status_cli(lay.root)
    assert proc.returncode == 0, proc.stderr
    assert "round 1: batches 3 done, 0 failed, 0 pending of 3; records 5/5 done, 5 accepted" in proc.stdout
    assert "round 2: batches 1 done, 1 failed [0], 1 pending of 3; records 4/5 done, 3 accepted, 1 errors" in proc.stdout
    # the scripted model has no price: the cost is unknown, never $0
    assert f"calls {st['cost']['calls']} (0 failed attempts)" in proc.stdout
    assert f"cost unknown ({st['cost']['calls']} unpriced calls)" in proc.stdout and st["cost"]["cost_usd"] is None

    # a folder of stage folders: one status per stage; its kind is its own marker's (a pipeline root), else "folders"
    shutil.copytree(lay.root, tmp_path / "pipe" / "evolve")
    pipe = folder_status(tmp_path / "pipe")
    assert pipe["kind"] == "folders" and [s["kind"] for s in pipe["stages"]] == ["evolve"]
    StageFolder(tmp_path / "pipe").start_marker("pipeline")
    pipe = folder_status(tmp_path / "pipe")
    assert pipe["kind"] == "pipeline" and [s["kind"] for s in pipe["stages"]] == ["evolve"] and not pipe["finished"]
    proc = status_cli(tmp_path / "pipe")
    assert proc.returncode == 0 and "pipeline " in proc.stdout and "  evolve " in proc.stdout


def test_status_of_nothing_is_a_clear_error(tmp_path):
    proc = status_cli(tmp_path / "none")
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "empty").mkdir()
    proc = status_cli(tmp_path / "empty")
    assert proc.returncode == 2 and "holds no evolforge stage output" in proc.stderr


def test_a_batch_that_failed_is_failed_not_pending(tmp_path, server, monkeypatch):
    """A batch whose calls get HTTP 500 until the gateway's and Prefect's retries are spent leaves no part: status
    shows it failed, with its error, not pending; the run that redoes it clears that."""
    from evolforge.flows import evolve as evolve_module

    monkeypatch.setattr(evolve_module, "evolve_batch_task",  # Prefect's retries without their 5 s, 10 s waits
                        evolve_module.evolve_batch_task.with_options(retry_delay_seconds=0, retry_jitter_factor=None))
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Compute {i} plus {i + 7} and explain."}) + "\n"
                             for i in range(5)))
    p = EvolveParams(seeds=str(seeds), out=str(tmp_path / "out"), rounds=1, base_url=server.base_url,
                     overrides={"evol_instruct": {"batch_size": 2, "concurrency": 2},
                                "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 2.0, "max_retries": 1}})
    server.poison = "Compute 4 plus"  # the seed of batch 2 (s4): every call for it gets HTTP 500
    with pytest.raises(Exception, match="1 of 3 batches failed"):
        evolve_flow(p)
    lay = RunLayout(tmp_path / "out")
    assert not lay.part(1, 2).exists()
    r1 = folder_status(lay.root)["units"][0]
    assert (r1["done"], r1["failed"], r1["pending"], r1["failed_batches"]) == (2, 1, 0, [2])
    assert "500" in r1["failure"]
    proc = status_cli(lay.root)
    assert proc.returncode == 0, proc.stderr
    assert "round 1: batches 2 done, 1 failed [2], 0 pending of 3; records 4/5 done" in proc.stdout
    assert "first failed batch: " in proc.stdout and "500" in proc.stdout.split("first failed batch: ")[1]

    server.poison = None  # the endpoint recovers: the run over the folder redoes the batch, and it is done
    evolve_flow(p)
    r1 = folder_status(lay.root)["units"][0]
    assert (r1["done"], r1["failed"], r1["pending"], r1["failed_batches"]) == (3, 0, 0, [])
    assert "failure" not in r1
