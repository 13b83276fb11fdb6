"""What a dataset card says, assembled from a stage's summary and settings: title, description, body sections
(lineage and generation settings, models used, cost) and the same facts for the card's YAML header.
storage/cards.py writes it beside the tables. No secrets: only the stage's own settings sections and the
models the ledger saw (the gateway section, which holds the endpoint and keys, is never read)."""

from __future__ import annotations

from evolforge.tasks.core.reporting import usd


def card_models(cost: dict) -> list[dict]:
    return [{"stage": s["stage"], "model": s["model"], "calls": s["calls"]} for s in cost.get("by_stage", [])]


def card_cost(cost: dict) -> dict:
    return {"usd": cost.get("cost_usd"), "attempts": cost.get("attempts", 0),
            "prompt_tokens": cost.get("prompt_tokens", 0), "completion_tokens": cost.get("completion_tokens", 0),
            "unpriced_attempts": cost.get("unpriced_attempts", 0)}


def common_sections(facts: dict) -> dict[str, list[str]]:
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


def as_yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=True, width=1000)


def cell(value: object) -> str:
    """A value from untrusted input (an agent's model name) as one markdown table cell: no pipe, no line break."""
    return " ".join(str(value).split()).replace("|", "\\|").replace("`", "'")


def no_calls_cost() -> dict:
    return {"usd": 0.0, "attempts": 0, "prompt_tokens": 0, "completion_tokens": 0, "unpriced_attempts": 0}


