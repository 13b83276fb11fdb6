"""Portable run folders: what a run folder records about its own files is relative to it (the dedup index inside
it), so a folder moved or copied elsewhere resumes as is, without --dedup-index naming its old place; the seed file is known by its content hash (storage/run_record.py), so it may move too."""

from __future__ import annotations

import json
import shutil

import pytest

from evolforge.cli import main
from evolforge.storage.folder import from_folder, in_folder
from evolforge.storage.layout import RunLayout
from evolforge.tasks.evolve.dedup_round import run_index
from evolforge.tasks.evolve.stage import EvolveParams, _same_index
from evolforge.testing.scripted_server import ScriptedServer


def test_a_moved_run_folder_names_its_own_dedup_index(tmp_path):
    old = RunLayout(tmp_path / "old").ensure()
    run_index(old, old.dedup_index)
    assert json.loads(old.dedup_run.read_text())["indexes"] == ["dedup_index"]
    shutil.move(str(old.root), str(tmp_path / "moved"))
    moved = RunLayout(tmp_path / "moved")
    _same_index(moved, EvolveParams(out=str(moved.root)))  # no --dedup-index needed
    assert run_index(moved, moved.dedup_index)[0] == moved.dedup_index


def test_paths_outside_the_folder_stay_absolute(tmp_path):
    assert in_folder(tmp_path / "run", tmp_path / "shared_index") == str(tmp_path / "shared_index")
    assert in_folder(tmp_path / "run", tmp_path / "run" / "dedup_index") == "dedup_index"
    assert from_folder(tmp_path / "run", "dedup_index") == str(tmp_path / "run" / "dedup_index")
    assert from_folder(tmp_path / "run", "s3://bucket/index") == "s3://bucket/index"


@pytest.mark.long("a whole run through the command, then a resume and a retry of its moved folder")
def test_a_moved_folder_resumes_and_retries_without_its_old_paths(tmp_path, capsys):
    """The folder and its seed file moved (the old seed path gone): `run` with the seed file at its new place
    resumes (the content hash matches) and `retry` needs no seed path at all; neither repeats a finished call."""
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Add {i} and {i + 3}, then explain."}) + "\n"
                             for i in range(2)))
    out = tmp_path / "out"
    with ScriptedServer() as srv:
        assert main(["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "1", "--base-url", srv.base_url,
                     "--model", "scripted"]) == 0, capsys.readouterr().err[-3000:]
        calls = len(srv.posts())
        assert calls > 0
        moved, moved_seeds = tmp_path / "elsewhere" / "run", tmp_path / "elsewhere" / "my-seeds.jsonl"
        moved.parent.mkdir()
        shutil.move(str(out), str(moved))
        shutil.move(str(seeds), str(moved_seeds))
        capsys.readouterr()
        assert main(["run", "--seeds", str(moved_seeds), "--out", str(moved), "--rounds", "1", "--base-url",
                     srv.base_url, "--model", "scripted"]) == 0, capsys.readouterr().err[-3000:]
        assert main(["retry", "--out", str(moved), "--base-url", srv.base_url]) == 0, capsys.readouterr().err[-3000:]
        assert len(srv.posts()) == calls  # nothing finished is asked again
