"""Trajectories flow: agent traffic recorded by the proxy -> SFT conversations, per-call transitions,
token-level samples.

PROXY_OUT (records/, events/ of `evolforge proxy`) -> finished sessions (a finish event, idle for
proxy.session_idle_seconds, or an ancestor's finish event; others skipped unless include_unfinished) -> with
--roles, only the calls of the agents named ->
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
    OUT/stage.json           the stage marker (kind, and the counts once finished)
and the `trajectories-summary` table and `trajectories-report` markdown artifacts. No model is called.
Parameters and check: tasks/trajectories/stage.py; files and formats: storage/trajectory_sets.py; the steps
(one Prefect task each): tasks/trajectories/export.py; the table, report, plots and card:
tasks/trajectories/report.py. Live progress (the terminal, the `trajectories-progress-*` artifacts): sessions
grouped, conversations tokenized.
"""

from __future__ import annotations

from prefect import flow, task

from evolforge.flows._report import progress_artifacts
from evolforge.flows._stage import finish_stage, stage_run
from evolforge.storage.cards import column_counts
from evolforge.storage.trajectory_sets import call_figures
from evolforge.tasks.core.batch import settings_from_json
from evolforge.tasks.trajectories import report
from evolforge.tasks.trajectories.export import collect, dedup_prompts, publish, token_samples
from evolforge.tasks.trajectories.stage import TrajectoriesParams

__all__ = ["TrajectoriesParams", "trajectories_flow"]


@task(name="trajectories-collect")
def collect_task(proxy_out: str, out: str, rewards: str | None, include_unfinished: bool, settings_json: str,
                 roles: list[str] | None = None) -> dict:
    return collect(proxy_out, out, idle_seconds=settings_from_json(settings_json).proxy.session_idle_seconds,
                   rewards_file=rewards, include_unfinished=include_unfinished, roles=roles)


@task(name="trajectories-dedup")
def dedup_task(out: str, enabled: bool, settings_json: str) -> dict:
    return dedup_prompts(out, settings_from_json(settings_json).dedup, enabled=enabled)


@task(name="trajectories-tokens")
def tokens_task(out: str, tokenizer: str | None, settings_json: str) -> dict:
    return token_samples(out, tokenizer, settings_from_json(settings_json).embedded.model_path)


@task(name="trajectories-publish")
def publish_task(out: str, tokens: bool) -> dict:
    return publish(out, tokens=tokens)


@flow(name="trajectories", log_prints=True)
def trajectories_flow(params: TrajectoriesParams) -> dict:
    with stage_run("trajectories", params) as run:
        lay, out, sj = run.folder, params.out, run.settings_json
        with progress_artifacts("trajectories-progress", "trajectories "):  # sessions, then token samples
            counts = collect_task(params.proxy_out, out, params.rewards, params.include_unfinished, sj,
                                  params.roles)["counts"]
            run.logger.info("trajectories: %d records, %d sessions (%d exported)", counts.get("records", 0),
                            counts.get("sessions", 0), counts.get("sessions_exported", 0))
            dedup_task(out, params.dedup, sj)
            if params.tokens:
                tokens_task(out, params.tokenizer, sj)
        summary = publish_task(out, params.tokens)
        run.logger.info("trajectories: %d conversations, %d transitions -> %s", summary["conversations"]["exported"],
                        summary["transitions"]["exported"], out)
        models = column_counts(lay.transitions, "model", ("prompt_tokens", "completion_tokens"))
        return finish_stage(
            run, summary, cost=False,
            counts={"sessions": summary["sessions"]["exported"], "conversations": summary["conversations"]["exported"],
                    "transitions": summary["transitions"]["exported"]},
            card=({"transitions": lay.transitions, "tokens": lay.tokens, "duplicates": lay.duplicates,
                   "skipped": lay.skipped}, report.card(summary, run.settings.fingerprint(), models)),
            plots=("Trajectories plots", lambda: report.plots(call_figures(lay))),
            tables={"trajectories-summary": (report.summary_rows(summary), f"Trajectories from {params.proxy_out}")},
            markdown={"trajectories-report": (report.markdown(summary, params.proxy_out, out),
                                              "Trajectories export")})
