"""Where a stage's plots go: OUT/plots/<name>.png, written atomically (local folder or fsspec URL)."""

from __future__ import annotations

from evolforge.storage.folder import OutputFolder
from evolforge.storage.fs import AnyPath, ensure_dir, list_files, write_bytes_atomic


def plot_path(folder: OutputFolder, name: str) -> AnyPath:
    return folder.plots_dir / f"{name}.png"


def write_plots(folder: OutputFolder, plots: dict[str, bytes]) -> dict[str, str]:
    """Write each PNG to OUT/plots/<name>.png; returns name -> path."""
    ensure_dir(folder.plots_dir)
    paths = {}
    for name, png in plots.items():
        path = plot_path(folder, name)
        write_bytes_atomic(path, png)
        paths[name] = str(path)
    return paths


def plot_files(folder: OutputFolder) -> list[AnyPath]:
    return list_files(folder.plots_dir, "*.png")
