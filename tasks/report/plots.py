"""The run plots, each a pure function of a stage's summary data -> PNG bytes (matplotlib, Agg backend).

Every plot is drawn even without data (a figure saying so), so a stage always writes the same set of files.
"""

from __future__ import annotations

import functools
import io

DPI = 110
# matplotlib's "tab10" palette (the same colours, exactly: to_rgb of each is tab10's value)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")


@functools.cache
def pyplot():
    """matplotlib.pyplot on the headless Agg backend, imported when the first plot is drawn: importing it takes
    about 0.4 s, which every command that imports a report module (its stage's flow) would pay at start."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display, no GUI toolkit
    import matplotlib.pyplot

    return matplotlib.pyplot


class _Pyplot:
    """`plt` for the report modules: matplotlib.pyplot, imported on first use (see pyplot)."""

    def __getattr__(self, name: str):
        return getattr(pyplot(), name)


plt = _Pyplot()


def integer_ticks(axis) -> None:
    """Whole-number ticks on one axis (ax.xaxis or ax.yaxis)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def png(fig) -> bytes:
    """A matplotlib Figure as PNG bytes; the figure is closed."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def empty_plot(title: str, what: str) -> bytes:
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.set_title(title)
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_axis_off()
    return png(fig)


def cost_and_tokens_by_stage(by_stage: list[dict]) -> bytes:
    """Per model stage (ledger `stage`): prompt and completion tokens (stacked) and USD; an unpriced stage's cost
    is marked 'unknown', never drawn as 0."""
    title = "Tokens and cost per stage"
    merged: dict[str, dict] = {}
    for s in by_stage:  # the ledger groups by (stage, model): one bar per stage
        m = merged.setdefault(s["stage"], {"prompt": 0, "completion": 0, "usd": 0.0, "unknown": False})
        m["prompt"] += int(s.get("prompt_tokens") or 0)
        m["completion"] += int(s.get("completion_tokens") or 0)
        if s.get("cost_usd") is None or s.get("unpriced_calls"):
            m["unknown"] = True
        else:
            m["usd"] += float(s["cost_usd"])
    if not merged:
        return empty_plot(title, "no model calls")
    stages = list(merged)
    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(max(8.0, 1.3 * len(stages) + 4), 4))
    prompt = [merged[s]["prompt"] for s in stages]
    completion = [merged[s]["completion"] for s in stages]
    ax_t.bar(stages, prompt, color=COLORS[0], label="prompt")
    ax_t.bar(stages, completion, bottom=prompt, color=COLORS[1], label="completion")
    ax_t.set_ylabel("tokens")
    ax_t.set_title("Tokens", pad=22)
    ax_t.legend(fontsize=8, ncols=2, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    usd = [0.0 if merged[s]["unknown"] else merged[s]["usd"] for s in stages]
    bars = ax_c.bar(stages, usd, color=COLORS[2])
    ax_c.bar_label(bars, labels=["unknown" if merged[s]["unknown"] else f"${merged[s]['usd']:.4g}" for s in stages],
                   fontsize=8, padding=2)
    ax_c.set_ylim(0, (max(usd) or 1.0) * 1.2)
    ax_c.set_ylabel("USD")
    ax_c.set_title("Cost")
    for ax in (ax_t, ax_c):
        ax.tick_params(axis="x", labelrotation=30 if len(stages) > 3 else 0)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    return png(fig)


def score_histograms(scores: dict[str, list[float]], healthy: tuple[float, float], title: str) -> bytes:
    """One histogram per score set (0..1, 20 bins) with the healthy-mean band, the set's mean and the 0.5 line."""
    names = list(scores)
    if not names:
        return empty_plot(title, "no scores")
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names) + 0.5, 3.9), squeeze=False)
    for ax, name in zip(axes[0], names):
        vals = [float(s) for s in scores[name] if s is not None]
        ax.axvspan(*healthy, color="green", alpha=0.08, label=f"healthy mean {healthy[0]}-{healthy[1]}")
        ax.axvline(0.5, color="gray", lw=0.8, ls=":")
        if vals:
            ax.hist(vals, bins=20, range=(0, 1), color=COLORS[0], edgecolor="white")
            mean = sum(vals) / len(vals)
            ax.axvline(mean, color=COLORS[3], lw=1.5, label=f"mean {mean:.2f}")
        else:
            ax.text(0.5, 0.5, "no scores", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_xlim(-0.02, 1.02)
        integer_ticks(ax.yaxis)
        ax.set_title(f"{name} (n={len(vals)})", pad=24)
        ax.set_xlabel("score")
        ax.set_ylabel("count")
        # above the axes, under the title: never over a bar
        ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
    fig.suptitle(title)
    return png(fig)


# ----------------------------------------------------------------- the plots of each stage


# ----------------------------------------------------------------- PPO (GRPO smoke run), trajectories, modules

def finite(values) -> list[float]:
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if f == f and f not in (float("inf"), float("-inf")):
            out.append(f)
    return out


def hist(ax, values: list[float], name: str, xlabel: str, color, log: bool = False, integer: bool = False) -> None:
    vals = finite(values)
    if not vals:
        ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes, color="gray")
    else:
        lo, hi = min(vals), max(vals)
        if integer:
            bins = [b - 0.5 for b in range(int(lo), int(hi) + 2)] if hi - lo < 40 else 20
        else:
            bins = 20
        ax.hist(vals, bins=bins, color=color, edgecolor="white", log=log)
        mean = sum(vals) / len(vals)
        ax.axvline(mean, color="black", lw=1, ls="--", label=f"mean {mean:.3g}")
        ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        if integer:
            integer_ticks(ax.xaxis)
    integer_ticks(ax.yaxis)
    ax.set_title(f"{name} (n={len(vals)})", pad=20)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.grid(axis="y", alpha=0.3)


MODULE_OUTCOMES = (("ok", "valid (schema passed)"), ("invalid", "invalid"), ("truncated", "truncated"),
                   ("error", "endpoint error"))


