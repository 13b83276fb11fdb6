"""Dedup inside every evolution round (against everything accepted so far), and as a flow of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import polars as pl
import pytest

from evolforge.cli.status import stage_status
from evolforge.flows.dedup import DedupParams, dedup_flow
from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.storage.layout import RunLayout
from evolforge.testing.scripted_server import ScriptedServer

pytestmark = pytest.mark.usefixtures("prefect_harness")
SAME = "Write a short poem about the sea at night."


def _seeds(tmp_path, n=6):
    p = tmp_path / "seeds.jsonl"
    topics = ["volcanoes", "tax law", "chess openings", "bread baking", "jazz history", "satellites", "bees", "glass"]
    p.write_text("\n".join(json.dumps({"id": f"s{i}", "instruction": f"Explain the basics of {topics[i]} to a beginner."})
                           for i in range(n)) + "\n")
    return p


def test_round_dedup_drops_duplicates_with_reasons_and_checks_history(tmp_path, server):
    server.default = f"text:{SAME}"  # every evolution is the same instruction
    p = EvolveParams(seeds=str(_seeds(tmp_path)), out=str(tmp_path / "out"), rounds=2, base_url=server.base_url,
                     overrides={"evol_instruct": {"batch_size": 2}})
    summary = evolve_flow(p)
    lay = RunLayout(tmp_path / "out")
    lineage = pl.read_parquet(lay.lineage)
    r1 = lineage.filter(pl.col("round") == 1)
    kept = r1.filter(pl.col("status") == "accepted")
    assert kept.height == 1  # one representative (the earliest) survives
    dups = r1.filter(pl.col("elimination_rule") == "duplicate_exact")
    assert dups.height == 5 and set(dups["duplicate_of"]) == set(kept["id"]) and set(dups["dedup_similarity"]) == {1.0}
    # round 2 repeats the same text: all of it duplicates round 1's accepted record (found in the index)
    r2 = lineage.filter(pl.col("round") == 2)
    assert r2.filter(pl.col("status") == "accepted").height == 0
    assert set(r2["duplicate_of"]) == set(kept["id"])
    assert summary["rounds"][0]["by_rule"] == {"duplicate_exact": 5}
    decisions = pl.read_parquet(lay.round_dedup(1))
    assert set(decisions.columns) >= {"id", "duplicate_of", "method", "similarity"}
    # survival counts dedup: parents of dropped evolutions are back in the pool
    assert set(pl.read_parquet(lay.final_pool)["id"]) == set(kept["id"]) | {f"s{i}" for i in range(6)} - set(
        kept["parent_id"])


def test_kill_during_dedup_then_resume_gives_the_same_result(tmp_path):
    from prefect.settings import PREFECT_API_URL

    seeds = _seeds(tmp_path, n=8)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "EVOLFORGE__EVOL_INSTRUCT__BATCH_SIZE": "2"}

    def cli(out, base_url):
        return subprocess.Popen([sys.executable, "-m", "evolforge.cli", "run", "--seeds", str(seeds), "--out", str(out),
                                 "--rounds", "1", "--base-url", base_url], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)

    with ScriptedServer() as srv:
        srv.evolve_overrides = {"bread baking": SAME, "jazz history": SAME}  # two evolutions collide
        ref = cli(tmp_path / "ref", srv.base_url)
        assert ref.wait(timeout=300) == 0, ref.stdout.read().decode()[-3000:]
        out = tmp_path / "out"
        lay = RunLayout(out)
        proc = cli(out, srv.base_url)
        deadline = time.time() + 300
        while time.time() < deadline:  # all 4 batch parts written, dedup decisions not yet: we are inside dedup
            if len(list((lay.round_dir(1) / "parts").glob("batch_*.parquet"))) == 4 and not lay.round_dedup(1).exists():
                break
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not lay.round_success(1).exists()
        again = cli(out, srv.base_url)
        assert again.wait(timeout=300) == 0, again.stdout.read().decode()[-3000:]
    cols = ["id", "status", "elimination_rule", "duplicate_of"]
    a = pl.read_parquet(lay.lineage).select(cols).sort("id")
    b = pl.read_parquet(RunLayout(tmp_path / "ref").lineage).select(cols).sort("id")
    assert a.equals(b) and a.filter(pl.col("elimination_rule") == "duplicate_exact").height == 1


def test_dedup_flow_on_any_file(tmp_path):
    src = tmp_path / "data.csv"
    src.write_text("text,id\n\"How do bees make honey?\",a\n\"how do bees make honey\",b\n"
                   "\"Describe the French Revolution.\",c\n\"What is the capital of Peru?\",d\n")
    summary = dedup_flow(DedupParams(input=str(src), text_field="text", id_field="id", out=str(tmp_path / "o")))
    assert summary["kept"] == 3 and summary["dropped"] == 1
    dropped = pl.read_csv(tmp_path / "o" / "dropped.csv")
    assert dropped["id"].to_list() == ["b"] and dropped["dedup_duplicate_of"].to_list() == ["a"]
    assert dropped["dedup_method"].to_list() == ["exact"]
    on_disk = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert on_disk["stats"]["dropped_exact"] == 1 and on_disk["run_id"] == summary["run_id"]
    # the stage runner's marker, and `evolforge status` reading the folder through it
    marker = json.loads((tmp_path / "o" / "stage.json").read_text())
    assert marker["kind"] == "dedup" and marker["finished_at"] and marker["counts"] == {"kept": 3, "dropped": 1}
    st = stage_status(tmp_path / "o")
    assert st["kind"] == "dedup" and st["finished"] and st["units"] == [] and st["cost"]["calls"] == 0
    # the outputs, and the run lock (kept, empty: removing a flock file on release would race the next writer)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [".evolforge.lock", "dropped.csv", "kept.csv",
                                                                  "stage.json", "summary.json"]
