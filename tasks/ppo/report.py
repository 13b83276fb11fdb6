"""What a PPO run reports: its summary (summary.json) and the counts stage.json keeps, the Prefect artifacts
(the GRPO steps, the reward health during training, the markdown summary), the plots, the dataset card of data/,
and its outcome (the health policy, the Ray job's status). Plain functions; flows/ppo.py writes them.

    summarize(params, ...)        summary.json: data, verl, Ray job, GRPO smoke run, training health, paths
    counts(summary)               the figures stage.json keeps
    tables(local)                 the `ppo-local-steps` and `ppo-training-health` table artifacts
    markdown(summary)             the `ppo-summary` artifact
    plots(local, lay)             grpo_training, held_out_reward (PNG bytes; when the GRPO smoke run ran)
    card(summary, settings, ...)  the content of data/README.md (config `prompts`: train, test)
    outcome(...)                  after summary.json: the reward health policy over the GRPO steps (raises under
                                  'stop'), then the Ray job's status (raises unless it succeeded or is running)
"""

from __future__ import annotations

import logging

from evolforge import __version__
from evolforge.config.settings import RewardSettings
from evolforge.storage import ppo as store
from evolforge.tasks.core.health import enforce
from evolforge.tasks.core.reporting import markdown_table
from evolforge.tasks.ppo import ray_jobs
from evolforge.tasks.ppo.job import JobPlan
from evolforge.tasks.ppo.stage import PPOParams
from evolforge.tasks.ppo.training_health import health_markdown
from evolforge.tasks.report.card import as_yaml, no_calls_cost
from evolforge.tasks.report.plots import COLORS, empty_plot, finite, integer_ticks, plt, png


def summarize(params: PPOParams, evolved, health: dict, counts: dict, job_plan: JobPlan, job: dict | None,
              local: dict | None, policy: dict | None, lay: store.PPOLayout) -> dict:
    """The run's summary: inputs, pre-flight, prompt data, verl configuration, Ray job, GRPO smoke run, paths."""
    return {
        "evolved": str(evolved), "tasks": params.tasks,
        "preflight": health, "data": counts, "ground_truth_sources": counts["ground_truth_sources"],
        "verl": {k: v for k, v in job_plan.verl.items() if k != "entrypoint"}, "ray_job": job,
        "job_command": job_plan.command,
        "local_grpo": {k: v for k, v in local.items() if k != "health"} if local else None,
        "training_health": local.get("health") if local else None,
        "paths": {"train": str(lay.train), "test": str(lay.test), "verl_config": str(lay.verl_config),
                  "submit": str(lay.submit_script), "initial_policy": (policy or {}).get("path"),
                  "initial_policy_kind": (policy or {}).get("kind"),
                  "policy": local["policy_dir"] if local else None, "metrics": str(lay.metrics) if local else None,
                  "training_health": str(lay.local_health) if local and local.get("health") else None},
    }


def counts(summary: dict) -> dict:
    """The figures stage.json keeps: prompts (train, test, with a ground truth) and GRPO steps taken."""
    local = summary.get("local_grpo") or {}
    return {"train": summary["data"]["train"], "test": summary["data"]["test"],
            "with_ground_truth": summary["data"]["with_ground_truth"], "grpo_steps": len(local.get("steps") or [])}


def tables(local: dict | None) -> dict[str, tuple[list[dict], str]]:
    """Artifact key -> (rows, description): the GRPO steps, and the reward health checks during them."""
    if not local:
        return {}
    out = {"ppo-local-steps": (local["steps"], "GRPO smoke run: reward, KL, loss and seconds per step")}
    if local.get("health"):
        out["ppo-training-health"] = (local["health"]["checks"], "Reward health during the GRPO steps: share of "
                                      "rA < 0.5, reward drift")
    return out


def _irm_line(sel: dict | None, dropped: int) -> str:
    if not sel:
        return "IRM selection (reward.select_by_irm): off, every evolved prompt is trained on."
    rule = f"top {sel['share']:.0%}" if sel["mode"] == "share" else f"score >= {sel['threshold']}"
    return (f"IRM selection ({rule}): {sel['selected']} of {sel['scored']} evolved instructions selected "
            f"(mean IRM score {sel['score_mean']}); {dropped} training prompts left out; each row's lineage "
            "carries irm_score / irm_rank / irm_selected.")


