"""What a stage shows when it ends: its plots (PNG files in OUT/plots/ and one markdown artifact on the Prefect
run) and, for a stage that makes datasets, the dataset card beside them. A plot that cannot be drawn is a
warning, never a failed stage: the data is already written.

`progress_artifacts`: the live progress of a stage without batches (tasks/core/progress.StepProgress: training
steps, sessions) in Prefect progress artifacts, the same line the terminal shows."""

from __future__ import annotations

import contextlib
import re
import time
from typing import Callable

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from evolforge.storage.cards import write_dataset_card
from evolforge.storage.folder import OutputFolder
from evolforge.storage.fs import AnyPath
from evolforge.storage.plots import write_plots
from evolforge.tasks.core import progress as live_progress
from evolforge.tasks.report.markdown import plots_markdown


@contextlib.contextmanager
def progress_artifacts(key: str, prefix: str, every: float = 5.0):
    """While the block runs, every StepProgress whose `what` starts with `prefix` gets a Prefect progress
    artifact keyed `<key>-<what in lower case, dashes>` (key "train-reward-progress", what "train irm":
    "train-reward-progress-train-irm"), updated when it finishes and at most every `every` seconds before; its
    description is the progress line."""
    artifacts: dict[str, tuple[object, float]] = {}

    def mirror(snap: dict) -> None:
        if not snap.get("unit") or not snap["what"].startswith(prefix):
            return
        what, now = snap["what"], time.monotonic()
        line = live_progress.progress_line(snap)
        percent = round(100.0 * snap["fraction"], 2)
        if what not in artifacts:
            slug = re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")
            artifacts[what] = (create_progress_artifact(progress=percent, key=f"{key}-{slug}", description=line), now)
        elif snap["finished"] or now - artifacts[what][1] >= every:
            update_progress_artifact(artifacts[what][0], progress=percent, description=line)
            artifacts[what] = (artifacts[what][0], now)

    with live_progress.listening(mirror):
        yield


def attach_plots(folder: OutputFolder, key: str, title: str, draw: Callable[[], dict[str, bytes]]) -> dict[str, str]:
    """Draw, write OUT/plots/<name>.png and create the markdown artifact `key`; returns name -> path."""
    logger = get_run_logger()
    try:
        plots = draw()
        paths = write_plots(folder, plots)
        create_markdown_artifact(key=key, markdown=plots_markdown(title, plots, paths),
                                 description=f"{title}: {', '.join(plots)} (PNG files in {folder.plots_dir})")
    except Exception as e:  # noqa: BLE001  plots are a view on written data
        logger.warning("could not draw the %s: %s: %s", title.lower(), type(e).__name__, e)
        return {}
    logger.info("plots: %s", ", ".join(paths.values()))
    return paths


def attach_card(folder: AnyPath, tables: dict[str, AnyPath], content: dict) -> str | None:
    """Write the dataset card (README.md) of `folder`; returns its path (None, with a warning, when it fails)."""
    try:
        return str(write_dataset_card(folder, tables, **content))
    except Exception as e:  # noqa: BLE001
        get_run_logger().warning("could not write the dataset card of %s: %s: %s", folder, type(e).__name__, e)
        return None
