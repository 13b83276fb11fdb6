"""The A/B of policies evaluated on the same problems (the RLEIF comparison: base vs SFT vs RL).

    compare(runs, reference)     runs: name -> an eval stage's output folder, in order. One row per benchmark and
                                 policy: pass@1 with its Wilson 95% interval; and for every policy after the first,
                                 its change against the policy before it and against `reference`, in points of
                                 pass@1, with a paired 95% interval
    paired_difference(a, b)      the change b - a of two policies' per-problem pass@1 on the same problems, with its
                                 95% interval: Newcombe's hybrid score interval for paired proportions (Newcombe 1998,
                                 method 10) when every problem has one sample (greedy), else the normal interval of
                                 the mean per-problem difference
    mcnemar_exact(wins, losses)  the exact two-sided McNemar p: a binomial test on the discordant problems,
                                 min(1, 2 P[X <= min(wins, losses)]) for X ~ Binomial(wins + losses, 1/2)
    markdown(result)             the table as markdown

The policies must have been evaluated on the same problems with the same prompt template: a benchmark whose problem
ids or templates differ between runs is refused with the difference named, never compared on its overlap. RLEIF's
bar is +3 points of pass@1 of the RL policy over its SFT policy; `rleif_bar` reports the measured change and
interval against it, and `goals` any goal given per change (`goals={"sft": 5}`: the change into sft from the policy
before it). A goal is met only when the point estimate reaches it and the exact McNemar p is below 0.05
(at_or_above, significant, met); the paired interval is reported beside the p, it does not decide.
"""

from __future__ import annotations

import math
from pathlib import Path

from evolforge.storage import eval_sets as store
from evolforge.tasks.eval.scoring import Z95, per_problem, wilson

RLEIF_BAR_POINTS = 3.0
ALPHA = 0.05


class NotComparable(ValueError):
    """The runs did not evaluate the same problems the same way."""


def _load(folder: str | Path) -> dict[str, dict]:
    """benchmark -> {problem_id: (samples, correct)} and its templates, from one eval output folder."""
    f = store.EvalFolder(folder)
    out = {}
    for path in sorted(Path(f.data_dir).glob("*.parquet")):
        bench = path.stem
        results = store.read_rows(path) or []
        generations = store.read_rows(f.generations(bench)) or []
        cells = {pid: nc for (_, _, pid), nc in per_problem(results).items()}
        out[bench] = {"cells": cells, "templates": sorted({g["template"] for g in generations})}
    if not out:
        raise NotComparable(f"{folder}: no finished benchmark (no data/<benchmark>.parquet): run evolforge eval first")
    return out


def paired_difference(a: list[tuple[int, int]], b: list[tuple[int, int]], z: float = Z95) -> dict:
    """b - a over the same problems (lists of (samples, correct) in the same problem order), in shares."""
    n = len(a)
    if n == 0 or n != len(b):
        raise ValueError("paired_difference needs the same, non-empty list of problems on both sides")
    pa_ = [c / s for s, c in a]
    pb_ = [c / s for s, c in b]
    diff = sum(pb_) / n - sum(pa_) / n
    if all(s == 1 for s, _ in a) and all(s == 1 for s, _ in b):
        both = sum(x == 1 and y == 1 for x, y in zip(pa_, pb_))
        only_a = sum(x == 1 and y == 0 for x, y in zip(pa_, pb_))
        only_b = sum(x == 0 and y == 1 for x, y in zip(pa_, pb_))
        neither = n - both - only_a - only_b
        p1, p2 = (both + only_b) / n, (both + only_a) / n  # b's share, a's share
        l1, u1 = wilson(p1, n, z)
        l2, u2 = wilson(p2, n, z)
        denom = math.sqrt((both + only_b) * (only_a + neither) * (both + only_a) * (only_b + neither))
        phi = (both * neither - only_a * only_b) / denom if denom else 0.0
        delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
        eps = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
        return {"difference": diff, "ci95": [max(-1.0, diff - delta), min(1.0, diff + eps)],
                "method": "newcombe_paired", "problems": n, "wins": only_b, "losses": only_a}
    d = [y - x for x, y in zip(pa_, pb_)]
    sd = math.sqrt(sum((v - diff) ** 2 for v in d) / (n - 1)) if n > 1 else 0.0
    half = z * sd / math.sqrt(n)
    return {"difference": diff, "ci95": [diff - half, diff + half], "method": "normal_paired_mean", "problems": n,
            "wins": sum(v > 0 for v in d), "losses": sum(v < 0 for v in d)}


