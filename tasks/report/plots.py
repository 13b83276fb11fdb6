"""The run plots, each a pure function of a stage's summary data -> PNG bytes (matplotlib, Agg backend).

Every plot is drawn even without data (a figure saying so), so a stage always writes the same set of files.
"""

from __future__ import annotations

import io
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # headless: no display, no GUI toolkit

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

DPI = 110
COLORS = plt.get_cmap("tab10").colors


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def _empty(title: str, what: str) -> bytes:
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.set_title(title)
    ax.text(0.5, 0.5, what, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_axis_off()
    return _png(fig)


def _label(row: dict) -> str:
    op, direction = row.get("operation") or "?", row.get("direction")
    return f"{op} ({direction})" if direction else op


def survival_by_operation(rounds: list[dict]) -> bytes:
    """Share of attempts accepted, per evolution operation (bars) and round (one bar per round), with counts."""
    title = "Survival by operation and round"
    cells = {(_label(r), t["round"]): r for t in rounds for r in t.get("by_operation", [])}
    if not cells:
        return _empty(title, "no evolution attempts")
    ops = sorted({op for op, _ in cells})
    round_nos = sorted({r for _, r in cells})
    width = 0.8 / len(round_nos)
    fig, ax = plt.subplots(figsize=(min(13.0, max(6.0, 0.8 * len(ops) * len(round_nos) ** 0.5 + 2)), 4.6))
    for k, rno in enumerate(round_nos):
        xs, ys, notes = [], [], []
        for i, op in enumerate(ops):
            row = cells.get((op, rno))
            if row:
                xs.append(i - 0.4 + width * (k + 0.5))
                ys.append(float(row["survival"] or 0.0))
                notes.append(f"{row['accepted']}/{row['attempts']}")
        bars = ax.bar(xs, ys, width=width * 0.95, color=COLORS[k % 10], label=f"round {rno}")
        if len(ops) * len(round_nos) <= 24:
            ax.bar_label(bars, labels=notes, fontsize=7, padding=2)
    tilt = len(ops) > 3
    ax.set_xticks(range(len(ops)), ops, rotation=30 if tilt else 0, ha="right" if tilt else "center", fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("accepted / attempts")
    ax.set_title(title, pad=22)
    # above the axes: never over a bar or its count
    ax.legend(fontsize=8, ncols=min(6, len(round_nos)), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def eliminations_by_rule(rounds: list[dict]) -> bytes:
    """Attempts eliminated per rule, stacked by round (horizontal bars: rule names stay readable)."""
    title = "Eliminations by rule"
    counts: dict[str, dict[int, int]] = defaultdict(dict)
    for t in rounds:
        for rule, n in (t.get("by_rule") or {}).items():
            counts[rule or "(no rule)"][t["round"]] = n
    if not counts:
        return _empty(title, "nothing was eliminated")
    rules = sorted(counts, key=lambda r: sum(counts[r].values()))
    round_nos = sorted({r for c in counts.values() for r in c})
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.45 * len(rules)))
    left = [0] * len(rules)
    for k, rno in enumerate(round_nos):
        vals = [counts[rule].get(rno, 0) for rule in rules]
        ax.barh(rules, vals, left=left, color=COLORS[k % 10], label=f"round {rno}")
        left = [a + b for a, b in zip(left, vals)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total}", va="center", fontsize=8)
    ax.set_xlim(0, max(left) * 1.15 + 1)
    ax.set_xlabel("eliminated attempts")
    ax.set_title(title, pad=22)
    ax.legend(fontsize=8, ncols=min(6, len(round_nos)), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


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
        return _empty(title, "no model calls")
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
    return _png(fig)


DIFFICULTIES = ("easy", "medium", "hard")


def task_difficulty(tasks: list[dict]) -> bytes:
    """Kept synthesized tasks by difficulty (solver pass rate: easy > 2/3, hard < 1/3), one bar group per kind."""
    title = "Difficulty of synthesized tasks (kept)"
    kept = [t for t in tasks if t.get("status") == "kept"]
    if not kept:
        return _empty(title, f"no kept tasks ({len(tasks)} proposed)")
    kinds = sorted({t.get("kind") or "?" for t in kept})
    levels = list(DIFFICULTIES) + sorted({t.get("difficulty") or "unknown" for t in kept} - set(DIFFICULTIES))
    width = 0.8 / len(kinds)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for k, kind in enumerate(kinds):
        n = [sum(1 for t in kept if (t.get("kind") or "?") == kind and (t.get("difficulty") or "unknown") == lv)
             for lv in levels]
        bars = ax.bar([i - 0.4 + width * (k + 0.5) for i in range(len(levels))], n, width=width * 0.95,
                      color=COLORS[k % 10], label=kind)
        ax.bar_label(bars, fontsize=8, padding=2)
    ax.set_xticks(range(len(levels)), levels)
    ax.set_ylabel("tasks")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.set_title(f"{title}: {len(kept)} of {len(tasks)} proposed", pad=22)
    ax.legend(fontsize=8, ncols=len(kinds), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def score_histograms(scores: dict[str, list[float]], healthy: tuple[float, float], title: str) -> bytes:
    """One histogram per score set (0..1, 20 bins) with the healthy-mean band, the set's mean and the 0.5 line."""
    names = list(scores)
    if not names:
        return _empty(title, "no scores")
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
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{name} (n={len(vals)})", pad=24)
        ax.set_xlabel("score")
        ax.set_ylabel("count")
        # above the axes, under the title: never over a bar
        ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
    fig.suptitle(title)
    return _png(fig)


# ----------------------------------------------------------------- the plots of each stage

def evolve_plots(summary: dict) -> dict[str, bytes]:
    """survival_by_operation, eliminations_by_rule, cost_tokens_by_stage from an evolve run's summary.json."""
    return {"survival_by_operation": survival_by_operation(summary["rounds"]),
            "eliminations_by_rule": eliminations_by_rule(summary["rounds"]),
            "cost_tokens_by_stage": cost_and_tokens_by_stage(summary["cost"].get("by_stage", []))}


def synthesis_plots(tasks: list[dict], by_stage: list[dict]) -> dict[str, bytes]:
    """task_difficulty (every proposed task's kind, status, difficulty) and cost_tokens_by_stage."""
    return {"task_difficulty": task_difficulty(tasks), "cost_tokens_by_stage": cost_and_tokens_by_stage(by_stage)}


def reward_plots(name: str, scores: dict[str, list[float]], healthy: tuple[float, float],
                 by_stage: list[dict] | None, title: str) -> dict[str, bytes]:
    """`name` (IRM / PRM score histograms against the health band: reward_data_scores for the labels,
    reward_model_scores for the trained models; both stages may share a folder) and, for a stage with model
    calls, cost_tokens_by_stage."""
    out = {name: score_histograms(scores, healthy, title)}
    if by_stage is not None:
        out["cost_tokens_by_stage"] = cost_and_tokens_by_stage(by_stage)
    return out
