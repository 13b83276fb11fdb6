"""Reward health checks (RLEIF), on a sample of scores before training and before PPO.

On `reward.health_sample` (100) scores per distribution, all in 0..1:
- IRM and PRM: mean between healthy_mean_low and healthy_mean_high (0.4-0.7) and std over healthy_min_std (0.1);
- PRM: share of scores under 0.5 between 20% and 40%; under 10% means the PRM does not tell steps apart;
- IRM: mean over 0.9 with std under 0.01 means an overfit IRM (usually duplicate evolution templates: dedup harder).
`check_health` is applied twice: by the reward-data flow to the label scores (IRM: the judge's 0-10 version
scores / 10, else rank-derived; PRM: the step scores beside the labels), and by the training flow to the
trained models' scores on held-out data; `health_markdown` is the report as markdown. The report's shape, its
sample and stats, and `enforce` (`reward.health_policy`: warn, or stop) are tasks/core/health.py's, shared with the
PPO stage's training health.
"""

from __future__ import annotations

from evolforge.config.settings import RewardSettings
from evolforge.tasks.core.health import check_row, sample, stats, text_histogram
from evolforge.tasks.core.reporting import markdown_table


def check_health(irm_scores: list[float], prm_scores: list[float], cfg: RewardSettings, *, stage: str = "data",
                 seed: int | None = None) -> dict:
    seed = cfg.seed if seed is None else seed
    irm = sample(irm_scores, cfg.health_sample, seed)
    prm = sample(prm_scores, cfg.health_sample, seed + 1)
    lo, hi, min_std = cfg.healthy_mean_low, cfg.healthy_mean_high, cfg.healthy_min_std
    checks: list[dict] = []
    for name, sc in (("irm", irm), ("prm", prm)):
        st = stats(sc)
        if not st["n"]:
            checks.append(check_row(f"{name}_scores", 0, False, "a sample of scores", f"no {name.upper()} scores to check"))
            continue
        checks.append(check_row(f"{name}_mean", st["mean"], lo <= st["mean"] <= hi, f"{lo} to {hi}",
                                f"{name.upper()} score mean {st['mean']} is outside {lo}-{hi}"))
        checks.append(check_row(f"{name}_std", st["std"], st["std"] > min_std, f"over {min_std}",
                                f"{name.upper()} score std {st['std']} is not over {min_std}: the scores barely vary"))
    ist, pst = stats(irm), stats(prm)
    if ist["n"]:
        overfit = ist["mean"] > cfg.irm_overfit_mean and ist["std"] < cfg.irm_overfit_std
        checks.append(check_row("irm_not_overfit", {"mean": ist["mean"], "std": ist["std"]}, not overfit,
                                f"not (mean > {cfg.irm_overfit_mean} and std < {cfg.irm_overfit_std})",
                                "IRM overfit: mean over 0.9 with std under 0.01, usually duplicate evolution templates "
                                "(dedup harder)"))
    if pst["n"]:
        share = pst["share_below_half"]
        flat = share < cfg.prm_flat_share
        checks.append(check_row("prm_low_share", share, cfg.prm_low_share_low <= share <= cfg.prm_low_share_high,
                                f"{cfg.prm_low_share_low} to {cfg.prm_low_share_high}",
                                (f"only {share:.0%} of PRM scores are under 0.5 (< {cfg.prm_flat_share:.0%}): "
                                 "the PRM does not tell steps apart") if flat else
                                f"{share:.0%} of PRM scores are under 0.5 (healthy "
                                f"{cfg.prm_low_share_low:.0%}-{cfg.prm_low_share_high:.0%})"))
    failed = [c for c in checks if not c["passed"]]
    return {"stage": stage, "passed": not failed, "policy": cfg.health_policy, "sample_size": cfg.health_sample,
            "irm": ist, "prm": pst, "checks": checks, "problems": [c["message"] for c in failed],
            "histograms": {"irm": text_histogram(irm), "prm": text_histogram(prm)},
            # the checked samples themselves (at most health_sample each): the PNG histograms are drawn from them
            "samples": {"irm": [round(s, 4) for s in irm], "prm": [round(s, 4) for s in prm]}}


def health_markdown(report: dict, title: str | None = None) -> str:
    verdict = "PASSED" if report["passed"] else f"FAILED (policy: {report['policy']})"
    md = [f"# {title or 'Reward health (' + report['stage'] + ')'}: {verdict}", ""]
    md += markdown_table(["check", "value", "healthy", "result"],
                         [[c["check"], c["value"], c["healthy"], "ok" if c["passed"] else "FAIL"]
                          for c in report["checks"]])
    md.append("")
    for name in ("irm", "prm"):
        st = report[name]
        md += [f"## {name.upper()} scores (n={st['n']}, mean={st['mean']}, std={st['std']}, "
               f"under 0.5: {st['share_below_half']})", "", "```", report["histograms"][name], "```", ""]
    if report["problems"]:
        md += ["## Problems", ""] + [f"- {p}" for p in report["problems"]]
    return "\n".join(md)
