"""Reward health while the local GRPO run trains: the RLEIF check applied to the rewards of the first steps.

Fed every scored completion of the first `ppo.health_steps` steps (rA and r = rI * rA), it checks:
- share of rA < 0.5: the reward stage's PRM band (reward.prm_low_share_low..high, 20%-40%); under
  reward.prm_flat_share (10%) the reward does not tell answers apart, and near 100% the rewards collapsed;
- reward mean drift: the mean of the latest `ppo.health_min_samples` rewards against the mean of the first ones
  (the baseline); a drop over ppo.health_max_mean_drop fails (a rise is reported, not failed: it is the goal);
- reward std drift: the latest std under ppo.health_min_std_ratio x the baseline std fails (the reward no longer
  separates completions, so GRPO's group advantages vanish);
- KL explosion (RLEIF): the trainer's logged KL to the reference policy (`observe_log`, every step of the first
  ppo.health_kl_steps, 300) above ppo.health_max_kl (10) fails: lower the learning rate or raise the KL coefficient.
Reports have the one health report shape (tasks/core/health.py: stats, checks, problems, policy; the reward stage's
too), so `enforce` applies reward.health_policy: warn, or stop. Under stop, `should_stop` turns true once enough
completions were scored and a check fails, or at once when the KL exploded; the trainer callback
(tasks/ppo/local.py) then ends training.
"""

from __future__ import annotations

from evolforge.config.settings import PPOSettings, RewardSettings
from evolforge.tasks.core.health import check_row, stats, text_histogram
from evolforge.tasks.core.reporting import markdown_table
from evolforge.tasks.ppo.reward import combine


