"""What a trajectories export reports: the summary table, the markdown report, the plots and the dataset card.
Plain functions over the export's summary (tasks/trajectories/export.publish) and the transitions table's
figures (storage/trajectory_sets.call_figures); flows/trajectories.py writes them.

    summary_rows(summary)                 the `trajectories-summary` table artifact: what was exported, counted
    markdown(summary, proxy_out, out)     the `trajectories-report` markdown artifact
    trajectory_calls(...), session_rewards(rewards)   the two plots (PNG bytes)
    plots(calls)                          both, from call_figures (OUT/plots/, the `trajectories-plots` artifact)
    card(summary, settings, models)       the dataset card's content (storage/cards.py writes it)
"""

from __future__ import annotations

from evolforge import __version__
from evolforge.tasks.report.card import as_yaml, cell, no_calls_cost
from evolforge.tasks.report.plots import COLORS, empty_plot, finite, hist, plt, png


def summary_rows(summary: dict) -> list[dict]:
    """The `trajectories-summary` table: sessions, rewards, conversations, transitions, drops and token samples."""
    s, r, tok = summary["sessions"], summary["rewards"], summary["tokens"] or {}
    roles = summary.get("roles") or {}
    picked = [{"what": f"calls of other agents left out (--roles {','.join(roles['selected'])})",
               "count": roles.get("calls_left_out", 0)},
              {"what": "sessions without a selected agent's call", "count": roles.get("sessions_left_out", 0)}
              ] if roles.get("selected") else []
    return [
        {"what": "sessions exported", "count": s["exported"]},
        *picked,
        {"what": "sessions skipped (unfinished)", "count": s["skipped_unfinished"]},
        {"what": "sessions with a reward", "count": r["with_reward"]},
        {"what": "sessions without a reward", "count": r["without_reward"]},
        {"what": "conversations (sft.jsonl)", "count": summary["conversations"]["exported"]},
        {"what": "transitions", "count": summary["transitions"]["exported"]},
        {"what": "duplicate prompts dropped", "count": summary["duplicates"].get("dropped", 0)},
        {"what": "failed calls skipped", "count": summary["calls"]["failed_skipped"]},
        {"what": "token samples", "count": tok.get("samples", 0)},
        {"what": "token samples with drift", "count": tok.get("drifted", 0)},
    ]


def markdown(summary: dict, proxy_out: str, out: str) -> str:
    """The `trajectories-report` artifact: sessions, rewards, failed calls and token drift of the export."""
    s, r, tok = summary["sessions"], summary["rewards"], summary["tokens"] or {}
    return "\n".join([
        f"# Trajectories from `{proxy_out}`", "",
        f"Sessions: {s['total']} seen, {s['exported']} exported, {s['skipped_unfinished']} unfinished skipped; "
        f"finished by {s['finished_by']}.",
        f"Rewards: {r['with_reward']} with, {r['without_reward']} without ({r['precedence']}; "
        f"{r['file_overrode_event']} event rewards overridden by the file).",
        f"Calls: {summary['calls']['failed_skipped']} failed skipped {summary['calls']['failed_by_status']}.",
        *_roles_line(summary.get("roles") or {}),
        f"Token drift: {tok.get('drifted', 0)} of {tok.get('with_upstream_ids', 0)} samples with upstream token ids "
        f"(rate {tok.get('drift_rate')}).", "", f"Files: `{out}`"])


def _roles_line(roles: dict) -> list[str]:
    if not roles.get("selected"):
        return []
    return [f"Agents: only {', '.join(roles['selected'])} exported (--roles); calls by role "
            f"{roles.get('calls_by_role')}, {roles.get('calls_left_out', 0)} calls of other agents and "
            f"{roles.get('sessions_left_out', 0)} sessions without a selected agent's call left out."]


def trajectory_calls(calls_per_session: list[int], prompt_tokens: list, completion_tokens: list,
                     latency_s: list) -> bytes:
    """Exported trajectories: model calls per session, prompt and completion tokens per call (as the upstream
    reported them), latency per call."""
    title = "Recorded agent traffic (exported calls)"
    if not calls_per_session:
        return empty_plot(title, "no exported sessions")
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.9))
    hist(axes[0], calls_per_session, "Calls per session", "calls", COLORS[0], integer=True)
    hist(axes[1], prompt_tokens, "Prompt tokens per call", "tokens", COLORS[1])
    hist(axes[2], completion_tokens, "Completion tokens per call", "tokens", COLORS[2])
    hist(axes[3], latency_s, "Latency per call", "seconds", COLORS[3])
    fig.suptitle(title)
    return png(fig)


def session_rewards(rewards: list) -> bytes:
    """The sessions' rewards (the rewards file or the proxy's reward events); sessions without one counted."""
    title = "Session rewards"
    vals = finite(rewards)
    missing = len(rewards) - len(vals)
    if not rewards:
        return empty_plot(title, "no exported sessions")
    fig, ax = plt.subplots(figsize=(6.5, 3.9))
    hist(ax, vals, title, "reward", COLORS[4])
    ax.set_title(f"{title}: {len(vals)} sessions with a reward, {missing} without", pad=20)
    return png(fig)


def plots(calls: dict[str, list]) -> dict[str, bytes]:
    """trajectory_calls and session_rewards from storage/trajectory_sets.call_figures."""
    return {"trajectory_calls": trajectory_calls(calls["calls_per_session"], calls["prompt_tokens"],
                                                 calls["completion_tokens"], calls["latency_s"]),
            "session_rewards": session_rewards(calls["session_rewards"])}


def card(summary: dict, settings: dict, models: list[dict]) -> dict:
    """The card of a trajectories folder. `models`: the recorded calls by model (storage.cards.column_counts of
    the transitions table with the token sums); the agent made those calls, evolforge made none."""
    dedup = settings.get("dedup", {})
    gen = {"session_idle_seconds": summary["sessions"].get("idle_seconds"),
           "include_unfinished": summary["sessions"].get("include_unfinished"),
           "roles": (summary.get("roles") or {}).get("selected"),
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
                    f"{summary['calls']['failed_skipped']} failed calls skipped." +
                    "".join(f" {x}" for x in _roles_line(summary.get("roles") or {})),
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
