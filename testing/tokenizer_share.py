"""The embedded model's tokenizer, converted from its GGUF once per machine for the test processes.

The product converts the GGUF's tokenizer to a transformers folder on first use (about 8 s of CPU) and keeps it in
the temporary folder (storage/trajectory_sets.py `tokenizer_cache`: `$TMPDIR/evolforge-cache/tokenizers/...`), so
a user pays it once per machine. Each test worker has a temporary folder of its own, removed at its end: every
worker that ran a test with the default tokenizer converted it again, in every run (measured: 8.2 s of CPU each,
up to one per worker). Here the worker's folder is filled from a copy kept per machine, and the first conversion
(made by the product's own code, in a test) is copied there for the next processes.

The copy is kept under `$EVOLFORGE_CACHE or ~/.cache/evolforge/test-tokenizers/`, keyed by the product's own
cache key (the GGUF file's path, size and time) and the versions of transformers and gguf, which do the
conversion: a new version or model converts again, in a test. Delete the folder to convert again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _versions() -> str:
    out = []
    for name in ("transformers", "gguf", "tokenizers"):
        try:
            out.append(f"{name}-{version(name)}")
        except PackageNotFoundError:
            out.append(f"{name}-none")
    return "_".join(out)


class TokenizerShare:
    """The worker's cache folder of the embedded model's tokenizer and the machine's copy of it."""

    def __init__(self) -> None:
        self.local: Path | None = None
        self.shared: Path | None = None
        try:
            from evolforge.storage.trajectory_sets import tokenizer_cache
            from evolforge.tasks.core.embedded_model import default_model_path

            self.local = tokenizer_cache(default_model_path())
        except Exception:  # noqa: BLE001 - no embedded model installed: nothing to share
            return
        root = Path(os.environ.get("EVOLFORGE_CACHE") or Path.home() / ".cache" / "evolforge")
        self.shared = root / "test-tokenizers" / _versions() / self.local.name
        # bound now: a test may hide modules from imports (sys.modules[name] = None) while these run
        from evolforge.storage.trajectory_sets import cached_tokenizer_ready, filling_tokenizer_cache

        self._is_ready, self._filling = cached_tokenizer_ready, filling_tokenizer_cache

    def _ready(self, folder: Path | None) -> bool:
        return folder is not None and self._is_ready(folder)

    def fill(self) -> bool:
        """Copy the machine's copy into the worker's cache folder, if there is one and the folder is empty."""
        if self.local is None or self._ready(self.local) or not self._ready(self.shared):
            return False
        with self._filling(self.local) as tmp:  # whole or nothing, as the product fills it
            shutil.copytree(self.shared, tmp, dirs_exist_ok=True)
        return True

    def keep(self) -> bool:
        """Copy the worker's converted tokenizer to the machine's copy, once (several workers may at once: the
        last one's whole copy stays)."""
        if self.shared is None or self._ready(self.shared) or not self._ready(self.local):
            return False
        self.shared.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.shared.parent / f".{self.shared.name}.{os.getpid()}"
        try:
            shutil.copytree(self.local, tmp)
            with contextlib.suppress(OSError):  # another process put its whole copy there first
                os.replace(tmp, self.shared)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return True
