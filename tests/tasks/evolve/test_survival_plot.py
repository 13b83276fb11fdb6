"""The survival plot (tasks/evolve/report.py survival_figure) keeps its labels and counts readable at many bars:
the figure grows with them, no two labels or counts overlap, and counts are drawn only when they fit."""

from __future__ import annotations

import io
import itertools
import os

import matplotlib.image
import pytest

from evolforge.tasks.evolve import prompts, report
from evolforge.tasks.report.plots import png

OPS = sorted(prompts.DIRECTION)


def rounds_of(n_ops: int, n_rounds: int) -> list[dict]:
    out = []
    for r in range(1, n_rounds + 1):
        rows = []
        for i, op in enumerate(OPS[:n_ops]):
            attempts = 40 + (i * 7 + r * 3) % 60
            accepted = (attempts * (i + r)) % (attempts + 1)
            rows.append({"operation": op, "direction": prompts.DIRECTION[op], "attempts": attempts,
                         "accepted": accepted, "survival": accepted / attempts})
        out.append({"round": r, "by_operation": rows})
    return out


def extents(fig):
    """Window extents (pixels) of the y tick labels and of the count texts, after the layout png() applies."""
    fig.tight_layout()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    ticks = [t.get_window_extent(renderer) for t in ax.get_yticklabels() if t.get_text()]
    counts = [t.get_window_extent(renderer) for t in ax.texts]
    return ticks, counts


def overlapping(boxes) -> list[tuple[int, int]]:
    return [(i, j) for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2) if a.overlaps(b)]


@pytest.mark.parametrize("n_ops,n_rounds", [(len(OPS), 6), (6, 12), (3, 40), (2, 1)])
def test_labels_and_counts_never_overlap_and_every_count_is_drawn(n_ops, n_rounds):
    n_ops = min(n_ops, len(OPS))
    fig = report.survival_figure(rounds_of(n_ops, n_rounds))
    ticks, counts = extents(fig)
    bars = n_ops * n_rounds
    assert len(ticks) == bars and len(counts) == bars  # a label and its count for every bar
    assert not overlapping(ticks) and not overlapping(counts)
    assert not any(t.overlaps(c) for t in ticks for c in counts)
    fig_box = fig.bbox
    for box in ticks + counts:  # all on the figure, none cut off
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig_box.x1 + 0.5 and box.y1 <= fig_box.y1 + 0.5
    heights = [c.height for c in counts]
    assert min(heights) >= 7 * fig.dpi / 72 * 0.9  # the counts keep their 7-point size
    if os.environ.get("EVOLFORGE_PLOT_DIR"):  # to look at
        with open(os.path.join(os.environ["EVOLFORGE_PLOT_DIR"], f"survival_{n_ops}x{n_rounds}.png"), "wb") as fh:
            fh.write(png(fig))


def test_the_figure_grows_with_the_bars_and_the_png_is_the_figure():
    small = report.survival_figure(rounds_of(3, 2)).get_size_inches()[1]
    large = report.survival_figure(rounds_of(6, 12)).get_size_inches()[1]
    assert large > 3 * small
    image = matplotlib.image.imread(io.BytesIO(report.survival_by_operation(rounds_of(6, 12))), format="png")
    assert image.shape[0] >= 0.95 * large * 110  # drawn at the grown size (plots.DPI)


def test_bars_beyond_the_largest_figure_draw_no_counts_rather_than_overlapping_ones():
    fig = report.survival_figure(rounds_of(len(OPS), 60))  # hundreds of bars
    assert fig.get_size_inches()[1] <= report.MAX_PLOT_INCHES
    ticks, counts = extents(fig)
    assert counts == [] and not overlapping(ticks)
