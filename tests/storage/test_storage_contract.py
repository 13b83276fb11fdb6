"""storage/ keeps its promises: folders and files appear whole or not at all, markers included."""

from __future__ import annotations

import os

import fsspec
import pytest

from evolforge.storage import fs


def test_atomic_dir_appears_whole_or_not_at_all(tmp_path):
    dest = tmp_path / "model"
    with pytest.raises(RuntimeError):
        with fs.atomic_dir(dest) as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("killed mid-save")
    assert not dest.exists() and list(tmp_path.iterdir()) == []
    with fs.atomic_dir(dest) as tmp:
        (tmp / "config.json").write_text("{}")
    assert (dest / "config.json").read_text() == "{}"
    with fs.atomic_dir(dest) as tmp:  # replacing a folder drops its old files
        (tmp / "weights.bin").write_bytes(b"x")
    assert sorted(p.name for p in dest.iterdir()) == ["weights.bin"]


def test_an_interrupted_download_is_never_taken_for_a_complete_cache(monkeypatch):
    mem = fsspec.filesystem("memory")
    root = f"memory://contract-{os.getpid()}/models/irm"
    for name, data in (("a.bin", b"a"), ("reward_meta.json", b"{}"), ("z.bin", b"z")):
        mem.pipe(f"{root}/{name}", data)
    src = fs.location(root)
    real = type(mem).cat_file

    def flaky(self, path, *a, **kw):
        if path.endswith("z.bin"):
            raise OSError("connection reset")
        return real(self, path, *a, **kw)

    monkeypatch.setattr(type(mem), "cat_file", flaky)
    with pytest.raises(OSError):
        fs.local_copy(src, marker="reward_meta.json")
    assert not fs.scratch_dir("download", src).exists()  # no half folder with its marker in place
    monkeypatch.setattr(type(mem), "cat_file", real)
    local = fs.local_copy(src, marker="reward_meta.json")
    assert sorted(p.name for p in local.iterdir()) == ["a.bin", "reward_meta.json", "z.bin"]


def test_text_written_atomically_with_permissions_and_json_read_back(tmp_path):
    script = fs.write_text_atomic(tmp_path / "verl" / "submit.sh", "#!/bin/sh\n", permissions=0o755)
    assert os.stat(script).st_mode & 0o777 == 0o755
    assert fs.read_json(tmp_path / "missing.json") is None
    fs.write_json_atomic(tmp_path / "x.json", {"a": 1})
    assert fs.read_json(tmp_path / "x.json") == {"a": 1}
