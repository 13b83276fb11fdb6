"""Faults a long nightly run meets: flaky endpoint, rejected records, full disk, read-only folder."""

from __future__ import annotations

import json
import os
import subprocess

import polars as pl
import pyarrow as pa
import pytest

from evolforge.cli import main as cli_main
from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.storage import parts
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import read_ledger

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _seeds(tmp_path, n=8):
    p = tmp_path / "seeds.jsonl"
    p.write_text("\n".join(json.dumps({"id": f"s{i}", "instruction": f"Plan a trip to city number {i}."})
                           for i in range(n)) + "\n")
    return p


def _params(tmp_path, server, out="out", **over):
    overrides = {"evol_instruct": {"batch_size": 2, "concurrency": 2},
                 "gateway": {"backoff_base_seconds": 0.0, "backoff_max_seconds": 0.0, "timeout_seconds": 1.0,
                             "max_retries": 4}}
    overrides.update(over)
    return EvolveParams(seeds=str(_seeds(tmp_path)), out=str(tmp_path / out), rounds=1, base_url=server.base_url,
                        overrides=overrides)


def test_flaky_endpoint_run_completes_and_ledger_shows_retries(tmp_path, server):
    server.script("429", "429", "503", "hang", "close", "malformed", "truncated", "500", "429")
    summary = evolve_flow(_params(tmp_path, server))
    lay = RunLayout(tmp_path / "out")
    lineage = pl.read_parquet(lay.lineage)
    assert lineage.height == 8 and lineage["id"].n_unique() == 8 and set(lineage["status"]) == {"accepted"}
    ledger = read_ledger(lay.root)
    outcomes = ledger["outcome"].value_counts().to_dicts()
    failed = {o["outcome"]: o["count"] for o in outcomes if o["outcome"] != "ok"}
    assert failed == {"http_429": 3, "http_503": 1, "timeout": 1, "connection_error": 2,
                      "malformed_response": 1, "http_500": 1}
    work = ledger.filter(pl.col("stage") != "preflight")  # the flow's pre-flight probe is charged too
    assert work.height == len(server.posts()) == 24 + 9 and ledger.height - work.height == len(server.probes) == 1
    assert summary["cost"]["failed_attempts"] == 9


def test_retry_command_redoes_only_rejected_batches(tmp_path, server):
    server.script("400", "400")  # two records' first call is rejected: kept as status=error
    p = _params(tmp_path, server)
    evolve_flow(p)
    lay = RunLayout(tmp_path / "out")
    assert pl.read_parquet(lay.lineage).filter(pl.col("status") == "error").height == 2
    sent = len(server.posts())
    assert cli_main(["retry", "--out", str(lay.root), "--base-url", server.base_url]) == 0
    lineage = pl.read_parquet(lay.lineage)
    assert lineage.height == 8 and set(lineage["status"]) == {"accepted"}
    # only the two failed records were sent again (3 calls each); their batch-mates replayed from the journal
    assert len(server.posts()) - sent == 6
    assert list((lay.round_dir(1) / "parts").glob("*.retry-*"))
    assert cli_main(["retry", "--out", str(lay.root), "--base-url", server.base_url]) == 0  # nothing left to retry
    assert len(server.posts()) - sent == 6


def test_atomic_part_never_half_written_on_full_disk(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)]).returncode:
        pytest.skip("needs root to mount a tiny filesystem")
    try:
        big = pa.table({"x": [os.urandom(640).hex() for _ in range(2000)]})  # incompressible
        with pytest.raises(parts.CheckpointWriteError, match="disk full|read-only"):
            parts.write_table_atomic(big, mnt / "batch_00000.parquet")
        assert list(mnt.iterdir()) == []  # neither a part nor a temp file is left behind
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_read_only_output_folder_fails_with_a_clear_error(tmp_path, server):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mnt)]).returncode:
        pytest.skip("needs root to mount a read-only filesystem")
    try:
        p = _params(tmp_path, server).model_copy(update={"out": str(mnt / "out")})
        with pytest.raises(Exception, match="not writable.*Read-only file system"):  # the flow's fail-fast check
            evolve_flow(p)
        assert len(server.posts()) == 0  # nothing was spent before the problem was found
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_disk_full_mid_run_keeps_every_written_part_whole(tmp_path, server):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mnt)]).returncode:
        pytest.skip("needs root to mount a small filesystem")
    try:
        p = EvolveParams(seeds=str(_seeds(tmp_path, n=200)), out=str(mnt / "out"), rounds=1,
                         base_url=server.base_url, overrides={"evol_instruct": {"batch_size": 8}})
        with pytest.raises(Exception, match="No space left|disk full"):
            evolve_flow(p)
        lay = RunLayout(mnt / "out")
        written = list((lay.round_dir(1) / "parts").glob("batch_*.parquet"))
        for part in written:
            parts.read_part(part)  # every part that exists is complete
        assert not lay.round_success(1).exists()
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
