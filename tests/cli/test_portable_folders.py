"""Portable run folders: what a run folder records about its own files is relative to it (the dedup index inside
it), so a folder moved or copied elsewhere resumes as is, without --dedup-index naming its old place."""

from __future__ import annotations

import json
import shutil

from evolforge.storage.folder import from_folder, in_folder
from evolforge.storage.layout import RunLayout
from evolforge.tasks.evolve.dedup_round import run_index
from evolforge.tasks.evolve.stage import EvolveParams, _same_index


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
