"""What a dataset card says, assembled from a stage's summary and settings: title, description, body sections
(lineage and generation settings, models used, cost) and the same facts for the card's YAML header.
storage/cards.py writes it beside the tables. No secrets: only the stage's own settings sections and the
models the ledger saw (the gateway section, which holds the endpoint and keys, is never read)."""

from __future__ import annotations

from evolforge import __version__
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


def evolve_card(summary: dict, settings: dict) -> dict:
    """The card of an evolve run's dataset/ folder (summary.json and the run's settings fingerprint)."""
    evo = settings.get("evol_instruct", {})
    facts = {
        "stage": "evolve", "evolforge_version": __version__, "run_id": summary["run_id"],
        "lineage": {"seeds": str(summary.get("seeds")), "rounds": summary.get("rounds_in_datasets"),
                    "counts": summary.get("counts")},
        "generation": {"evol_instruct": evo, "models": settings.get("models", {})},
        "models": card_models(summary["cost"]), "cost": card_cost(summary["cost"]),
    }
    rounds = ["| round | attempts | accepted | survival | eliminated by rule |", "|---|---|---|---|---|"] + [
        f"| {r['round']} | {r['attempts']} | {r['accepted']} | {r['survival']:.1%} | "
        f"{', '.join(f'{k}: {v}' for k, v in sorted(r['by_rule'].items())) or '-'} |" for r in summary["rounds"]]
    sections = {
        "Lineage": [f"Seeds: `{summary.get('seeds')}`, evolved over {len(summary['rounds'])} Evol-Instruct round(s) "
                    "(in-depth and in-breadth operations, each attempt judged and eliminated by rule). Every record "
                    "keeps `parent_id`, `seed_id`, `round`, `operation` and `direction`; the `lineage` config holds "
                    "every attempt, eliminated ones with their `elimination_rule`.", "", *rounds],
        "Generation settings": ["```yaml", *as_yaml(evo).splitlines(), "```"],
        **common_sections(facts),
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
             "models": card_models(cost), "cost": card_cost(cost)}
    sections = {
        "Lineage": [f"{summary['kept']} tasks kept of {summary['proposed']} proposed from the seed instructions "
                    f"(yield {summary['yield']:.0%}); each proposal was checked by running its tests in the sandbox, "
                    "repaired when they failed, and rated by solver attempts (difficulty from the pass rate). "
                    "Rejections: " + (", ".join(f"{k}: {v}" for k, v in summary["rejections"].items()) or "none") + "."],
        "Generation settings": ["```yaml", *as_yaml(syn["synthesis"]).splitlines(), "```"],
        **common_sections(facts),
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


def as_yaml(data: dict) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=True, width=1000)


def cell(value: object) -> str:
    """A value from untrusted input (an agent's model name) as one markdown table cell: no pipe, no line break."""
    return " ".join(str(value).split()).replace("|", "\\|").replace("`", "'")


def no_calls_cost() -> dict:
    return {"usd": 0.0, "attempts": 0, "prompt_tokens": 0, "completion_tokens": 0, "unpriced_attempts": 0}


# the PPO settings a card shows: what shapes the prompt data and its reward, never the cluster's address, job
# environment (ray_env_vars may hold tokens) or paths
PPO_DATA_KEYS = ("test_fraction", "split_seed", "unverified_ground_truth", "answer_in_steps", "aggregation",
                 "answer_weight", "adv_estimator", "kl_coef", "max_prompt_length", "max_response_length")