def markdown(summary: dict) -> str:
    """The `ppo-summary` artifact: prompts, reward health, verl job, Ray job, GRPO steps and comparison."""
    job = summary["ray_job"]
    lines = ["# PPO stage (verl PPO job, GRPO smoke run)", "",
             f"Prompts: {summary['data']['train']} train, {summary['data']['test']} held-out "
             f"({summary['data']['with_ground_truth']} with a ground truth; by source: "
             + ", ".join(f"{k} {v}" for k, v in summary["ground_truth_sources"].items()) + ").",
             f"Reward stage health: {'healthy' if summary['preflight']['healthy'] else 'UNHEALTHY (overridden)'}.",
             "Decontamination (n-gram overlap with the evaluation sets): " + ("; ".join(
                 f"{name} {r['checked']} checked, {r['overlapping']} overlapping, {r['dropped']} dropped"
                 for name, r in (summary["data"].get("decontamination") or {}).items()) or "not checked") + ".",
             _irm_line(summary["data"].get("irm_selection"), summary["data"]["dropped"].get("irm_selection", 0)),
             f"verl {summary['verl']['algorithm']}: configuration `{summary['verl']['config']}`, command in "
             f"`{summary['paths']['submit']}`.",
             (f"Ray job ({job['kind']}): {job['submission_id']} at {job['address']}, {job['status']}"
              + (f" ({job['message']})" if job.get("message") else "") + "." if job else
              f"Ray job: not submitted (no cluster address); command: `{summary['job_command']}`.")]
    local = summary.get("local_grpo")
    if local:
        c = local["comparison"]
        where = f"Ray job {local['job_id']} on {local['host']}" if local["ran_on"] == "ray_job" else "this machine"
        lines += ["", f"## GRPO smoke run (SmolLM2-135M, CPU, on {where}: a plumbing check, not training)", ""]
        nan = float("nan")
        lines += markdown_table(["step", "reward", "kl", "loss", "seconds"],
                                [[s["step"], f"{s.get('reward', nan):.4f}", f"{s.get('kl', nan):.5f}",
                                  f"{s.get('loss', nan):.6f}", f"{s.get('step_seconds', nan):.1f}"]
                                 for s in local["steps"]])
        if c:
            lines += ["", f"Held-out mean reward r = rI * rA on {c['n_prompts']} {c['eval_split']} prompts, "
                      f"{c['initial_policy']} policy {c['initial_mean_reward']:.4f}, trained "
                      f"{c['trained_mean_reward']:.4f} (change {c['delta']:+.4f}). This is a change in mean reward, "
                      "not in accuracy: pass@1 is measured by `evolforge eval`."]
        if summary["training_health"]:
            lines += ["", "## Reward health during training", ""] + health_markdown(summary["training_health"])
    return "\n".join(lines)


def outcome(local: dict | None, job: dict | None, job_plan: JobPlan, reward: RewardSettings, lay: store.PPOLayout,
            logger: logging.Logger | logging.LoggerAdapter) -> None:
    """After summary.json and the artifacts: reward.health_policy over the GRPO steps' health (raises under
    'stop', warns under 'warn'), then the Ray job (raises when it failed, was stopped or did not finish in time;
    a succeeded smoke-run job must have left its result where this run can read it)."""
    if local and local.get("health"):
        warning = enforce(local["health"], reward.health_policy)  # raises under policy 'stop'
        if warning:
            logger.warning("%s (policy warn: the run went on)", warning)
    if job:
        ray_jobs.raise_for_status(job)
        if job_plan.smoke_on_cluster and job["status"] == "SUCCEEDED" and local is None:
            raise ray_jobs.RayJobError(f"Ray job {job['submission_id']} succeeded but {lay.local_run} is not its "
                                       "result: does the cluster share this filesystem?")


# ----------------------------------------------------------------------------------------------------- plots

def plots(local: dict, lay: store.PPOLayout) -> dict[str, bytes]:
    """grpo_training (reward, KL, loss per step, the health watch) and held_out_reward (initial vs trained, from
    local/comparison.json when the run compared them)."""
    comparison = store.read_json(lay.comparison) if local.get("comparison") and lay.comparison.exists() else None
    return draw(local["steps"], local.get("health"), comparison)


def draw(steps: list[dict], health: dict | None, comparison: dict | None) -> dict[str, bytes]:
    """The two plots from the GRPO steps, the health report and the full comparison."""
    c = comparison or {}
    return {"grpo_training": grpo_training(steps, health),
            "held_out_reward": policy_rewards((c.get("initial") or {}).get("rewards") or [],
                                              (c.get("trained") or {}).get("rewards") or [],
                                              c.get("eval_split") or "test", c.get("initial_policy") or "initial")}


