"""Reward health checks on constructed score distributions: healthy ones pass, each symptom fails."""

from __future__ import annotations

import random

import pytest

from evolforge.tasks.core.health import RewardHealthError, enforce, stats, text_histogram
from evolforge.tasks.reward.health import check_health, health_markdown
from evolforge.testing.settings import make_settings

CFG = make_settings().reward


def spread(mean: float, half_width: float, n: int = 300, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [min(1.0, max(0.0, mean + rng.uniform(-half_width, half_width))) for _ in range(n)]


def prm_mix(low_share: float, n: int = 300, seed: int = 2) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(0.05, 0.45) if rng.random() < low_share else rng.uniform(0.55, 0.95) for _ in range(n)]


def failed(report: dict) -> set[str]:
    return {c["check"] for c in report["checks"] if not c["passed"]}


def test_healthy_distributions_pass():
    report = check_health(spread(0.55, 0.35), prm_mix(0.3), CFG)
    assert report["passed"] and not report["problems"], report["problems"]
    assert report["irm"]["n"] == report["prm"]["n"] == 100  # a sample of 100, as RLEIF checks
    assert 0.4 <= report["irm"]["mean"] <= 0.7 and report["irm"]["std"] > 0.1
    assert 0.2 <= report["prm"]["share_below_half"] <= 0.4


def test_overfit_irm_duplicate_templates():
    report = check_health([0.95 + 0.001 * (i % 3) for i in range(100)], prm_mix(0.3), CFG)
    assert not report["passed"]
    assert failed(report) == {"irm_mean", "irm_std", "irm_not_overfit"}
    assert any("duplicate evolution templates" in p for p in report["problems"])


def test_prm_that_does_not_tell_steps_apart():
    report = check_health(spread(0.55, 0.35), prm_mix(0.05), CFG)
    assert "prm_low_share" in failed(report) and report["prm"]["share_below_half"] < 0.1
    assert any("does not tell steps apart" in p for p in report["problems"])


def test_prm_low_share_too_high_is_not_called_flat():
    report = check_health(spread(0.55, 0.35), prm_mix(0.6), CFG)
    assert "prm_low_share" in failed(report)
    assert not any("does not tell steps apart" in p for p in report["problems"])


@pytest.mark.parametrize("irm,prm,expected", [
    (spread(0.25, 0.2), prm_mix(0.3), {"irm_mean"}),  # IRM mean under 0.4
    (spread(0.8, 0.2), prm_mix(0.3), {"irm_mean"}),  # over 0.7 (not overfit: std is large)
    (spread(0.55, 0.05), prm_mix(0.3), {"irm_std"}),  # scores barely vary
    (spread(0.55, 0.35), spread(0.55, 0.05), {"prm_std", "prm_low_share"}),
])
def test_each_threshold_fails_on_its_own(irm, prm, expected):
    report = check_health(irm, prm, CFG)
    assert not report["passed"] and failed(report) == expected


def test_missing_scores_fail():
    report = check_health([], prm_mix(0.3), CFG)
    assert failed(report) == {"irm_scores"} and "no IRM scores" in report["problems"][0]


def test_thresholds_come_from_config():
    loose = make_settings(reward={"healthy_mean_low": 0.0, "healthy_mean_high": 1.0, "healthy_min_std": 0.0,
                                  "prm_low_share_low": 0.0, "prm_low_share_high": 1.0}).reward
    report = check_health(spread(0.25, 0.2), spread(0.55, 0.05), loose)
    assert report["passed"]


def test_policy_warn_stop_and_override():
    bad = check_health(spread(0.25, 0.2), prm_mix(0.3), CFG)
    assert enforce(bad, "warn").startswith("reward health checks failed")
    with pytest.raises(RewardHealthError, match="IRM score mean"):
        enforce(bad, "stop")
    assert enforce(bad, "stop", override=True)
    assert enforce(check_health(spread(0.55, 0.35), prm_mix(0.3), CFG), "stop") is None


def test_histogram_and_markdown_show_the_figures():
    scores = [0.05] * 3 + [0.55] * 6 + [1.0]
    hist = text_histogram(scores)
    lines = hist.splitlines()
    assert len(lines) == 10 and lines[0].endswith(" 3") and lines[5].endswith(" 6") and lines[9].endswith(" 1")
    assert lines[5].count("#") == 40 and lines[0].count("#") == 20
    assert stats(scores) == {"n": 10, "mean": 0.445, "std": pytest.approx(0.2902, abs=1e-4),
                             "share_below_half": 0.3, "min": 0.05, "max": 1.0}
    md = health_markdown(check_health([0.95] * 100, prm_mix(0.05), CFG))
    assert "FAILED" in md and "| irm_not_overfit |" in md and "0.9-1.0 |" in md and "does not tell steps apart" in md
