"""Pre-flight of the PPO stage: the reward models exist and the reward stage called them healthy.

The reward-model stage writes `health.json` ({"healthy": bool, ...}: IRM / PRM score mean and spread,
share of low PRM scores, on ~100 samples) next to its model folders. PPO on an unhealthy reward (an overfit
IRM, a PRM that does not tell steps apart) burns a cluster for nothing, so the stage refuses to start unless
`ignore_reward_health` is set; missing model folders are never overridable.
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


def preflight(reward_dir: Path, irm_dir: Path, prm_dir: Path, ignore_health: bool = False) -> dict:
    """Raise RewardStageUnhealthy unless the models exist and health.json says healthy (or ignore_health)."""
    problems = [p for p in (_model_folder_problem(Path(irm_dir), "IRM"), _model_folder_problem(Path(prm_dir), "PRM")) if p]
    if problems:
        raise RewardStageUnhealthy("; ".join(problems) + " (train the reward models first, or point irm_dir / "
                                   "prm_dir at them)")
    health = read_health(reward_dir)
    if health is None:
        verdict, why = False, f"no health.json in {reward_dir}: the reward stage's health checks never ran"
    elif not isinstance(health, dict) or not isinstance(health.get("healthy"), bool):
        verdict, why = False, f"{Path(reward_dir) / 'health.json'} has no boolean 'healthy' field"
    else:
        verdict, why = health["healthy"], "" if health["healthy"] else f"reward stage reports unhealthy: {health}"
    if not verdict and not ignore_health:
        raise RewardStageUnhealthy(f"PPO refused to start: {why}. Fix the reward models (see the health checks in "
                                   "GUIDE section 2), or set ignore_reward_health=True to run anyway.")
    return {"healthy": verdict, "overridden": not verdict, "reason": why, "health": health,
            "irm_dir": str(irm_dir), "prm_dir": str(prm_dir)}
