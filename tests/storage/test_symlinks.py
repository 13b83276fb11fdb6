"""Writes inside an output folder never follow a symbolic link: a link planted in the folder (a journal, the
dataset folder, the ledger, a model folder) cannot make a run write, append, create, move or delete outside it.
The output root itself may be a link: it is resolved once, when the folder is opened."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from evolforge.storage import fs
from evolforge.storage.cards import write_dataset_card
from evolforge.storage.fs import UnsafeOutputPath
from evolforge.storage.journal import CallJournal
from evolforge.storage.layout import RunLayout
from evolforge.storage.locks import lock_file
from evolforge.storage.logs import AppendLog
from evolforge.storage.parts import write_table_atomic
from evolforge.storage.plots import write_plots

TABLE = pa.table({"id": ["a"], "instruction": ["x"]})


@pytest.fixture
def victim(tmp_path):
    """A folder outside the output folder, with files an attacker would like overwritten."""
    d = tmp_path / "victim"
    d.mkdir()
    (d / "README.md").write_text("the victim's own card\n")
    (d / "passwd").write_text("root:x:0:0\n")
    return d


def _untouched(victim) -> None:
    assert sorted(os.listdir(victim)) == ["README.md", "passwd"]
    assert (victim / "README.md").read_text() == "the victim's own card\n"
    assert (victim / "passwd").read_text() == "root:x:0:0\n"


def test_a_planted_journal_link_gets_no_lines(tmp_path, victim):
    lay = RunLayout(tmp_path / "out")
    journal = lay.round_set(1).journal(0)
    journal.parent.mkdir(parents=True)
    journal.symlink_to(victim / "passwd")
    with pytest.raises(UnsafeOutputPath, match=f"{journal}.*symbolic link"):
        with CallJournal(journal) as j:
            j.put("call", {"content": "appended"})
    ledger = lay.ledger_dir / "proc.jsonl"
    ledger.parent.mkdir()
    ledger.symlink_to(victim / "passwd")
    with pytest.raises(UnsafeOutputPath, match=str(ledger)):
        AppendLog(ledger)
    _untouched(victim)


def test_a_planted_dataset_link_gets_no_card_and_no_parquet(tmp_path, victim):
    lay = RunLayout(tmp_path / "out")
    lay.root.mkdir()
    lay.summary.write_text("{}")
    (lay.root / "dataset").symlink_to(victim, target_is_directory=True)
    with pytest.raises(UnsafeOutputPath):
        lay.ensure()
    with pytest.raises(UnsafeOutputPath, match=f"{lay.evolved}: {lay.root / 'dataset'} is a symbolic link"):
        write_table_atomic(TABLE, lay.evolved)
    with pytest.raises(UnsafeOutputPath, match=str(lay.root / "dataset" / "README.md")):
        write_dataset_card(lay.root / "dataset", {"evolved": lay.evolved}, title="t", description="d", sections={},
                           facts={})
    with pytest.raises(UnsafeOutputPath):
        fs.write_json_atomic(lay.root / "dataset" / "README.md", {})
    with pytest.raises(UnsafeOutputPath):
        fs.ensure_dir(lay.sft.parent)  # no folder created through the link
    with pytest.raises(UnsafeOutputPath):
        fs.unlink(lay.root / "dataset" / "passwd")  # nor a file deleted through it
    with pytest.raises(UnsafeOutputPath):
        fs.replace(lay.summary, lay.root / "dataset" / "passwd")  # nor moved onto
    _untouched(victim)


def test_links_to_folders_anywhere_below_the_root_are_refused(tmp_path, victim):
    root = tmp_path / "out"
    root.mkdir()
    for name in ("plots", "models", "dedup_index"):
        (root / name).symlink_to(victim, target_is_directory=True)
    lay = RunLayout(root)
    with pytest.raises(UnsafeOutputPath):
        write_plots(lay, {"survival": b"png"})
    with pytest.raises(UnsafeOutputPath):
        with fs.atomic_dir(root / "models" / "irm") as tmp:
            (tmp / "config.json").write_text("{}")
    with pytest.raises(UnsafeOutputPath):
        with lock_file(root / "dedup_index" / ".lock", timeout=1):
            pass
    (root / "logs").symlink_to(victim, target_is_directory=True)
    with pytest.raises(UnsafeOutputPath):
        lay.ensure()
    _untouched(victim)


def test_a_link_as_the_file_itself_is_replaced_not_followed(tmp_path, victim):
    """An atomic write replaces a link planted at its own name (the link goes, the target stays)."""
    lay = RunLayout(tmp_path / "out")
    lay.ensure()
    lay.summary.symlink_to(victim / "passwd")
    fs.write_json_atomic(lay.summary, {"ok": True})
    assert not lay.summary.is_symlink() and fs.read_json(lay.summary) == {"ok": True}
    _untouched(victim)


def test_a_linked_output_root_is_resolved_once_and_written_inside(tmp_path, victim):
    real = tmp_path / "big-disk" / "run"
    real.mkdir(parents=True)
    link = tmp_path / "run"
    link.symlink_to(real, target_is_directory=True)
    lay = RunLayout(link)
    assert lay.root == real  # resolved when the folder is opened
    lay.ensure()
    write_table_atomic(TABLE, lay.evolved)
    with CallJournal(lay.round_set(1).journal(0)) as j:
        j.put("call", {"content": "ok"})
    assert (real / "dataset" / "evolved.parquet").exists()
    assert (real / "rounds" / "round_01" / "journal" / "batch_00000.jsonl").read_text().count("\n") == 1
    # a path that is not the resolved root (the link itself) is refused: roots are resolved by opening the folder
    with pytest.raises(UnsafeOutputPath, match=f"{link} is a symbolic link"):
        fs.write_text_atomic(link / "x.txt", "x")
    _untouched(victim)
