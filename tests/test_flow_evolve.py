"""The evolve flow on a real (ephemeral) Prefect server against the scripted endpoint."""

from __future__ import annotations

import json
import socket

import polars as pl
import pytest

from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import read_ledger

pytestmark = pytest.mark.usefixtures("prefect_harness")


def write_seeds(path, n=5):
    rows = [{"id": f"s{i}", "instruction": f"Compute {i} plus {i + 7} and explain the result number {i}."}
            for i in range(n)]
    rows.insert(2, {"instruction": ""})  # malformed: goes to rejects, run goes on
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def params(tmp_path, server, **kw):
    kw.setdefault("overrides", {"evol_instruct": {"batch_size": 2, "concurrency": 2},
                                "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 2.0}})
    return EvolveParams(seeds=str(write_seeds(tmp_path / "seeds.jsonl")), out=str(tmp_path / "out"),
                        rounds=kw.pop("rounds", 2), base_url=server.base_url, **kw)


def test_evolve_flow_end_to_end(tmp_path, server):
    summary = evolve_flow(params(tmp_path, server))
    lay = RunLayout(tmp_path / "out")
    assert [r["attempts"] for r in summary["rounds"]] == [5, 5]
    lineage = pl.read_parquet(lay.lineage)
    assert lineage.height == 10 and lineage["id"].n_unique() == 10
    assert set(lineage.columns) >= {"id", "parent_id", "seed_id", "round", "operation", "direction", "model",
                                     "status", "elimination_rule"}
    r2 = lineage.filter(pl.col("round") == 2)
    r1_ids = set(lineage.filter(pl.col("round") == 1)["id"])
    assert set(r2["parent_id"]) == r1_ids  # all accepted: round 2 evolves round 1's evolutions
    evolved = pl.read_parquet(lay.evolved)
    assert evolved.height == 15 and evolved.filter(pl.col("status") == "seed").height == 5
    # ledger rows are exactly the calls the server saw
    ledger = read_ledger(lay.root)
    assert ledger.filter(pl.col("stage") != "preflight").height == len(server.posts()) == 30
    assert ledger.filter(pl.col("stage") == "preflight").height == len(server.probes) == 1  # charged, as every call
    on_disk = json.loads(lay.summary.read_text())
    assert on_disk["cost"]["by_stage"] and on_disk["counts"]["final_pool"] == 5
    assert sum(1 for _ in open(lay.rejects)) == 1
    assert pl.read_parquet(lay.ledger_parquet).height == 31  # the work and the pre-flight probe


def test_eliminated_parents_return_to_the_pool(tmp_path, server):
    server.judge_verdict = "Equal"
    summary = evolve_flow(params(tmp_path, server))
    lay = RunLayout(tmp_path / "out")
    assert [r["accepted"] for r in summary["rounds"]] == [0, 0]
    assert summary["rounds"][0]["by_rule"] == {"no_information_gain": 5}
    lineage = pl.read_parquet(lay.lineage)
    seeds = {f"s{i}" for i in range(5)}
    assert set(lineage.filter(pl.col("round") == 2)["parent_id"]) == seeds  # evolved again next round
    assert set(pl.read_parquet(lay.final_pool)["id"]) == seeds
    assert pl.read_parquet(lay.evolved).height == 5


def test_resume_skips_finished_work_and_redoes_a_corrupt_part(tmp_path, server):
    p = params(tmp_path, server)
    evolve_flow(p)
    lay = RunLayout(tmp_path / "out")
    before = pl.read_parquet(lay.lineage).sort("id")
    n_calls = len(server.posts())

    evolve_flow(p)  # a second run over the same folder sends nothing
    assert len(server.posts()) == n_calls

    part = lay.part(2, 1)
    part.write_bytes(part.read_bytes()[:100])  # truncated on disk
    lay.round_success(2).unlink()
    lay.journal(2, 1).unlink()  # and its journal lost: the batch must be re-sent
    evolve_flow(p)
    assert len(server.posts()) == n_calls + 2 * 3  # batch 1 of round 2 holds 2 records x 3 calls
    assert list(part.parent.glob("*.corrupt"))  # moved aside, never read as complete
    assert pl.read_parquet(lay.lineage).sort("id").equals(before)


def test_endpoint_down_fails_fast_and_keeps_checkpoints(tmp_path, server):
    p = params(tmp_path, server, rounds=1)
    evolve_flow(p)
    lay = RunLayout(tmp_path / "out")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    p2 = p.model_copy(update={"base_url": dead, "rounds": 2})
    with pytest.raises(Exception, match="unreachable"):
        evolve_flow(p2)
    assert lay.round_success(1).exists() and len(list((lay.round_dir(1) / "parts").glob("*.parquet"))) == 3
