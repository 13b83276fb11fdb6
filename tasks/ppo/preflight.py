"""Pre-flight of the PPO stage: the reward models exist and the reward stage called them healthy.

The reward stage writes `health.json` next to its model folders (storage/reward_sets.py):
  {"data": {"passed": bool, ...}, "model": {"passed": bool, ...} | null}
the reward-data flow's data report (with "model": null), then the train-reward flow's model report beside it
(tasks/reward/health.py check_health: IRM / PRM score mean and spread, share of low PRM scores). The verdict is
the model report's (the checks on the trained models' scores, which is what PPO consumes); a file without a
model report means the model checks never ran, and a missing or unreadable file is no verdict either. PPO on
an unhealthy reward (an overfit IRM, a PRM that does not tell steps apart) burns a cluster for nothing, so the
stage refuses to start with reward.health_policy = "stop" unless `ignore_reward_health` (--ignore-reward-health)
is set; with "warn" it goes on and says so. Missing model folders are never overridable.
"""

from __future__ import annotations

from pathlib import Path

from evolforge.storage.ppo import UnreadableHealth, read_health


class RewardStageUnhealthy(RuntimeError):
    """The reward stage's health checks failed (or were never run); PPO refuses to start."""


def _model_folder_problem(path: Path, kind: str) -> str | None:
    if not path.is_dir():
        return f"{kind} folder {path} does not exist"
    if not (path / "config.json").exists():
        return f"{kind} folder {path} holds no config.json (not a saved transformers model)"
    return None


def health_verdict(health: dict | None, path: str) -> tuple[bool, str]:
    """(healthy, reason when not) from health.json as read (None: missing): the model report's verdict."""
    if health is None:
        return False, f"no {path}: the reward stage's health checks never ran"
    if not isinstance(health, dict) or not ("model" in health or "data" in health):
        return False, f"{path} is not the reward stage's health report (no 'data' or 'model' report)"
    model = health.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("passed"), bool):
        return False, f"{path} holds no model health report: the trained models' health checks never ran"
    if model["passed"]:
        return True, ""
    return False, "trained reward models fail the health checks: " + "; ".join(model.get("problems") or ["?"])


def ignores_health(params, settings) -> bool:
    """Whether PPO runs on an unhealthy reward stage: --ignore-reward-health, or reward.health_policy = "warn"."""
    return bool(getattr(params, "ignore_reward_health", False)) or settings.reward.health_policy == "warn"


def preflight(reward_dir: str | Path, irm_dir: Path, prm_dir: Path, ignore_health: bool = False) -> dict:
    """Raise RewardStageUnhealthy unless the models exist and health.json says healthy (or ignore_health)."""
    problems = [p for p in (_model_folder_problem(Path(irm_dir), "IRM"), _model_folder_problem(Path(prm_dir), "PRM")) if p]
    if problems:
        raise RewardStageUnhealthy("; ".join(problems) + " (pass --reward-dir the output folder of a finished "
                                   "train-reward run, or --irm-dir / --prm-dir the model folders)")
    try:
        health = read_health(reward_dir)
        verdict, why = health_verdict(health, f"{str(reward_dir).rstrip('/')}/health.json")
    except UnreadableHealth as e:
        health, verdict, why = None, False, str(e)
    if not verdict and not ignore_health:
        raise RewardStageUnhealthy(f"PPO refused to start: {why}. Fix the reward models (see the health checks in "
                                   "the README, 'Reward models and PPO'), or run anyway with --ignore-reward-health "
                                   "(flow parameter ignore_reward_health) or reward.health_policy = \"warn\"")
    return {"healthy": verdict, "overridden": not verdict, "reason": why, "health": health,
            "irm_dir": str(irm_dir), "prm_dir": str(prm_dir)}
