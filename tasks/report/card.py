"""What a dataset card says, assembled from a stage's summary and settings: title, description, body sections
(lineage and generation settings, models used, cost) and the same facts for the card's YAML header.
storage/cards.py writes it beside the tables. No secrets: only the stage's own settings sections and the
models the ledger saw (the gateway section, which holds the endpoint and keys, is never read)."""

from __future__ import annotations

from evolforge import __version__
from evolforge.tasks.core.reporting import usd


def _models(cost: dict) -> list[dict]:
    return [{"stage": s["stage"], "model": s["model"], "calls": s["calls"]} for s in cost.get("by_stage", [])]


def _cost(cost: dict) -> dict:
    return {"usd": cost.get("cost_usd"), "attempts": cost.get("attempts", 0),
            "prompt_tokens": cost.get("prompt_tokens", 0), "completion_tokens": cost.get("completion_tokens", 0),
            "unpriced_attempts": cost.get("unpriced_attempts", 0)}


def _common_sections(facts: dict) -> dict[str, list[str]]:
    c = facts["cost"]
    models = facts["models"]
    return {
        "Models used": ["| stage | model | calls |", "|---|---|---|"] +
                       [f"| {m['stage']} | `{m['model']}` | {m['calls']} |" for m in models] if models
                       else ["No model calls were made by this run."],
        "Cost": [f"{usd(c['usd'])} over {c['attempts']} model call attempts ({c['prompt_tokens']} prompt and "
                 f"{c['completion_tokens']} completion tokens)" +
                 (f"; {c['unpriced_attempts']} calls had no price, so the total is unknown."
                  if c["unpriced_attempts"] else ".")],
    }


def evolve_card(summary: dict, settings: dict) -> dict:
    """The card of an evolve run's dataset/ folder (summary.json and the run's settings fingerprint)."""
    evo = settings.get("evol_instruct", {})
    facts = {
        "stage": "evolve", "evolforge_version": __version__, "run_id": summary["run_id"],
        "lineage": {"seeds": str(summary.get("seeds")), "rounds": summary.get("rounds_in_datasets"),
                    "counts": summary.get("counts")},
        "generation": {"evol_instruct": evo, "models": settings.get("models", {})},
        "models": _models(summary["cost"]), "cost": _cost(summary["cost"]),
    }
    rounds = ["| round | attempts | accepted | survival | eliminated by rule |", "|---|---|---|---|---|"] + [
        f"| {r['round']} | {r['attempts']} | {r['accepted']} | {r['survival']:.1%} | "
        f"{', '.join(f'{k}: {v}' for k, v in sorted(r['by_rule'].items())) or '-'} |" for r in summary["rounds"]]
    sections = {
        "Lineage": [f"Seeds: `{summary.get('seeds')}`, evolved over {len(summary['rounds'])} Evol-Instruct round(s) "
                    "(in-depth and in-breadth operations, each attempt judged and eliminated by rule). Every record "
                    "keeps `parent_id`, `seed_id`, `round`, `operation` and `direction`; the `lineage` config holds "
                    "every attempt, eliminated ones with their `elimination_rule`.", "", *rounds],
        "Generation settings": ["```yaml", *_yaml(evo).splitlines(), "```"],
        **_common_sections(facts),
    }
    return {"title": "evolforge evolved instructions",
            "description": "Instructions evolved from seed instructions with Evol-Instruct by evolforge, with answers. "
                           "`sft` is the SFT view (TRL SFTTrainer `messages`: user instruction, assistant answer); "
                           "`evolved` the seeds and accepted evolutions; `lineage` every attempt; `final_pool` what "
                           "the next round would evolve.",
            "sections": sections, "facts": facts, "default": "sft"}


def synthesis_card(summary: dict, settings: dict, cost: dict) -> dict:
    syn = {k: settings.get(k, {}) for k in ("synthesis", "sandbox")}
    facts = {"stage": "synthesize", "evolforge_version": __version__, "run_id": summary["run_id"],
             "lineage": {"proposed": summary["proposed"], "kept": summary["kept"], "yield": summary["yield"],
                         "rejections": summary["rejections"]},
             "generation": {"synthesis": syn["synthesis"], "models": settings.get("models", {})},
             "models": _models(cost), "cost": _cost(cost)}
    sections = {
        "Lineage": [f"{summary['kept']} tasks kept of {summary['proposed']} proposed from the seed instructions "
                    f"(yield {summary['yield']:.0%}); each proposal was checked by running its tests in the sandbox, "
                    "repaired when they failed, and rated by solver attempts (difficulty from the pass rate). "
                    "Rejections: " + (", ".join(f"{k}: {v}" for k, v in summary["rejections"].items()) or "none") + "."],
        "Generation settings": ["```yaml", *_yaml(syn["synthesis"]).splitlines(), "```"],
        **_common_sections(facts),
    }
    return {"title": "evolforge synthesized tasks",
            "description": "Verified Python tasks (statement, entry point, reference solution, tests) and math "
                           "problems (answer) synthesized by evolforge. `tasks` are the kept tasks; `rejected` the "
                           "rest with the reason; `cost_per_task` the calls, tokens and USD each task took.",
            "sections": sections, "facts": facts, "default": "tasks"}


def reward_card(summary: dict, settings: dict) -> dict:
    rew = settings.get("reward", {})
    facts = {"stage": "reward-data", "evolforge_version": __version__, "run_id": summary["run_id"],
             "lineage": {"evolve_out": summary.get("evolve_out"), "irm_pairs": summary.get("irm_pairs"),
                         "prm_rows": summary.get("prm_rows"), "health": summary.get("health")},
             "generation": {"reward": rew, "models": settings.get("models", {})},
             "models": _models(summary["cost"]), "cost": _cost(summary["cost"])}
    h = summary.get("health") or {}
    sections = {
        "Lineage": [f"Made from the evolved instructions of `{summary.get('evolve_out')}`: "
                    f"{summary.get('irm_pairs')} IRM preference pairs (versions of an instruction ranked by a judge) "
                    f"and {summary.get('prm_rows')} answers with PRM step labels "
                    f"(method `{rew.get('step_label_method')}`). Data health checks "
                    f"{'passed' if h.get('passed') else 'FAILED: ' + '; '.join(h.get('problems') or [])}."],
        "Generation settings": ["```yaml", *_yaml(rew).splitlines(), "```"],
        **_common_sections(facts),
    }
    return {"title": "evolforge reward-model data",
            "description": "Reward-model training data made by evolforge: `irm_pairs` (TRL RewardTrainer: "
                           "chosen / rejected), `irm_groups` (every ranked group), `prm_steps` (TRL stepwise "
                           "supervision: prompt, completions, labels), `prm_rejected` (answers that could not be "
                           "labelled, with the reason).",
            "sections": sections, "facts": facts, "default": "irm_pairs"}


def _yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=True, width=1000)
