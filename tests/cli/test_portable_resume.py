"""Portable run folders (issue 34): an evolve run stopped after round 1, its folder AND its seed file moved
elsewhere (the old paths gone), resumed for round 2 from the new places: no finished call is sent again (the
server's request log and the ledger), and nothing under the old paths is opened or listed while it resumes (an
audit hook on open / listdir / scandir: Python's own file access; the tables polars reads in Rust are not seen,
but the old paths are gone, so such a read would fail). A retry of a copy with no `run` before it reads nothing of
the original either, and a copied synthesis folder resumes from its own input snapshot."""

from __future__ import annotations

import json
import shutil
import sys

import polars as pl
import pytest

from evolforge.cli import main
from evolforge.storage.ledger import read_ledger
from evolforge.testing.scripted_server import ScriptedServer

_WATCH: list[str] = []  # the old paths while a resume runs; empty otherwise
_SEEN: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if _WATCH and event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes)):
        path = args[0].decode() if isinstance(args[0], bytes) else args[0]
        if any(path == old or path.startswith(old + "/") for old in _WATCH):
            _SEEN.append(f"{event} {path}")


sys.addaudithook(_audit)  # hooks cannot be removed: it watches only while _WATCH names paths


def _watching(old: list[str], argv: list[str], capsys) -> int:
    _WATCH[:], _SEEN[:] = old, []
    try:
        return main(argv)
    finally:
        _WATCH.clear()
        assert not _SEEN, f"{argv[0]} on the moved folder read its old paths: {_SEEN[:5]}"
        capsys.readouterr()


@pytest.mark.long("two `evolforge run`s and a retry through the command on the scripted server (~31 s CPU)")
def test_a_moved_run_and_seed_file_resume_round_two_without_repeating_a_call(tmp_path, capsys):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Add {i} and {i + 3}, then explain."}) + "\n"
                             for i in range(3)))
    out = tmp_path / "out"
    with ScriptedServer() as srv:
        base = ["--base-url", srv.base_url, "--model", "scripted"]
        assert main(["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "1", *base]) == 0, \
            capsys.readouterr().err[-3000:]
        first = [r["key"] for r in srv.posts()]
        new_root = tmp_path / "elsewhere"
        new_root.mkdir()
        moved, moved_seeds = new_root / "run", new_root / "my-seeds.jsonl"
        shutil.move(str(out), str(moved))
        shutil.move(str(seeds), str(moved_seeds))
        old = [str(out), str(seeds)]

        code = _watching(old, ["run", "--seeds", str(moved_seeds), "--out", str(moved), "--rounds", "2", *base],
                         capsys)
        assert code == 0
        second = [r["key"] for r in srv.posts()[len(first):]]
        assert second and not set(second) & set(first)  # round 2 only: no round-1 call asked again
        ledger = read_ledger(moved)
        assert ledger.filter(pl.col("stage") != "preflight").height == len(first) + len(second)
        assert sorted(pl.read_parquet(moved / "dataset" / "lineage.parquet")["round"].unique()) == [1, 2]

        # a retry straight after the move (no `run` first): the record still names the moved seed file's old place
        copied = new_root / "copy"
        shutil.copytree(moved, copied)
        shutil.move(str(moved_seeds), str(new_root / "seeds-again.jsonl"))
        sent = len(srv.posts())
        assert _watching([str(moved), str(moved_seeds)], ["retry", "--out", str(copied), "--base-url",
                                                          srv.base_url], capsys) == 0
        assert len(srv.posts()) == sent  # nothing to retry, nothing sent


@pytest.mark.usefixtures("prefect_harness")
def test_a_copied_synthesis_folder_resumes_from_its_own_snapshot(tmp_path, capsys):
    """Another stage's folder: a synthesis run copied elsewhere with its seed file, the originals then changed
    (a folder at the old place that is not this run's), resumes from the copy: no call sent, no old path read."""
    from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow

    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(json.dumps({"id": "m1", "domain": "math",
                                 "instruction": "A shop sells 3 boxes of 4 apples each. How many apples?"}) + "\n")
    out = tmp_path / "synth"
    overrides = {"synthesis": {"budget_usd_per_task": 0}, "gateway": {"backoff_base_seconds": 0.0}}
    with ScriptedServer() as srv:
        first = synthesize_flow(SynthesizeParams(seeds=str(seeds), out=str(out), base_url=srv.base_url,
                                                 model="scripted", overrides=overrides))
        sent = len(srv.posts())
        copy, copy_seeds = tmp_path / "elsewhere" / "synth", tmp_path / "elsewhere" / "seeds.jsonl"
        shutil.copytree(out, copy)
        shutil.copy(seeds, copy_seeds)
        _WATCH[:], _SEEN[:] = [str(out), str(seeds)], []
        try:
            again = synthesize_flow(SynthesizeParams(seeds=str(copy_seeds), out=str(copy), base_url=srv.base_url,
                                                     model="scripted", overrides=overrides))
        finally:
            _WATCH.clear()
        assert not _SEEN, f"the copy read its original's paths: {_SEEN[:5]}"
        assert len(srv.posts()) == sent and again["kept"] == first["kept"] == 1


@pytest.mark.usefixtures("prefect_harness")
def test_a_moved_folder_retries_its_failed_batch_whatever_lies_at_the_old_seed_path(tmp_path):
    """A run with two rejected records, its folder moved, and another file written where its seed file was: the
    retry of the moved folder resends only the two failed records (its seeds are in the folder since round 1),
    without opening the old seed path (which it once refused as a changed seed file)."""
    from evolforge.flows.evolve import EvolveParams, evolve_flow

    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Plan a trip to city number {i}."}) + "\n"
                             for i in range(4)))
    out = tmp_path / "out"
    with ScriptedServer() as srv:
        srv.script("400", "400")  # two records' first call is rejected: kept as status=error, to retry
        evolve_flow(EvolveParams(seeds=str(seeds), out=str(out), rounds=1, base_url=srv.base_url, model="scripted",
                                 overrides={"evol_instruct": {"batch_size": 2},
                                            "gateway": {"backoff_base_seconds": 0.0, "max_retries": 1}}))
        moved = tmp_path / "elsewhere" / "run"
        moved.parent.mkdir()
        shutil.move(str(out), str(moved))
        seeds.write_text(json.dumps({"instruction": "Someone else's seeds, written at the old place."}) + "\n")
        sent = len(srv.posts())
        _WATCH[:], _SEEN[:] = [str(out), str(seeds)], []
        try:
            code = main(["retry", "--out", str(moved), "--base-url", srv.base_url])
        finally:
            _WATCH.clear()
        assert code == 0
        assert not _SEEN, f"the retry read the old paths: {_SEEN[:5]}"
        assert len(srv.posts()) - sent == 6  # the two failed records, 3 calls each
    lineage = pl.read_parquet(moved / "dataset" / "lineage.parquet")
    assert lineage.height == 4 and set(lineage["status"]) == {"accepted"}