def mcnemar_exact(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p over the discordant problems (wins: only the second policy right; losses: only
    the first); 1.0 with none."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _points(d: dict) -> dict:
    return {"points": round(100 * d["difference"], 2), "ci95_points": [round(100 * v, 2) for v in d["ci95"]],
            "excludes_zero": d["ci95"][0] > 0 or d["ci95"][1] < 0, "method": d["method"], "problems": d["problems"],
            "wins": d["wins"], "losses": d["losses"], "mcnemar_p": mcnemar_exact(d["wins"], d["losses"])}


def verdict(change: dict, goal_points: float) -> dict:
    """The measured change against a goal: met only when the point estimate reaches it and p < 0.05."""
    at = change["points"] >= goal_points
    significant = change["mcnemar_p"] < ALPHA
    return {"benchmark": change["benchmark"], "from": change["from"], "to": change["to"],
            "points": change["points"], "ci95_points": change["ci95_points"], "mcnemar_p": change["mcnemar_p"],
            "goal_points": goal_points, "at_or_above": at, "significant": significant, "met": at and significant,
            "excludes_zero": change["excludes_zero"]}


def compare(runs: dict[str, str | Path], reference: str | None = None, goals: dict[str, float] | None = None) -> dict:
    """See the module docstring. `reference` defaults to the first run; `goals`: policy name -> points its change
    from the policy before it should reach."""
    if len(runs) < 2:
        raise NotComparable("compare needs at least two eval runs (NAME=EVAL_OUT ...)")
    names = list(runs)
    reference = reference or names[0]
    if reference not in runs:
        raise NotComparable(f"--reference {reference!r} is not one of the runs ({', '.join(names)})")
    loaded = {name: _load(folder) for name, folder in runs.items()}
    benches = sorted(set.intersection(*(set(v) for v in loaded.values())))
    if not benches:
        raise NotComparable("the runs share no finished benchmark")
    rows, changes = [], []
    for bench in benches:
        first = loaded[names[0]][bench]
        for name in names[1:]:
            other = loaded[name][bench]
            if set(other["cells"]) != set(first["cells"]):
                missing = sorted(set(first["cells"]) ^ set(other["cells"]))[:3]
                raise NotComparable(f"{bench}: {names[0]} and {name} evaluated different problems (e.g. {missing}): "
                                    "evaluate both with the same --tasks/--evolve-out, --limit and eval.seed")
            if other["templates"] != first["templates"]:
                raise NotComparable(f"{bench}: {names[0]} used template {first['templates']}, {name} used "
                                    f"{other['templates']}: evaluate both with the same prompt template")
        ids = sorted(first["cells"])
        for name in names:
            cells = [loaded[name][bench]["cells"][i] for i in ids]
            share = sum(c / s for s, c in cells) / len(cells)
            low, high = wilson(share, len(cells))
            rows.append({"benchmark": bench, "policy": name, "problems": len(cells), "pass@1": round(share, 4),
                         "pass@1_ci95": [round(low, 4), round(high, 4)], "folder": str(runs[name])})
        pairs = [(names[i - 1], names[i]) for i in range(1, len(names))]
        pairs += [(reference, n) for n in names if n != reference and (reference, n) not in pairs]
        for a, b in pairs:
            d = paired_difference([loaded[a][bench]["cells"][i] for i in ids],
                                  [loaded[b][bench]["cells"][i] for i in ids])
            changes.append({"benchmark": bench, "from": a, "to": b, **_points(d)})
    last = names[-1]
    before = names[-2]
    bar = [{**verdict(c, RLEIF_BAR_POINTS), "bar_points": RLEIF_BAR_POINTS}
           for c in changes if c["from"] == before and c["to"] == last]
    unknown = sorted(set(goals or {}) - set(names[1:]))
    if unknown:
        raise NotComparable(f"goal for {unknown}: not a policy after the first ({', '.join(names[1:])})")
    goal_rows = [verdict(c, (goals or {})[c["to"]]) for c in changes
                 if c["to"] in (goals or {}) and names.index(c["from"]) == names.index(c["to"]) - 1]
    return {"policies": names, "reference": reference, "benchmarks": benches, "rows": rows, "changes": changes,
            "rleif_bar": bar, "goals": goal_rows, "alpha": ALPHA}


def _pt(v: float) -> str:
    """Points with a sign, to one decimal (two near 0, so a bound just above 0 does not read as +0.0)."""
    return f"{v:+.2f}" if 0 < abs(v) < 0.1 else f"{v:+.1f}"


def _p(p: float) -> str:
    return f"{p:.2g}" if p < 0.01 else f"{p:.3f}"


def markdown(result: dict) -> str:
    lines = ["| benchmark | policy | problems | pass@1 | 95% interval |", "|---|---|---:|---:|---|"]
    for r in result["rows"]:
        lo, hi = r["pass@1_ci95"]
        lines.append(f"| {r['benchmark']} | {r['policy']} | {r['problems']} | {100 * r['pass@1']:.1f}% | "
                     f"{100 * lo:.1f} to {100 * hi:.1f} |")
    lines += ["", "| benchmark | change | points | paired 95% interval (Newcombe) | exact McNemar p | wins / losses |",
              "|---|---|---:|---|---:|---|"]
    for c in result["changes"]:
        lo, hi = c["ci95_points"]
        lines.append(f"| {c['benchmark']} | {c['from']} -> {c['to']} | {c['points']:+.1f} | {_pt(lo)} to {_pt(hi)} | "
                     f"{_p(c['mcnemar_p'])} | {c['wins']} / {c['losses']} |")

    def said(b: dict, what: str) -> str:
        lo, hi = b["ci95_points"]
        return (f"{what} on {b['benchmark']} ({b['to']} over {b['from']}, +{b['goal_points']:g} points of pass@1): "
                f"measured {b['points']:+.1f} points ({_pt(lo)} to {_pt(hi)}, exact McNemar p = {_p(b['mcnemar_p'])})"
                f"; {'met' if b['met'] else 'not met'} (point estimate "
                f"{'at or above' if b['at_or_above'] else 'below'} the goal, p "
                f"{'<' if b['significant'] else '>='} {result.get('alpha', ALPHA):g}).")

    for b in result.get("goals", []):
        lines += ["", said(b, "Goal")]
    for b in result["rleif_bar"]:
        lines += ["", said(b, "RLEIF's bar")]
    return "\n".join(lines) + "\n"
