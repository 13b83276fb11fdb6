"""Scale-out: the evolve flow on a real local Dask cluster (two worker processes) gives the threads dataset."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import read_ledger
from evolforge.testing.lazy import needs

pytestmark = [pytest.mark.usefixtures("prefect_harness"), needs("prefect_dask")]


def _run(tmp_path, server, name, runner):
    seeds = tmp_path / "seeds.jsonl"
    if not seeds.exists():
        seeds.write_text("\n".join(json.dumps({"id": f"s{i}", "instruction": f"Describe river number {i} in detail."})
                                   for i in range(12)) + "\n")
    evolve_flow(EvolveParams(seeds=str(seeds), out=str(tmp_path / name), rounds=2, base_url=server.base_url,
                             overrides={"evol_instruct": {"batch_size": 3}, "runner": runner}))
    lay = RunLayout(tmp_path / name)
    drop = ["model"]
    return pl.read_parquet(lay.lineage).drop(drop).sort("id"), lay


def test_dask_two_workers_matches_threads(tmp_path, server):
    threads, _ = _run(tmp_path, server, "threads", {"kind": "threads", "max_workers": 2})
    dask, lay = _run(tmp_path, server, "dask", {"kind": "dask", "max_workers": 2})
    assert dask.equals(threads)
    # the batches ran in separate worker processes: one ledger file per process
    pids = {p.name.split(".")[1] for p in lay.ledger_dir.glob("*.jsonl") if p.stat().st_size > 0}
    assert len(pids) >= 2
    assert read_ledger(lay.root).filter(pl.col("stage") != "preflight").height == 12 * 2 * 3
