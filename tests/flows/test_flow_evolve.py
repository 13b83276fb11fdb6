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


def test_a_model_the_endpoint_does_not_serve_leaves_no_run_and_the_corrected_run_starts_fresh(tmp_path, server):
    """Pre-flight fails on a model the endpoint does not serve: nothing of the run stays in the output folder (no
    run.json, no round-1 pool), so the corrected command is a new run, not a resume refused as 'other inputs'."""
    p = params(tmp_path, server, rounds=1, model="no-such-model")
    server.unknown_models.add("no-such-model")
    with pytest.raises(Exception, match="no-such-model"):
        evolve_flow(p)
    lay = RunLayout(tmp_path / "out")
    assert not lay.run_info.exists() and not lay.round_input(1).exists()
    summary = evolve_flow(p.model_copy(update={"model": None}))  # no --force-settings needed
    assert summary["rounds"][0]["attempts"] == 5
    assert [e["event"] for e in _run_json(tmp_path)["history"]][0] == "start"


# ---------------------------------------------------------------- a run over an existing folder checks its inputs

def _run_json(tmp_path) -> dict:
    return json.loads(RunLayout(tmp_path / "out").run_info.read_text())


def test_other_seeds_over_an_existing_run_are_an_error(tmp_path, server):
    from evolforge.storage.run_record import RunInputsChanged

    p = params(tmp_path, server, rounds=1)
    evolve_flow(p)
    sent = len(server.posts())
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "x1", "instruction": "Describe the water cycle for a ten year old."}) + "\n")
    with pytest.raises(RunInputsChanged, match=r"(?s)seed file changed .*seeds\.jsonl -> .*other\.jsonl.*sha256.*"
                                               r"--force-settings.*new output folder"):
        evolve_flow(p.model_copy(update={"seeds": str(other), "rounds": 2}))
    with open(p.seeds, "a") as fh:  # the same path, other content
        fh.write(json.dumps({"id": "s9", "instruction": "Compute 9 plus 16 and explain the result number 9."}) + "\n")
    with pytest.raises(RunInputsChanged, match="same path, other content"):
        evolve_flow(p.model_copy(update={"rounds": 2}))
    assert len(server.posts()) == sent and not RunLayout(tmp_path / "out").round_dir(2).exists()  # nothing done
    assert [e["event"] for e in _run_json(tmp_path)["history"]] == ["start"]


