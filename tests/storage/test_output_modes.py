"""Output files and folders follow the process's umask: datasets, parts, plots, cards, journals, ledgers, locks
and whole folders (trained models) are readable by whom the umask lets read them, not private to the writer."""

from __future__ import annotations

import os
import stat

import pyarrow as pa
import pytest

from evolforge.storage import fs, plots
from evolforge.storage.cards import write_dataset_card
from evolforge.storage.folder import OutputFolder
from evolforge.storage.journal import CallJournal
from evolforge.storage.locks import lock_file
from evolforge.storage.logs import AppendLog
from evolforge.storage.parts import write_table_atomic


@pytest.fixture
def umask():
    old = os.umask(0o022)
    try:
        yield lambda mask: os.umask(mask)
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _write_everything(root) -> tuple[list, list]:
    """(files, folders) written the ways a stage writes its output."""
    files = [
        write_table_atomic(pa.table({"x": [1, 2]}), root / "dataset" / "evolved.parquet"),
        fs.write_json_atomic(root / "summary.json", {"a": 1}),
        fs.write_text_atomic(root / "verl" / "overrides.txt", "a=1\n"),
    ]
    files.append(write_dataset_card(root / "dataset", {"evolved": files[0]}, title="t", description="d", sections={},
                                    facts={}))
    files += [fs.location(p) for p in plots.write_plots(OutputFolder(root), {"survival": b"\x89PNG"}).values()]
    log = AppendLog(root / "ledger" / "proc.jsonl")
    log.write(b"{}\n")
    log.close()
    with CallJournal(root / "rounds" / "round_01" / "journal" / "batch_00000.jsonl") as journal:
        journal.put("k", {"v": 1})
    with lock_file(root / "dedup_index" / ".lock", timeout=1):
        pass
    files += [root / "ledger" / "proc.jsonl", root / "rounds" / "round_01" / "journal" / "batch_00000.jsonl",
              root / "dedup_index" / ".lock"]
    with fs.atomic_dir(root / "models" / "irm") as tmp:
        (tmp / "config.json").write_text("{}")
    folders = [root / "dataset", root / "plots", root / "ledger", root / "rounds" / "round_01" / "journal",
               root / "models" / "irm", fs.ensure_dir(root / "logs" / "deep")]
    return files, folders


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002, 0o077])
def test_output_files_and_folders_follow_the_umask(tmp_path, umask, mask):
    umask(mask)
    files, folders = _write_everything(tmp_path / "out")
    assert {str(f): oct(_mode(f)) for f in files} == {str(f): oct(0o666 & ~mask) for f in files}
    assert {str(d): oct(_mode(d)) for d in folders} == {str(d): oct(0o777 & ~mask) for d in folders}


def test_explicit_permissions_are_kept(tmp_path, umask):
    umask(0o077)
    script = fs.write_text_atomic(tmp_path / "verl" / "submit.sh", "#!/bin/sh\n", permissions=0o755)
    assert _mode(script) == 0o755
