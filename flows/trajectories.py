"""Trajectories flow: agent traffic recorded by the proxy -> SFT conversations, per-call transitions,
token-level samples.

PROXY_OUT (records/, events/ of `evolforge proxy`) -> finished sessions (a finish event, idle for
proxy.session_idle_seconds, or an ancestor's finish event; others skipped unless include_unfinished) ->
    OUT/sft.jsonl            TRL SFTTrainer conversations: messages (OpenAI form, tool calls) + tools
    OUT/data/train-00000-of-00001.parquet
                             transitions, one row per call: prompt, completion, the session reward (GRPO /
                             RLOO); what load_dataset("parquet", data_dir=OUT) loads
    OUT/tokens.parquet       input_ids, assistant loss mask, turn boundaries, drift flags
    OUT/duplicates.parquet   prompts dropped as duplicates of another session's, with the reason
    OUT/skipped.parquet      unfinished sessions, failed calls, ... with the reason
    OUT/summary.json         counts by reward presence, finished / unfinished, failed calls, drift rate
    OUT/plots/*.png          trajectory_calls (calls per session, tokens and latency per call), session_rewards;
                             inline in the `trajectories-plots` markdown artifact
    OUT/README.md            the dataset card: the parquet tables as `datasets` configs (sft.jsonl is json: its
                             body says how to load it)
Formats: storage/trajectory_sets.py. The steps (one Prefect task each): tasks/trajectories/export.py.
Live progress (the terminal, the `trajectories-progress-*` artifacts): sessions grouped, conversations tokenized.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from evolforge.flows._params import StageParams
from evolforge.flows._report import attach_card, attach_plots, progress_artifacts
from evolforge.storage.cards import column_counts
from evolforge.storage.fs import write_json_atomic
from evolforge.storage.trajectory_sets import TrajectoryLayout, call_figures
from evolforge.tasks.core.checks import check_trajectories
from evolforge.tasks.report.card import trajectories_card
from evolforge.tasks.report.plots import trajectory_plots
from evolforge.tasks.trajectories.export import collect, dedup_prompts, publish, token_samples


class TrajectoriesParams(StageParams):
    """Parameters of the trajectories flow (sessions go idle after [proxy] session_idle_seconds)."""

    proxy_out: str = Field(..., description="The recording proxy's folder (evolforge proxy --out).")
    out: str = Field(..., description="Output folder: sft.jsonl, transitions (data/), tokens.parquet, summary.json.")
    rewards: str | None = Field(None, description="A jsonl / csv / parquet file with session and reward columns; "
                                "it wins over the proxy's reward events for the sessions it lists.")
    tokenizer: str | None = Field(None, description="Tokenizer of the token-level samples: a model folder or a GGUF "
                                  "file (default: the embedded model's GGUF, embedded.model_path or SmolLM2).")
    include_unfinished: bool = Field(False, description="Also export sessions that are not finished yet.")
    dedup: bool = Field(True, description="Drop conversations whose first user message duplicates another "
                        "session's ([dedup] methods). Off keeps every rollout of a prompt (e.g. GRPO groups).")
    tokens: bool = Field(True, description="Write the token-level samples (loads the tokenizer).")


@task(name="trajectories-collect")
def collect_task(params_json: str) -> dict:
    p = TrajectoriesParams.model_validate_json(params_json)
    return collect(p.proxy_out, p.out, idle_seconds=p.settings().proxy.session_idle_seconds,
                   rewards_file=p.rewards, include_unfinished=p.include_unfinished)


@task(name="trajectories-dedup")
def dedup_task(params_json: str) -> dict:
    p = TrajectoriesParams.model_validate_json(params_json)
    return dedup_prompts(p.out, p.settings().dedup, enabled=p.dedup)


@task(name="trajectories-tokens")
def tokens_task(params_json: str) -> dict:
    p = TrajectoriesParams.model_validate_json(params_json)
    return token_samples(p.out, p.tokenizer, p.settings().embedded.model_path)


@task(name="trajectories-publish")
def publish_task(params_json: str) -> dict:
    p = TrajectoriesParams.model_validate_json(params_json)
    return publish(p.out, tokens=p.tokens)


@flow(name="trajectories", log_prints=True)
def trajectories_flow(params: TrajectoriesParams) -> dict:
    logger = get_run_logger()
    params.settings()  # a bad config fails before anything is read
    check_trajectories(params.proxy_out, params.out, params.rewards)  # before anything is created (tasks/core/checks.py)
    pj = params.model_dump_json()
    with progress_artifacts("trajectories-progress", "trajectories "):  # sessions, then token samples
        collected = collect_task(pj)
        logger.info("trajectories: %d records, %d sessions (%d exported)", collected["counts"].get("records", 0),
                    collected["counts"].get("sessions", 0), collected["counts"].get("sessions_exported", 0))
        dedup_task(pj)
        if params.tokens:
            tokens_task(pj)
    summary = publish_task(pj)
    lay = TrajectoryLayout(params.out)
    models = column_counts(lay.transitions, "model", ("prompt_tokens", "completion_tokens"))
    summary["card"] = attach_card(lay.root, {"transitions": lay.transitions, "tokens": lay.tokens,
                                            "duplicates": lay.duplicates, "skipped": lay.skipped},
                                  trajectories_card(summary, params.settings().fingerprint(), models))
    summary["plots"] = attach_plots(lay, "trajectories-plots", "Trajectories plots",
                                    lambda: trajectory_plots(call_figures(lay)))
    write_json_atomic(lay.summary, summary)  # summary.json names the card and the plots too
    s, r, tok = summary["sessions"], summary["rewards"], summary["tokens"] or {}
    create_table_artifact(key="trajectories-summary", description=f"Trajectories from {params.proxy_out}", table=[
        {"what": "sessions exported", "count": s["exported"]},
        {"what": "sessions skipped (unfinished)", "count": s["skipped_unfinished"]},
        {"what": "sessions with a reward", "count": r["with_reward"]},
        {"what": "sessions without a reward", "count": r["without_reward"]},
        {"what": "conversations (sft.jsonl)", "count": summary["conversations"]["exported"]},
        {"what": "transitions", "count": summary["transitions"]["exported"]},
        {"what": "duplicate prompts dropped", "count": summary["duplicates"].get("dropped", 0)},
        {"what": "failed calls skipped", "count": summary["calls"]["failed_skipped"]},
        {"what": "token samples", "count": tok.get("samples", 0)},
        {"what": "token samples with drift", "count": tok.get("drifted", 0)},
    ])
    create_markdown_artifact(key="trajectories-report", description="Trajectories export", markdown="\n".join([
        f"# Trajectories from `{params.proxy_out}`", "",
        f"Sessions: {s['total']} seen, {s['exported']} exported, {s['skipped_unfinished']} unfinished skipped; "
        f"finished by {s['finished_by']}.",
        f"Rewards: {r['with_reward']} with, {r['without_reward']} without ({r['precedence']}; "
        f"{r['file_overrode_event']} event rewards overridden by the file).",
        f"Calls: {summary['calls']['failed_skipped']} failed skipped {summary['calls']['failed_by_status']}.",
        f"Token drift: {tok.get('drifted', 0)} of {tok.get('with_upstream_ids', 0)} samples with upstream token ids "
        f"(rate {tok.get('drift_rate')}).", "", f"Files: `{params.out}`"]))
    logger.info("trajectories: %d conversations, %d transitions -> %s", summary["conversations"]["exported"],
                summary["transitions"]["exported"], params.out)
    return summary
