"""Pre-flight of the PPO stage: the reward models exist and the reward stage called them healthy.

The reward stage writes `health.json` next to its model folders, in one of two forms:
  {"healthy": bool, ...}                                       a plain verdict, or
  {"data": {"passed": bool, ...}, "model": {"passed": bool, ...}}   the train-reward flow's reports (IRM / PRM
                                                               score mean and spread, share of low PRM scores)
In the second form the verdict is the model report's (the checks on the trained models' scores, which is
what PPO consumes); a file without a model report means the model checks never ran. PPO on an unhealthy
reward (an overfit IRM, a PRM that does not tell steps apart) burns a cluster for nothing, so the stage refuses
to start unless `ignore_reward_health` is set; missing model folders are never overridable.
"""

from __future__ import annotations

from pathlib import Path

from evolforge.storage.ppo import read_health


class RewardStageUnhealthy(RuntimeError):
    """The reward stage's health checks failed (or were never run); PPO refuses to start."""


def _model_folder_problem(path: Path, kind: str) -> str | None:
    if not path.is_dir():
        return f"{kind} folder {path} does not exist"
    if not (path / "config.json").exists():
        return f"{kind} folder {path} holds no config.json (not a saved transformers model)"
    return None


def health_verdict(health: dict | None, path: Path) -> tuple[bool, str]:
    """(healthy, reason when not) from either health.json form."""
    if health is None:
        return False, f"no {path}: the reward stage's health checks never ran"
    if isinstance(health, dict) and isinstance(health.get("healthy"), bool):
        return health["healthy"], "" if health["healthy"] else f"reward stage reports unhealthy: {health}"
    if isinstance(health, dict) and ("model" in health or "data" in health):
        model = health.get("model")
        if not isinstance(model, dict) or not isinstance(model.get("passed"), bool):
            return False, f"{path} holds no model health report: the trained models' health checks never ran"
        if model["passed"]:
            return True, ""
        return False, "trained reward models fail the health checks: " + "; ".join(model.get("problems") or ["?"])
    return False, f"{path} has neither a boolean 'healthy' field nor a 'model' health report"


def preflight(reward_dir: str | Path, irm_dir: Path, prm_dir: Path, ignore_health: bool = False) -> dict:
    """Raise RewardStageUnhealthy unless the models exist and health.json says healthy (or ignore_health)."""
    problems = [p for p in (_model_folder_problem(Path(irm_dir), "IRM"), _model_folder_problem(Path(prm_dir), "PRM")) if p]
    if problems:
        raise RewardStageUnhealthy("; ".join(problems) + " (train the reward models first, or point irm_dir / "
                                   "prm_dir at them)")
    health = read_health(reward_dir)
    verdict, why = health_verdict(health, f"{str(reward_dir).rstrip('/')}/health.json")
    if not verdict and not ignore_health:
        raise RewardStageUnhealthy(f"PPO refused to start: {why}. Fix the reward models (see the health checks in "
                                   "the README, 'Reward models and PPO'), or set ignore_reward_health=True to run anyway.")
    return {"healthy": verdict, "overridden": not verdict, "reason": why, "health": health,
            "irm_dir": str(irm_dir), "prm_dir": str(prm_dir)}
