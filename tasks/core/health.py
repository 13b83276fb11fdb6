"""Health reports, one shape for every health check of a run: the reward stage's checks of its data and trained
models (tasks/reward/health.py) and the PPO stage's check of the rewards while it trains
(tasks/ppo/training_health.py). A report holds its checks (one row each: name, value, healthy range, passed,
message), the problems, the stats of the score samples and text histograms; the health policy (warn, or stop)
applies to any of them.

    sample(scores, n, seed)     at most n of the scores (NaN and None left out), the same sample on every run
    stats(scores)               n, mean, std, share under 0.5, min, max
    check_row(...)              one row of a report's checks
    text_histogram(scores)      scores in 0..1 as a text histogram
    enforce(report, policy)     the policy: raise RewardHealthError under 'stop' when the checks failed, else a
                                warning line (None when they passed)
"""

from __future__ import annotations

import math
import random


class RewardHealthError(RuntimeError):
    """Health checks failed under policy 'stop'."""


def sample(scores: list[float], n: int, seed: int = 0) -> list[float]:
    scores = [float(s) for s in scores if s is not None and not math.isnan(float(s))]
    if len(scores) <= n:
        return scores
    return random.Random(seed).sample(scores, n)


def stats(scores: list[float]) -> dict:
    n = len(scores)
    if not n:
        return {"n": 0, "mean": None, "std": None, "share_below_half": None, "min": None, "max": None}
    mean = sum(scores) / n
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / n)
    return {"n": n, "mean": round(mean, 4), "std": round(std, 4),
            "share_below_half": round(sum(1 for s in scores if s < 0.5) / n, 4),
            "min": round(min(scores), 4), "max": round(max(scores), 4)}


def check_row(name: str, value, passed: bool, healthy: str, message: str) -> dict:
    """One row of a health report's "checks": the check's name, the measured value, the healthy range as text,
    whether it passed, and the problem's message (empty when it passed)."""
    return {"check": name, "value": value, "healthy": healthy, "passed": bool(passed), "message": "" if passed else message}


def text_histogram(scores: list[float], bins: int = 10, width: int = 40) -> str:
    if not scores:
        return "(no scores)"
    counts = [0] * bins
    for s in scores:
        counts[min(bins - 1, max(0, int(float(s) * bins)))] += 1
    top = max(counts) or 1
    lines = []
    for i, c in enumerate(counts):
        bar = "#" * round(width * c / top)
        lines.append(f"{i / bins:.1f}-{(i + 1) / bins:.1f} | {bar:<{width}} {c}")
    return "\n".join(lines)


def enforce(report: dict | None, policy: str, override: bool = False) -> str | None:
    """Apply the policy: raise under 'stop' when the checks failed (unless overridden); else return a warning."""
    if report is None or report.get("passed"):
        return None
    message = f"reward health checks failed ({report.get('stage')}): " + "; ".join(report.get("problems", []))
    if policy == "stop" and not override:
        raise RewardHealthError(message + ". Policy 'stop': fix the data (or override the health check) first.")
    return message