def ppo_card(summary: dict, settings: dict, irm: str, prm: str) -> dict:
    """The card of a PPO run's data/ folder: the verl prompt parquet (train / test splits of one config);
    `irm`, `prm`: the reward model folders the PPO job scores with."""
    ppo = settings.get("ppo", {})
    gen = {k: ppo.get(k) for k in PPO_DATA_KEYS}
    data = summary["data"]
    policy = ppo.get("policy_path") or "the SFT policy converted from " + (ppo.get("policy_gguf") or
                                                                          "SmolLM2-135M-Instruct (GGUF)")
    facts = {"stage": "ppo", "evolforge_version": __version__, "run_id": summary["run_id"],
             "lineage": {"evolved": summary.get("evolved"), "tasks": summary.get("tasks"),
                         "train": data.get("train"), "test": data.get("test"),
                         "with_ground_truth": data.get("with_ground_truth"),
                         "ground_truth_sources": summary.get("ground_truth_sources")},
             "generation": {"ppo": gen},
             "models": [{"stage": "policy", "model": policy, "calls": 0},
                        {"stage": "reward (IRM)", "model": irm, "calls": 0},
                        {"stage": "reward (PRM)", "model": prm, "calls": 0}],
             "cost": no_calls_cost()}
    sources = ", ".join(f"{k}: {v}" for k, v in (summary.get("ground_truth_sources") or {}).items()) or "none"
    sections = {
        "Lineage": [f"Prompts made from the evolved instructions `{summary.get('evolved')}`"
                    + (f" and the synthesized tasks `{summary['tasks']}`" if summary.get("tasks") else "") +
                    f": {data.get('train')} train and {data.get('test')} held-out test prompts (split by seed "
                    f"lineage), {data.get('with_ground_truth')} with a ground truth (by source: {sources}). verl's "
                    "PPO trainer reads them (`data.train_files`, `data.val_files`); the reward is rI (IRM) x rA "
                    "(PRM, with the rule-based answer check where a ground truth exists)."],
        "Generation settings": ["```yaml", *as_yaml(gen).splitlines(), "```"],
        "Models used": ["No model was called to make these prompts. Training uses:", "",
                        f"- policy: `{policy}`",
                        f"- instruction reward model (IRM): `{irm}`", f"- process reward model (PRM): `{prm}`"],
        "Cost": ["$0: the prompt data is built locally without model calls (training cost is the cluster's)."],
    }
    return {"title": "evolforge PPO prompts",
            "description": "RL prompt data for verl's PPO trainer made by evolforge (RLEIF): `prompts` has a `train` "
                           "and a `test` split, each row a chat prompt with its data source, ability, reward model "
                           "style and ground truth (verl's RL dataset columns).",
            "sections": sections, "facts": facts, "default": "prompts"}


