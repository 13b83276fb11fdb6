"""ref_tree: another commit's code importable as evolforge, removed afterwards."""

from __future__ import annotations

import os
import subprocess
import sys

from evolforge.testing.ref_tree import ROOT, ref_tree


def test_a_commit_is_importable_from_its_worktree_and_the_worktree_goes_away(tmp_path):
    with ref_tree("HEAD", tmp_path) as (tree, pythonpath):
        assert (tree / "testing" / "__init__.py").exists()
        proc = subprocess.run([sys.executable, "-c", "import evolforge; print(evolforge.__file__)"],
                              env={**os.environ, "PYTHONPATH": pythonpath}, capture_output=True, text=True, cwd="/")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().startswith(pythonpath), proc.stdout
    assert not tree.exists()
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert str(tree) not in listed