def grpo_training(steps: list[dict], health: dict | None = None) -> bytes:
    """Per GRPO step: mean reward (band: +-reward_std) with its rI and rA parts, KL to the initial policy, loss; the
    steps the reward health watch saw are shaded, its verdict and drift window means are drawn on the reward."""
    title = "GRPO smoke run: reward and health per step"
    steps = sorted((s for s in steps if isinstance(s.get("step"), (int, float))), key=lambda s: s["step"])
    if not steps:
        return empty_plot(title, "no GRPO steps were logged")
    xs = [s["step"] for s in steps]

    def series(key):
        pts = [(x, s.get(key)) for x, s in zip(xs, steps)]
        return [(x, float(v)) for x, v in pts if finite([v])]

    fig, (ax_r, ax_k, ax_l) = plt.subplots(1, 3, figsize=(12, 4))
    reward = series("reward")
    if reward:
        rx, ry = zip(*reward)
        std = {x: float(s["reward_std"]) for x, s in zip(xs, steps) if finite([s.get("reward_std")])}
        if std:
            ax_r.fill_between(rx, [y - std.get(x, 0.0) for x, y in reward], [y + std.get(x, 0.0) for x, y in reward],
                              color=COLORS[0], alpha=0.15, label="+- reward std")
        ax_r.plot(rx, ry, marker="o", color=COLORS[0], label="reward r = rI * rA")
    for k, (key, label) in enumerate((("reward/r_i", "rI (IRM)"), ("reward/r_a_prm", "rA (PRM)"))):
        pts = series(key)
        if pts:
            ax_r.plot(*zip(*pts), marker=".", ls="--", color=COLORS[k + 1], label=label)
    verdict = ""
    if health:
        watched = int(health.get("steps_watched") or 0)
        if watched:
            ax_r.axvspan(min(xs) - 0.5, min(xs) - 0.5 + watched, color="green", alpha=0.07, label="health watch")
        drift = health.get("drift") or {}
        for key, ls, label in (("baseline_mean", ":", "baseline mean"), ("recent_mean", "-.", "recent mean")):
            if drift.get(key) is not None:
                ax_r.axhline(float(drift[key]), color="gray", ls=ls, lw=1, label=label)
        r_a = health.get("r_a") or {}
        share = r_a.get("share_below_half")
        verdict = (f"health {'PASSED' if health.get('passed') else 'FAILED'}"
                   + (f", {share:.0%} of rA < 0.5" if share is not None else "")
                   + (f", stopped at step {health['stopped_at_step']}" if health.get("stopped_at_step") else ""))
    ax_r.set_ylim(-0.05, 1.05)
    ax_r.set_ylabel("reward")
    ax_r.set_title("Reward", pad=30)
    ax_r.legend(fontsize=7, ncols=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    for ax, key, name in ((ax_k, "kl", "KL to the initial policy"), (ax_l, "loss", "Loss")):
        pts = series(key)
        if pts:
            ax.plot(*zip(*pts), marker="o", color=COLORS[3 if key == "kl" else 4])
        else:
            ax.text(0.5, 0.5, f"no {key} logged", ha="center", va="center", transform=ax.transAxes, color="gray")
        ax.set_title(name, pad=30)
    for ax in (ax_r, ax_k, ax_l):
        ax.set_xlabel("step")
        integer_ticks(ax.xaxis)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}" + (f" ({verdict})" if verdict else ""))
    return png(fig)


def policy_rewards(initial: list[float], trained: list[float], eval_split: str = "test",
                   initial_name: str = "initial") -> bytes:
    """Held-out rewards of the initial (SFT or base) and the trained policy's greedy completions (0..1, same prompts),
    with means."""
    title = f"Held-out reward: {initial_name} policy vs trained ({eval_split} prompts)"
    sets = {f"{initial_name} policy": finite(initial), "trained": finite(trained)}
    if not any(sets.values()):
        return empty_plot(title, "no held-out comparison (the run was stopped, or no prompts)")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.hist(list(sets.values()), bins=10, range=(0, 1), color=[COLORS[0], COLORS[1]],
            label=[f"{k} (n={len(v)})" for k, v in sets.items()], edgecolor="white")
    for k, (name, vals) in enumerate(sets.items()):
        if vals:
            m = sum(vals) / len(vals)
            ax.axvline(m, color=COLORS[k], lw=1.5, ls="--", label=f"{name} mean {m:.3f}")
    ax.set_xlim(-0.02, 1.02)
    integer_ticks(ax.yaxis)
    ax.set_xlabel("reward r = rI * rA")
    ax.set_ylabel("prompts")
    ax.set_title(title, pad=34)  # above the two-row legend
    ax.legend(fontsize=7, ncols=2, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return png(fig)


# ------------------------------------------------------------------------------------------------------ card

# the PPO settings a card shows: what shapes the prompt data and its reward, never the cluster's address, job
# environment (ray_env_vars may hold tokens) or paths
PPO_DATA_KEYS = ("test_fraction", "split_seed", "held_out_seeds", "unverified_ground_truth", "answer_in_steps", "aggregation",
                 "answer_weight", "adv_estimator", "kl_coef", "max_prompt_length", "max_response_length")


def card(summary: dict, settings: dict, irm: str, prm: str) -> dict:
    """The card of a PPO run's data/ folder: the verl prompt parquet (train / test splits of one config);
    `irm`, `prm`: the reward model folders the PPO job scores with."""
    ppo = settings.get("ppo", {})
    gen = {k: ppo.get(k) for k in PPO_DATA_KEYS}
    data = summary["data"]
    policy = ppo.get("policy_path") or (summary["paths"].get("initial_policy") if summary["paths"].get(
        "initial_policy_kind") == "sft" else "the base policy converted from " + (ppo.get("policy_gguf") or
                                                                                  "SmolLM2-135M-Instruct (GGUF)"))
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