def trajectories_card(summary: dict, settings: dict, models: list[dict]) -> dict:
    """The card of a trajectories folder. `models`: the recorded calls by model (storage.cards.column_counts of
    transitions table with the token sums); the agent made those calls, evolforge made none."""
    dedup = settings.get("dedup", {})
    gen = {"session_idle_seconds": summary["sessions"].get("idle_seconds"),
           "include_unfinished": summary["sessions"].get("include_unfinished"),
           "dedup": {**dedup, "enabled": (summary.get("duplicates") or {}).get("enabled")}}
    s, r = summary["sessions"], summary["rewards"]
    facts = {"stage": "trajectories", "evolforge_version": __version__, "proxy_out": summary.get("proxy_out"),
             "exported_at": summary.get("exported_at"),
             "lineage": {"sessions": s, "rewards": r, "conversations": summary["conversations"],
                         "transitions": summary["transitions"],
                         "duplicates_dropped": (summary.get("duplicates") or {}).get("dropped", 0)},
             "generation": gen,
             "models": [{"stage": "agent (recorded)", "model": m["model"], "calls": m["rows"]} for m in models],
             "cost": {**no_calls_cost(), "prompt_tokens": sum(m.get("prompt_tokens", 0) for m in models),
                      "completion_tokens": sum(m.get("completion_tokens", 0) for m in models)}}
    sections = {
        "Lineage": [f"Agent traffic recorded by `evolforge proxy` in `{summary.get('proxy_out')}`: {s['total']} "
                    f"sessions seen, {s['exported']} exported ({s['skipped_unfinished']} unfinished skipped), "
                    f"{r.get('with_reward')} with a reward and {r.get('without_reward')} without; "
                    f"{summary['conversations']['exported']} conversations, {summary['transitions']['exported']} "
                    f"transitions; {(summary.get('duplicates') or {}).get('dropped', 0)} duplicate prompts dropped; "
                    f"{summary['calls']['failed_skipped']} failed calls skipped.",
                    "", "The SFT conversations are `sft.jsonl` (TRL SFTTrainer's conversational form, tool calls "
                    "included). A card's configs share one file format, so it is not a config here; load it with:",
                    "", "```python", f'load_dataset("json", data_files="{summary.get("out")}/sft.jsonl", '
                    'split="train")', "```"],
        "Generation settings": ["```yaml", *as_yaml(gen).splitlines(), "```"],
        "Models used": ["| model (recorded agent calls) | calls | prompt tokens | completion tokens |",
                        "|---|---|---|---|"] +
                       [f"| `{cell(m['model'])}` | {m['rows']} | {m.get('prompt_tokens', 0)} | "
                        f"{m.get('completion_tokens', 0)} |" for m in models] if models
                       else ["No recorded call names a model."],
        "Cost": [f"$0 by evolforge (it only exports recorded traffic). The agent's calls used "
                 f"{facts['cost']['prompt_tokens']} prompt and {facts['cost']['completion_tokens']} completion "
                 "tokens, priced by whoever ran the agent."],
    }
    return {"title": "evolforge agent trajectories",
            "description": "Agent trajectories exported by evolforge from recorded traffic: `transitions` (one row "
                           "per model call: prompt, completion, the session reward; GRPO / RLOO), `tokens` (input "
                           "ids, assistant loss mask, turn boundaries, drift flags), `duplicates` (prompts dropped "
                           "as another session's duplicate), `skipped` (what was not exported, with the reason).",
            "sections": sections, "facts": facts, "default": "transitions"}


def modules_card(summary: dict, settings: dict) -> dict:
    """The card of a module-DAG (DeCoRL) folder: items, PRM steps, and the single-shot comparison when run."""
    mods = settings.get("modules", {})
    facts = {"stage": "modules", "evolforge_version": __version__, "run_id": summary["run_id"],
             "lineage": {"input": summary.get("input"), "items": summary.get("items"),
                         "by_status": summary.get("by_status"), "prm_rows": (summary.get("prm") or {}).get("rows"),
                         "comparison": (summary.get("comparison") or {}).get("overall")},
             "generation": {"modules": mods, "models": settings.get("models", {})},
             "models": card_models(summary["cost"]), "cost": card_cost(summary["cost"])}
    graph = ["| module | output | depends on |", "|---|---|---|"] + [
        f"| {m.get('id')}{' (exit)' if m.get('exit') else ''} | {m.get('output')} | "
        f"{', '.join(m.get('dependencies') or []) or '-'} |" for m in mods.get("graph", [])]
    sections = {
        "Lineage": [f"{summary.get('items')} questions from `{summary.get('input')}` answered by a graph of "
                    f"{len(mods.get('graph', []))} modules along their dependencies (aggregation "
                    f"`{mods.get('aggregation')}`, ablation `{mods.get('ablation')}`); a judge scored the answer "
                    "with and without each module, so each module step carries its contribution and PRM label. "
                    "By status: " + ", ".join(f"{k} {v}" for k, v in (summary.get("by_status") or {}).items()) + ".",
                    "", *graph],
        "Generation settings": ["```yaml", *as_yaml({k: v for k, v in mods.items() if k != "graph"}).splitlines(),
                                "```"],
        **common_sections(facts),
    }
    return {"title": "evolforge module-DAG reasoning",
            "description": "Module-DAG reasoning data (DeCoRL) made by evolforge: `items` (each question's module "
                           "outputs, final answer and per-module contributions), `prm_steps` (TRL stepwise "
                           "supervision: prompt, completions, labels), `prm_rejected` (items that gave no PRM row, "
                           "with the reason), `comparison` (graph vs single-shot answer, same judge; only with "
                           "compare).",
            "sections": sections, "facts": facts, "default": "items"}
