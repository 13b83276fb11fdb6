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


def png(fig: Figure) -> bytes:
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


def _label(row: dict) -> str:
    op, direction = row.get("operation") or "?", row.get("direction")
    return f"{op} ({direction})" if direction else op


def survival_by_operation(rounds: list[dict]) -> bytes:
    """Share of attempts accepted, per evolution operation (bars) and round (one bar per round), with counts."""
    title = "Survival by operation and round"
    cells = {(_label(r), t["round"]): r for t in rounds for r in t.get("by_operation", [])}
    if not cells:
        return empty_plot(title, "no evolution attempts")
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
    return png(fig)


def eliminations_by_rule(rounds: list[dict]) -> bytes:
    """Attempts eliminated per rule, stacked by round (horizontal bars: rule names stay readable)."""
    title = "Eliminations by rule"
    counts: dict[str, dict[int, int]] = defaultdict(dict)
    for t in rounds:
        for rule, n in (t.get("by_rule") or {}).items():
            counts[rule or "(no rule)"][t["round"]] = n
    if not counts:
        return empty_plot(title, "nothing was eliminated")
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


DIFFICULTIES = ("easy", "medium", "hard")


def task_difficulty(tasks: list[dict]) -> bytes:
    """Kept synthesized tasks by difficulty (solver pass rate: easy > 2/3, hard < 1/3), one bar group per kind."""
    title = "Difficulty of synthesized tasks (kept)"
    kept = [t for t in tasks if t.get("status") == "kept"]
    if not kept:
        return empty_plot(title, f"no kept tasks ({len(tasks)} proposed)")
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
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{name} (n={len(vals)})", pad=24)
        ax.set_xlabel("score")
        ax.set_ylabel("count")
        # above the axes, under the title: never over a bar
        ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
    fig.suptitle(title)
    return png(fig)


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


