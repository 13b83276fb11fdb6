"""Another commit's code, importable as `evolforge`, for benchmarks that compare this checkout with it side by side.

    with ref_tree("f0644df~1") as (tree, pythonpath):
        subprocess.run([sys.executable, str(tree / "bench" / "x.py")], env={**os.environ, "PYTHONPATH": pythonpath})

`tree` is a temporary `git worktree` of the commit; `pythonpath` is a folder holding only an `evolforge` link to it,
which shadows this venv's editable install when put first on PYTHONPATH. The worktree is removed on exit.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def ref_tree(ref: str, work: Path | None = None) -> Iterator[tuple[Path, str]]:
    """(the worktree of `ref`, the PYTHONPATH entry that imports it as evolforge), in `work` (default: a new
    temporary folder, left for the caller's other files)."""
    work = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="evolforge-ref-"))
    tree = work / "ref-tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref], check=True,
                   capture_output=True)
    try:
        shadow = work / "shadow"
        shadow.mkdir()
        (shadow / "evolforge").symlink_to(tree)
        yield tree, str(shadow)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False,
                       capture_output=True)