def test_changed_result_settings_are_an_error_naming_the_key_and_force_settings_accepts_them(tmp_path, server):
    from evolforge.storage.run_record import RunInputsChanged

    p = params(tmp_path, server, rounds=1)
    evolve_flow(p)
    first = _run_json(tmp_path)
    changed = {"evol_instruct": {"batch_size": 2, "concurrency": 2, "temperature": 0.5, "equal_check": False},
               "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 2.0}}
    with pytest.raises(RunInputsChanged, match=r"evol_instruct\.equal_check True -> False; "
                                               r"evol_instruct\.temperature 0\.9 -> 0\.5"):
        evolve_flow(p.model_copy(update={"overrides": changed, "rounds": 2}))
    assert not RunLayout(tmp_path / "out").round_dir(2).exists()

    summary = evolve_flow(p.model_copy(update={"overrides": changed, "rounds": 2, "force_settings": True}))
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    info = _run_json(tmp_path)
    assert info["run_id"] == first["run_id"] and info["history"][0] == first["history"][0]  # the first record kept
    forced = info["history"][-1]
    assert forced["event"] == "forced" and forced["changes"] == {"evol_instruct.equal_check": [True, False],
                                                                 "evol_instruct.temperature": [0.9, 0.5]}
    assert forced["replaced"]["settings"]["evol_instruct"]["temperature"] == 0.9
    assert info["settings"]["evol_instruct"]["temperature"] == 0.5  # what the run now stands on (and retry reuses)
    sent = len(server.posts())
    evolve_flow(p.model_copy(update={"overrides": changed, "rounds": 2}))  # the accepted settings: a plain resume
    assert len(server.posts()) == sent and _run_json(tmp_path)["history"][-1]["event"] == "resume"


def test_settings_that_do_not_change_results_may_change_on_resume(tmp_path, server):
    p = params(tmp_path, server, rounds=1)
    evolve_flow(p)
    sent = len(server.posts())
    faster = {"evol_instruct": {"batch_size": 3, "concurrency": 1},
              "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 5.0, "concurrency": 3, "max_retries": 1},
              "runner": {"max_workers": 2}, "storage": {"remote_log_flush_seconds": 0.5}}
    again = evolve_flow(p.model_copy(update={"overrides": faster}))
    assert len(server.posts()) == sent and again["counts"]["evolved"] == 10
    info = _run_json(tmp_path)
    assert [e["event"] for e in info["history"]] == ["start", "resume"]
    assert info["settings"]["evol_instruct"]["concurrency"] == 2  # the run's record is not rewritten


def test_fewer_rounds_keep_every_finished_round_in_the_datasets(tmp_path, server):
    p = params(tmp_path, server, rounds=2)
    full = evolve_flow(p)
    lay = RunLayout(tmp_path / "out")
    lineage = pl.read_parquet(lay.lineage).sort("id")
    sent = len(server.posts())
    fewer = evolve_flow(p.model_copy(update={"rounds": 1}))
    assert len(server.posts()) == sent
    assert pl.read_parquet(lay.lineage).sort("id").equals(lineage)  # round 2 is still there
    assert set(pl.read_parquet(lay.lineage)["round"]) == {1, 2}
    assert pl.read_parquet(lay.evolved).height == 15 and fewer["counts"] == full["counts"]
    assert fewer["rounds_in_datasets"] == [1, 2] and fewer["rounds_requested"] == 1
    assert "finished rounds 1-2" in fewer["rounds_note"] and [r["round"] for r in fewer["rounds"]] == [1, 2]
    assert json.loads(lay.summary.read_text())["rounds_note"] == fewer["rounds_note"]
    assert _run_json(tmp_path)["settings"]["evol_instruct"]["rounds"] == 2  # `evolforge retry` redoes both rounds


def test_retry_is_a_flow_parameter(tmp_path, server):
    """`retry=true` (what `evolforge retry` and a Prefect deployment run start) redoes only the rejected batch of the
    run at `out`, with the run's own seeds and settings, and says what it reopened; once nothing failed, it does
    nothing and says so."""
    server.script("400")  # the first evolution call is rejected: its record is kept with status=error
    p = params(tmp_path, server, rounds=1)
    evolve_flow(p)
    lay = RunLayout(tmp_path / "out")
    assert pl.read_parquet(lay.lineage).filter(pl.col("status") == "error").height == 1
    sent = len(server.posts())
    # only `out`, `retry` (and the endpoint): the seeds, rounds and settings are the run's (its run.json)
    summary = evolve_flow(EvolveParams(out=p.out, base_url=server.base_url, retry=True))
    assert summary["retry"]["round"] == 1 and len(summary["retry"]["batches"]) == 1
    assert not summary["retry"]["nothing_to_retry"]
    assert set(pl.read_parquet(lay.lineage)["status"]) == {"accepted"} and summary["counts"]["evolved"] == 10
    assert len(server.posts()) - sent == 3  # the rejected record's 3 calls; its batch-mate replayed from the journal
    assert summary["seeds"] == p.seeds and _run_json(tmp_path)["history"][-1]["event"] == "resume"
    assert json.loads(lay.summary.read_text())["retry"]["batches"] == summary["retry"]["batches"]

    again = evolve_flow(EvolveParams(out=p.out, base_url=server.base_url, retry=True))
    assert again["retry"]["nothing_to_retry"] and again["run_id"] == summary["run_id"]  # the run's summary, as it was
    assert len(server.posts()) - sent == 3

    from evolforge.tasks.core.checks import InputError

    with pytest.raises(InputError, match=r"no run in .*none \(run\.json missing\)"):
        evolve_flow(EvolveParams(out=str(tmp_path / "none"), retry=True))
    assert not (tmp_path / "none").exists()