def grpo_training(steps: list[dict], health: dict | None = None) -> bytes:
    """Per GRPO step: mean reward (band: +-reward_std) with its rI and rA parts, KL to the SFT policy, loss; the
    steps the reward health watch saw are shaded, its verdict and drift window means are drawn on the reward."""
    title = "GRPO smoke run: reward and health per step"
    steps = sorted((s for s in steps if isinstance(s.get("step"), (int, float))), key=lambda s: s["step"])
    if not steps:
        return empty_plot(title, "no GRPO steps were logged")
    xs = [s["step"] for s in steps]

    def series(key):
        pts = [(x, s.get(key)) for x, s in zip(xs, steps)]
        return [(x, float(v)) for x, v in pts if finite([v])]

    fig, (ax_r, ax_k, ax_l) = plt.subplots(1, 3, figsize=(12, 4))
    reward = series("reward")
    if reward:
        rx, ry = zip(*reward)
        std = {x: float(s["reward_std"]) for x, s in zip(xs, steps) if finite([s.get("reward_std")])}
        if std:
            ax_r.fill_between(rx, [y - std.get(x, 0.0) for x, y in reward], [y + std.get(x, 0.0) for x, y in reward],
                              color=COLORS[0], alpha=0.15, label="+- reward std")
        ax_r.plot(rx, ry, marker="o", color=COLORS[0], label="reward r = rI * rA")
    for k, (key, label) in enumerate((("reward/r_i", "rI (IRM)"), ("reward/r_a_prm", "rA (PRM)"))):
        pts = series(key)
        if pts:
            ax_r.plot(*zip(*pts), marker=".", ls="--", color=COLORS[k + 1], label=label)
    verdict = ""
    if health:
        watched = int(health.get("steps_watched") or 0)
        if watched:
            ax_r.axvspan(min(xs) - 0.5, min(xs) - 0.5 + watched, color="green", alpha=0.07, label="health watch")
        drift = health.get("drift") or {}
        for key, ls, label in (("baseline_mean", ":", "baseline mean"), ("recent_mean", "-.", "recent mean")):
            if drift.get(key) is not None:
                ax_r.axhline(float(drift[key]), color="gray", ls=ls, lw=1, label=label)
        r_a = health.get("r_a") or {}
        share = r_a.get("share_below_half")
        verdict = (f"health {'PASSED' if health.get('passed') else 'FAILED'}"
                   + (f", {share:.0%} of rA < 0.5" if share is not None else "")
                   + (f", stopped at step {health['stopped_at_step']}" if health.get("stopped_at_step") else ""))
    ax_r.set_ylim(-0.05, 1.05)
    ax_r.set_ylabel("reward")
    ax_r.set_title("Reward", pad=30)
    ax_r.legend(fontsize=7, ncols=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    for ax, key, name in ((ax_k, "kl", "KL to the SFT policy"), (ax_l, "loss", "Loss")):
        pts = series(key)
        if pts:
            ax.plot(*zip(*pts), marker="o", color=COLORS[3 if key == "kl" else 4])
        else:
            ax.text(0.5, 0.5, f"no {key} logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(name, pad=30)
    for ax in (ax_r, ax_k, ax_l):
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}" + (f" ({verdict})" if verdict else ""))
    return png(fig)


def policy_rewards(sft: list[float], trained: list[float], eval_split: str = "test") -> bytes:
    """Held-out rewards of the SFT and the trained policy's greedy completions (0..1, same prompts), with means."""
    title = f"Held-out reward: SFT vs trained ({eval_split} prompts)"
    sets = {"SFT": finite(sft), "trained": finite(trained)}
    if not any(sets.values()):
        return empty_plot(title, "no held-out comparison (the run was stopped, or no prompts)")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.hist(list(sets.values()), bins=10, range=(0, 1), color=[COLORS[0], COLORS[1]],
            label=[f"{k} (n={len(v)})" for k, v in sets.items()], edgecolor="white")
    for k, (name, vals) in enumerate(sets.items()):
        if vals:
            m = sum(vals) / len(vals)
            ax.axvline(m, color=COLORS[k], lw=1.5, ls="--", label=f"{name} mean {m:.3f}")
    ax.set_xlim(-0.02, 1.02)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("reward r = rI * rA")
    ax.set_ylabel("prompts")
    ax.set_title(title, pad=34)  # above the two-row legend
    ax.legend(fontsize=7, ncols=2, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return png(fig)


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
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{name} (n={len(vals)})", pad=20)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.grid(axis="y", alpha=0.3)


def trajectory_calls(calls_per_session: list[int], prompt_tokens: list, completion_tokens: list,
                     latency_s: list) -> bytes:
    """Exported trajectories: model calls per session, prompt and completion tokens per call (as the upstream
    reported them), latency per call."""
    title = "Recorded agent traffic (exported calls)"
    if not calls_per_session:
        return empty_plot(title, "no exported sessions")
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.9))
    hist(axes[0], calls_per_session, "Calls per session", "calls", COLORS[0], integer=True)
    hist(axes[1], prompt_tokens, "Prompt tokens per call", "tokens", COLORS[1])
    hist(axes[2], completion_tokens, "Completion tokens per call", "tokens", COLORS[2])
    hist(axes[3], latency_s, "Latency per call", "seconds", COLORS[3])
    fig.suptitle(title)
    return png(fig)


def session_rewards(rewards: list) -> bytes:
    """The sessions' rewards (the rewards file or the proxy's reward events); sessions without one counted."""
    title = "Session rewards"
    vals = finite(rewards)
    missing = len(rewards) - len(vals)
    if not rewards:
        return empty_plot(title, "no exported sessions")
    fig, ax = plt.subplots(figsize=(6.5, 3.9))
    hist(ax, vals, title, "reward", COLORS[4])
    ax.set_title(f"{title}: {len(vals)} sessions with a reward, {missing} without", pad=20)
    return png(fig)