def test_a_moved_nightly_dataset_resumes_a_night_against_its_own_index(tmp_path):
    """A night's folder is deduplicated against the dataset's index, outside the night's folder
    (DATASET/dedup_index beside DATASET/nights/DATE): the dataset moved whole, the night resumes against the index
    at its new place without naming it; the index's old absolute path is still accepted when named."""
    from evolforge.storage.layout import RunLayout
    from evolforge.storage.nights import NightlyFolder
    from evolforge.tasks.evolve.dedup_round import rollback_run, run_index
    from evolforge.tasks.evolve.stage import EvolveParams, _same_index

    old = NightlyFolder(tmp_path / "dataset")
    night = RunLayout(old.night_dir("2026-12-01")).ensure()
    tag = run_index(night, old.dedup_index)[1]
    shutil.move(str(old.root), str(tmp_path / "moved"))
    new = NightlyFolder(tmp_path / "moved")
    night = RunLayout(new.night_dir("2026-12-01"))
    _same_index(night, EvolveParams(out=str(night.root), dedup_index=str(new.dedup_index)))
    assert run_index(night, new.dedup_index) == (new.dedup_index, tag)  # the same run tag: its segments
    assert rollback_run(night, 1, tmp_path / "elsewhere_index", None) == []  # an index it never used: untouched
    _same_index(night, EvolveParams(out=str(night.root), dedup_index=str(old.dedup_index)))  # the recorded path
    with pytest.raises(Exception, match="records the dedup index"):
        _same_index(night, EvolveParams(out=str(night.root), dedup_index=str(tmp_path / "another_index")))
