"""`evolforge retry` and the per-round dedup: the reopened round's dedup is redone over all its accepted records,
and what the run put in the dedup index for that round and the superseded later ones is rolled back first."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.cli import main as cli_main
from evolforge.config.sections.dedup import DedupSettings
from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.storage.layout import RunLayout
from evolforge.tasks.dedup.index import DedupIndex

pytestmark = pytest.mark.usefixtures("prefect_harness")
SAME = "Write a short poem about the sea at night."
TOPICS = ["volcanoes", "tax law", "chess openings", "bread baking", "jazz history", "satellites", "bees", "glass"]
OTHER_TOPICS = ["tides", "opera", "knots", "lichens", "origami", "comets", "falconry", "typography"]
NO_EMB = {"embedding": False}


def _seeds(tmp_path, topics):
    p = tmp_path / f"seeds-{topics[0]}.jsonl"
    prefix = "s" if topics is TOPICS else "o"  # ids are unique within a run; two runs on one index get their own
    p.write_text("\n".join(json.dumps({"id": f"{prefix}{i}", "instruction": f"Explain the basics of {t} to a beginner."})
                           for i, t in enumerate(topics)) + "\n")
    return p


def _params(tmp_path, server, out, topics=TOPICS, **kw):
    # one record in flight (one batch at a time, one record at a time): the scripted 400 hits s0's first call
    overrides = {"evol_instruct": {"batch_size": 2, "concurrency": 1}, "runner": {"max_workers": 1},
                 "dedup": NO_EMB,
                 "gateway": {"backoff_base_seconds": 0.0, "backoff_max_seconds": 0.0, "timeout_seconds": 2.0}}
    return EvolveParams(seeds=str(_seeds(tmp_path, topics)), out=str(tmp_path / out), rounds=2, base_url=server.base_url,
                        overrides=overrides, **kw)


def _lineage(lay: RunLayout) -> pl.DataFrame:
    return pl.read_parquet(lay.lineage).select("id", "round", "status", "elimination_rule", "duplicate_of").sort("id")


def _decisions(lay: RunLayout, r: int) -> pl.DataFrame:
    return pl.read_parquet(lay.round_dedup(r)).select("id", "duplicate_of", "method").sort("id")


def _index_ids(index_dir) -> list[str]:
    return DedupIndex(index_dir, DedupSettings(**NO_EMB)).load().ids


def _ids(path) -> set[str]:
    return set(pl.read_parquet(path)["id"])


def test_retry_redoes_the_rounds_dedup_and_matches_a_clean_run(tmp_path, server, capsys):
    # s0's and s3's evolutions are the same text: in a clean run s3's is dropped as a duplicate of s0's
    server.evolve_overrides = {"volcanoes": SAME, "bread baking": SAME}
    clean = RunLayout(tmp_path / "clean")
    evolve_flow(_params(tmp_path, server, "clean"))
    assert _lineage(clean).filter(pl.col("elimination_rule") == "duplicate_exact").height >= 1

    server.script("400")  # the endpoint rejects s0's evolution: in this run s3's copy is the one kept
    lay = RunLayout(tmp_path / "out")
    evolve_flow(_params(tmp_path, server, "out"))
    faulted = pl.read_parquet(lay.lineage)
    assert faulted.filter(pl.col("status") == "error")["parent_id"].to_list() == ["s0"]
    assert not _decisions(lay, 1).equals(_decisions(clean, 1))

    capsys.readouterr()
    assert cli_main(["retry", "--out", str(lay.root), "--base-url", server.base_url]) == 0
    out = capsys.readouterr().out  # what was reopened and rolled back, then what `evolforge run` prints
    assert "round 1: redoing batches [0]; later rounds superseded: ['round_02']" in out
    assert f"dedup index {lay.dedup_index}: rolled back this run's rounds >= 1 (" in out
    assert out.index("redoing batches") < out.index("== evolforge run complete ==")
    assert _lineage(lay).equals(_lineage(clean))  # same kept ids, same eliminated rows by rule and duplicate_of
    for r in (1, 2):
        assert _decisions(lay, r).equals(_decisions(clean, r))
    for name in ("evolved", "final_pool"):
        assert _ids(getattr(lay, name)) == _ids(getattr(clean, name))
    # the index holds exactly what a clean run put there: the seeds and the kept evolutions, once each
    assert _index_ids(lay.dedup_index) == _index_ids(clean.dedup_index)
    assert set(_index_ids(lay.dedup_index)) == _ids(lay.evolved)
    assert list(lay.round_dir(1).glob("dedup.parquet.retry-*"))  # the old decisions, kept aside

    assert cli_main(["retry", "--out", str(lay.root), "--base-url", server.base_url]) == 0
    assert f"nothing to retry in {lay.root}: every batch finished without errors\n" in capsys.readouterr().out


def test_retry_rolls_back_a_shared_index_and_leaves_other_runs_entries(tmp_path, server, capsys):
    """Two runs on one index (as nights of a dataset): retrying one drops its superseded rounds from the index
    (rows that are no longer in its dataset), keeps the other run's entries, and redoes them in the same index."""
    shared = tmp_path / "shared_index"
    other = RunLayout(tmp_path / "other")
    evolve_flow(_params(tmp_path, server, "other", topics=OTHER_TOPICS, dedup_index=str(shared)))
    other_ids = _index_ids(shared)
    assert other_ids and set(other_ids) == _ids(other.evolved)

    server.script("400")
    lay = RunLayout(tmp_path / "run")
    evolve_flow(_params(tmp_path, server, "run", dedup_index=str(shared)))
    old_round2 = set(pl.read_parquet(lay.lineage).filter((pl.col("round") == 2) & (pl.col("status") == "accepted"))["id"])
    assert old_round2 and old_round2 <= set(_index_ids(shared))

    # the folder does not choose the index: without --dedup-index the retry stops, naming both, and touches nothing
    manifest = (shared / "manifest.json").read_bytes()
    assert cli_main(["retry", "--out", str(lay.root), "--base-url", server.base_url]) == 2
    err = capsys.readouterr().err
    assert str(shared) in err and str(lay.dedup_index) in err and "--dedup-index" in err
    assert (shared / "manifest.json").read_bytes() == manifest and not lay.dedup_index.exists()

    assert cli_main(["retry", "--out", str(lay.root), "--base-url", server.base_url, "--dedup-index", str(shared)]) == 0
    ids = _index_ids(shared)
    assert len(ids) == len(set(ids))
    assert ids[:len(other_ids)] == other_ids  # the other run's entries, untouched
    assert set(ids) - set(other_ids) == _ids(lay.evolved) - set(other_ids)
    # the superseded round's records are in the index only as far as they are in the run's dataset again
    assert old_round2 & set(ids) <= _ids(lay.evolved)
    lineage = pl.read_parquet(lay.lineage)
    assert set(lineage["status"]) <= {"accepted", "eliminated"}
    # nothing of round 2 was taken for a duplicate of its own superseded copy
    redone = lineage.filter(pl.col("round") == 2)
    assert not (set(redone["duplicate_of"].drop_nulls()) & set(redone["id"]))
    assert not lay.dedup_index.exists()  # the retry deduplicated against the run's own (shared) index


def test_retry_rolls_back_only_the_index_it_names(tmp_path, server):
    """dedup_run.json may list more indexes (planted, or left by an older evolforge): a retry rolls back only the
    one its parameters name, never another index the folder lists, inside or outside the folder."""
    import shutil

    server.script("400")
    lay = RunLayout(tmp_path / "run")
    evolve_flow(_params(tmp_path, server, "run"))
    outside = tmp_path / "outside_index"  # a copy holds this run's tagged segments: a rollback would drop them
    shutil.copytree(lay.dedup_index, outside)
    ref = json.loads(lay.dedup_run.read_text())
    lay.dedup_run.write_text(json.dumps({**ref, "indexes": [*ref["indexes"], str(outside)]}))
    before = {p.name: p.read_bytes() for p in outside.iterdir() if p.is_file()}

    assert cli_main(["retry", "--out", str(lay.root), "--base-url", server.base_url]) == 0
    assert {p.name: p.read_bytes() for p in outside.iterdir() if p.is_file()} == before
    assert set(_index_ids(lay.dedup_index)) == _ids(lay.evolved)  # the named index was rolled back and redone