def module_contributions(contributions: dict[str, list[float]]) -> bytes:
    """Per module (dependency order), its contribution rewards (judge score of the full answer minus the score
    without the module, 0-10 judge points): one histogram per module on a shared axis."""
    title = "Per-module contribution rewards (judge points: full - without the module)"
    mods = [m for m, v in contributions.items()]
    if not mods or not any(finite(v) for v in contributions.values()):
        return empty_plot(title, "no contribution was measured (no judged question)")
    cols = min(3, len(mods))
    rows = -(-len(mods) // cols)
    allv = [v for vs in contributions.values() for v in finite(vs)]
    lo, hi = min(min(allv), -1.0), max(max(allv), 1.0)
    fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols + 0.6, 2.4 * rows + 0.9), squeeze=False, sharex=True)
    for k, m in enumerate(mods):
        ax = axes[k // cols][k % cols]
        vals = finite(contributions[m])
        ax.axvline(0, color="gray", lw=0.8, ls=":")
        if vals:
            ax.hist(vals, bins=20, range=(lo, hi), color=COLORS[k % 10], edgecolor="white")
            mean = sum(vals) / len(vals)
            ax.axvline(mean, color="black", lw=1.2, ls="--")
            ax.set_title(f"{m[:28]} (n={len(vals)}, mean {mean:+.2f})", fontsize=9)
        else:
            ax.text(0.5, 0.5, "no contribution", ha="center", va="center", transform=ax.transAxes, color="gray")
            ax.set_title(f"{m[:28]} (n=0)", fontsize=9)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(axis="y", alpha=0.3)
    for k in range(len(mods), rows * cols):
        axes[k // cols][k % cols].set_axis_off()
    for c in range(min(cols, len(mods))):  # the x axis under the lowest drawn panel of each column
        last = axes[(len(mods) - 1 - c) // cols][c]
        last.tick_params(labelbottom=True)
        last.set_xlabel("contribution")
    fig.suptitle(title)
    return png(fig)


MODULE_OUTCOMES = (("ok", "valid (schema passed)"), ("invalid", "invalid"), ("truncated", "truncated"),
                   ("error", "endpoint error"))


def module_schema_pass(stats: list[dict]) -> bytes:
    """Per module: share of runs whose output passed its JSON schema (ok) vs invalid / truncated / error, with the
    schema re-asks it took (tasks/modules/report.module_stats rows)."""
    title = "Module outputs: schema pass rate"
    rows = [s for s in stats if s.get("runs")]
    if not rows:
        return empty_plot(title, "no module ran")
    rows = rows[::-1]  # dependency order, top to bottom
    names = [str(s["id"])[:28] for s in rows]
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.42 * len(rows)))
    left = [0.0] * len(rows)
    for k, (key, label) in enumerate(MODULE_OUTCOMES):
        vals = [(s.get(key) or 0) / s["runs"] for s in rows]
        ax.barh(names, vals, left=left, color=("tab:green", "tab:orange", "tab:purple", "tab:red")[k], label=label)
        left = [a + b for a, b in zip(left, vals)]
    for y, s in enumerate(rows):
        ax.text(1.01, y, f"{s.get('ok') or 0}/{s['runs']}, {s.get('reasks') or 0} re-asks", va="center", fontsize=8)
    ax.set_xlim(0, 1.35)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xlabel("share of runs")
    ax.set_title(title, pad=22)
    ax.legend(fontsize=8, ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return png(fig)


def ppo_plots(steps: list[dict], health: dict | None, comparison: dict | None) -> dict[str, bytes]:
    """grpo_training (reward, KL, loss per step, the health watch) and held_out_reward (SFT vs trained)."""
    c = comparison or {}
    return {"grpo_training": grpo_training(steps, health),
            "held_out_reward": policy_rewards((c.get("sft") or {}).get("rewards") or [],
                                              (c.get("trained") or {}).get("rewards") or [],
                                              c.get("eval_split") or "test")}


def trajectory_plots(calls: dict[str, list]) -> dict[str, bytes]:
    """trajectory_calls and session_rewards from storage/trajectory_sets.call_figures."""
    return {"trajectory_calls": trajectory_calls(calls["calls_per_session"], calls["prompt_tokens"],
                                                 calls["completion_tokens"], calls["latency_s"]),
            "session_rewards": session_rewards(calls["session_rewards"])}


def modules_plots(contributions: dict[str, list[float]], stats: list[dict], by_stage: list[dict]) -> dict[str, bytes]:
    """module_contributions, module_schema_pass and cost_tokens_by_stage of a modules run."""
    return {"module_contributions": module_contributions(contributions), "module_schema_pass": module_schema_pass(stats),
            "cost_tokens_by_stage": cost_and_tokens_by_stage(by_stage)}