class TrainingHealth:
    def __init__(self, ppo: PPOSettings, reward: RewardSettings, aggregation: str, answer_weight: float):
        self.ppo, self.cfg = ppo, reward
        self.aggregation, self.answer_weight = aggregation, answer_weight
        self.step = 0  # optimizer steps finished
        self.r_a: list[float] = []
        self.rewards: list[float] = []
        self.kl: list[tuple[int, float]] = []  # (step, the trainer's logged KL)
        self.stopped_at: int | None = None

    @property
    def watching(self) -> bool:
        return self.step < self.ppo.health_steps

    def observe(self, details: list[dict]) -> None:
        """One reward batch (PPOReward.details rows) scored during step self.step + 1."""
        if not self.watching:
            return
        for d in details:
            self.r_a.append(combine(1.0, d["step_scores"], d["correct"], self.aggregation, self.answer_weight))
            self.rewards.append(float(d["reward"]))

    def end_step(self, step: int) -> None:
        self.step = step

    def observe_log(self, step: int, logs: dict) -> None:
        """The metrics the trainer logged for `step`: its KL to the reference policy (TRL logs `kl` when beta > 0)."""
        kl = (logs or {}).get("kl")
        if kl is None or "train_runtime" in logs or not 0 < step <= self.ppo.health_kl_steps:
            return
        self.kl.append((step, float(kl)))

    def kl_explosion(self) -> tuple[int, float] | None:
        """The first (step, KL) over ppo.health_max_kl, if any."""
        return next(((s, v) for s, v in self.kl if v > self.ppo.health_max_kl), None)

    def should_stop(self) -> bool:
        """Policy 'stop', a check failed and enough completions seen (a KL explosion needs none): training ends at
        this step."""
        if self.cfg.health_policy != "stop":
            return False
        if self.kl_explosion() is None and len(self.rewards) < self.ppo.health_min_samples:
            return False
        if self.report()["passed"]:
            return False
        self.stopped_at = self.step
        return True

    def report(self) -> dict:
        cfg, n = self.cfg, self.ppo.health_min_samples
        checks: list[dict] = []
        ra = stats(self.r_a)
        if not ra["n"]:
            checks.append(check_row("r_a_scores", 0, False, "scored completions", "no completions were scored"))
        else:
            share = ra["share_below_half"]
            flat = share < cfg.prm_flat_share
            checks.append(check_row("r_a_low_share", share, cfg.prm_low_share_low <= share <= cfg.prm_low_share_high,
                                    f"{cfg.prm_low_share_low} to {cfg.prm_low_share_high}",
                                    (f"only {share:.0%} of rA are under 0.5 (< {cfg.prm_flat_share:.0%}): the reward "
                                     "does not tell answers apart") if flat else
                                    f"{share:.0%} of rA are under 0.5 in the first steps (healthy "
                                    f"{cfg.prm_low_share_low:.0%}-{cfg.prm_low_share_high:.0%})"
                                    + ("; the rewards collapsed" if share >= 0.9 else "")))
        base, recent = stats(self.rewards[:n]), stats(self.rewards[-n:])
        drift = None
        if len(self.rewards) >= 2 * n:  # a baseline and a recent window that do not overlap
            drift = {"baseline_mean": base["mean"], "recent_mean": recent["mean"],
                     "mean_change": round(recent["mean"] - base["mean"], 4), "baseline_std": base["std"],
                     "recent_std": recent["std"],
                     "std_ratio": round(recent["std"] / base["std"], 4) if base["std"] else None}
            drop = -drift["mean_change"]
            checks.append(check_row("reward_mean_drift", drift["mean_change"], drop <= self.ppo.health_max_mean_drop,
                                    f"no drop over {self.ppo.health_max_mean_drop}",
                                    f"mean reward fell from {base['mean']} to {recent['mean']} (more than "
                                    f"{self.ppo.health_max_mean_drop}): the rewards are collapsing"))
            if base["std"]:
                ok = drift["std_ratio"] >= self.ppo.health_min_std_ratio
                checks.append(check_row("reward_std_drift", drift["std_ratio"], ok,
                                        f"at least {self.ppo.health_min_std_ratio} x the baseline std",
                                        f"reward std fell from {base['std']} to {recent['std']}: the reward no longer "
                                        "separates completions (GRPO advantages vanish)"))
        kl = None
        if self.kl:
            top_step, top = max(self.kl, key=lambda sv: sv[1])
            kl = {"steps": len(self.kl), "max": round(top, 4), "max_step": top_step, "last": round(self.kl[-1][1], 4),
                  "limit": self.ppo.health_max_kl, "within_steps": self.ppo.health_kl_steps}
            boom = self.kl_explosion()
            checks.append(check_row(
                "kl_explosion", kl["max"], boom is None,
                f"at most {self.ppo.health_max_kl} within the first {self.ppo.health_kl_steps} steps",
                f"KL reached {boom[1]:.4g} at step {boom[0]} (over {self.ppo.health_max_kl} within the first "
                f"{self.ppo.health_kl_steps} steps): the KL exploded; lower the learning rate (RLEIF: 1e-6) or raise "
                f"the KL coefficient (ppo.kl_coef, now {self.ppo.kl_coef}; RLEIF: 0.1)" if boom else ""))
        failed = [c for c in checks if not c["passed"]]
        return {"stage": "training", "passed": not failed, "policy": cfg.health_policy, "kl": kl,
                "steps_watched": min(self.step, self.ppo.health_steps), "health_steps": self.ppo.health_steps,
                "completions": len(self.rewards), "r_a": ra, "reward": stats(self.rewards), "drift": drift,
                "stopped_at_step": self.stopped_at, "checks": checks, "problems": [c["message"] for c in failed],
                "histograms": {"r_a": text_histogram(self.r_a), "reward": text_histogram(self.rewards)}}


def health_markdown(report: dict) -> list[str]:
    """Lines of the PPO summary artifact: verdict, the checks, the rA histogram."""
    verdict = "passed" if report["passed"] else f"FAILED (policy: {report['policy']})"
    stopped = f"; training stopped at step {report['stopped_at_step']}" if report.get("stopped_at_step") else ""
    lines = [f"Reward health over the first {report['steps_watched']} steps ({report['completions']} completions): "
             f"{verdict}{stopped}.", ""]
    lines += markdown_table(["check", "value", "healthy", "result"],
                            [[c["check"], c["value"], c["healthy"], "ok" if c["passed"] else "FAIL"]
                             for c in report["checks"]])
    lines += ["", f"rA (n={report['r_a']['n']}, mean={report['r_a']['mean']}, under 0.5: "
              f"{report['r_a']['share_below_half']}):", "", "```", report["histograms"]["r_a"], "```"]
    return lines + [f"- {p}" for p in report["problems"]]
