"""The export's four steps, each reading and writing files of the output folder (storage/trajectory_sets):

1. collect(proxy_out, out, ...)   records -> sessions (SQLite spool, one session in memory at a time) ->
                                  conversation candidates, transitions and skipped rows (work/*.jsonl, streamed)
2. dedup_prompts(out, settings)   the prompts of the candidates -> duplicates.parquet
3. token_samples(out, ...)        the kept conversations -> tokens.parquet (streamed)
4. publish(out, ...)              sft.jsonl, transitions (data/), skipped.parquet, summary.json; work/ removed

collect's phases: `_proxy_of` (the inputs exist), the spool, `_export_sessions` (how each session finished;
`_export_session` builds and writes one), `_collect_result` (work/collect.json); `_Tally` holds the counts.

Dedup: a conversation's prompt is its first user message, a completions-route call's its prompt text; they
go through the dedup library (exact, MinHash, embeddings per [dedup]), earliest kept. Only duplicates across
sessions are dropped: conversations of one session that share their first message are branches of one
episode (or an agent's retries), which stay. A dropped conversation takes its transitions with it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from evolforge.config.sections.dedup import DedupSettings
from evolforge.storage.fs import ensure_dir, exists, location, read_json, read_parquet, write_json_atomic
from evolforge.storage.proxy_sets import ProxyLayout, iter_events, iter_records
from evolforge.storage.trajectory_sets import (
    DUPLICATE_SCHEMA,
    SKIPPED_SCHEMA,
    TOKEN_SCHEMA,
    TRANSITION_SCHEMA,
    RecordSpool,
    SpooledSession,
    TrajectoryLayout,
    iter_jsonl,
    jsonl_writer,
    read_rewards,
    table_stream,
)
from evolforge.tasks.core.progress import StepProgress
from evolforge.tasks.dedup.pipeline import dedup
from evolforge.tasks.trajectories.samples import SessionContext, build_session, sft_row
from evolforge.tasks.trajectories.sessions import finished_by, gather_events, root_of, session_reward
from evolforge.tasks.trajectories.tokens import ChatRenderer, load_tokenizer, token_sample

REWARD_PRECEDENCE = "the rewards file wins over the proxy's reward events when both give a session a reward"


def collect(proxy_out: str, out: str, *, idle_seconds: float, rewards_file: str | None = None,
            include_unfinished: bool = False, now: float | None = None, roles: list[str] | None = None) -> dict:
    """Step 1: the recording proxy's records (PROXY_OUT) -> work/conversations.jsonl, work/transitions.jsonl,
    work/skipped.jsonl and work/collect.json (counts, how sessions finished, rewards), which it also returns.
    `now` (default: the clock) decides which sessions were idle for `idle_seconds`; unfinished sessions are
    skipped unless `include_unfinished`. With `roles`, only the calls recorded with one of those agent roles
    are exported (the others are left out before a session's conversations are built, so one agent's turns
    never join another's conversation); a session with none of them is skipped as `role_not_selected`.
    FileNotFoundError for a PROXY_OUT without records or a missing rewards file."""
    proxy = _proxy_of(proxy_out, rewards_file)
    lay = TrajectoryLayout(out)
    ensure_dir(lay.work_dir)
    now = time.time() if now is None else now
    t0 = time.perf_counter()
    events = gather_events(iter_events(proxy))
    file_rewards = read_rewards(rewards_file) if rewards_file else {}
    tally = _Tally()
    with RecordSpool() as spool:
        tally.counts["records"] = spool.add(iter_records(proxy))
        _export_sessions(spool, events, file_rewards, lay, tally, idle_seconds=idle_seconds,
                         include_unfinished=include_unfinished, now=now, roles=_role_set(roles))
    result = _collect_result(proxy, tally, events, file_rewards, rewards_file, idle_seconds=idle_seconds,
                             include_unfinished=include_unfinished, now=now, started=t0, roles=_role_set(roles))
    write_json_atomic(lay.work_collect, result)
    return result


@dataclass
class _Tally:
    """What collect counts while it exports sessions, for work/collect.json."""

    counts: Counter = field(default_factory=Counter)            # records, sessions, conversations, ...
    failed: Counter = field(default_factory=Counter)            # failed model calls by HTTP status
    finished: Counter = field(default_factory=Counter)          # sessions by how they finished (or "unfinished")
    rewards: Counter = field(default_factory=Counter)           # exported sessions by reward and its source
    by_role: Counter = field(default_factory=Counter)           # calls of the finished sessions by agent role
    seen_sessions: set[str] = field(default_factory=set)


class _Writers(NamedTuple):
    """The work/ files collect streams rows into: one call appends one row."""

    conversations: Callable[[dict], object]
    transitions: Callable[[dict], object]
    skipped: Callable[[dict], object]


def _proxy_of(proxy_out: str, rewards_file: str | None) -> ProxyLayout:
    """Takes collect's inputs; gives the proxy folder's layout, or FileNotFoundError naming what is missing."""
    proxy = ProxyLayout(proxy_out)
    if not exists(proxy.records_dir):
        raise FileNotFoundError(f"{proxy.records_dir} does not exist: is {proxy_out} the folder of a recording proxy "
                                "(evolforge proxy --out)?")
    if rewards_file and not exists(location(rewards_file)):
        raise FileNotFoundError(f"rewards file {rewards_file} does not exist")
    return proxy


def _export_sessions(spool: RecordSpool, events: dict, file_rewards: dict[str, float], lay: TrajectoryLayout,
                     tally: _Tally, *, idle_seconds: float, include_unfinished: bool, now: float,
                     roles: set[str] | None = None) -> None:
    """Takes the spooled records, the proxy's events and the rewards file's rewards; decides how each session
    finished, skips the unfinished ones (unless `include_unfinished`), keeps only the calls of `roles` (when
    given) and exports the others (`_export_session`), streaming the rows into the work/ files; gives nothing
    but what it counts in `tally`."""
    c = tally.counts
    sessions = spool.sessions()
    status = finished_by(sessions, events, idle_seconds, now)
    parents = {s.session: s.parent_session for s in sessions}
    progress = StepProgress("trajectories sessions", len(sessions), "sessions")  # live progress
    progress.update()
    with jsonl_writer(lay.work_conversations) as conv_out, jsonl_writer(lay.work_transitions) as tr_out, \
            jsonl_writer(lay.work_skipped) as skip_out:
        out = _Writers(conv_out, tr_out, skip_out)
        for s in sessions:
            progress.update(c["sessions"])
            tally.seen_sessions.add(s.session)
            c["sessions"] += 1
            c["sub_agent_sessions"] += bool(s.parent_session)
            fin = status[s.session]
            tally.finished[fin or "unfinished"] += 1
            if fin is None and not include_unfinished:
                out.skipped({"kind": "session", "session": s.session, "record_id": None, "call_index": None,
                             "reason": "unfinished", "detail": f"{s.records} records; last call {now - s.end_ts:.0f} s "
                             f"ago, under proxy.session_idle_seconds ({idle_seconds:g}), and no finish event"})
                c["sessions_skipped_unfinished"] += 1
                continue
            records = spool.records_of(s.session)  # one session's records in memory
            tally.by_role.update(str(r.get("role") or "(none)") for r in records)
            if roles is not None:
                kept = [r for r in records if r.get("role") in roles]
                c["calls_role_not_selected"] += len(records) - len(kept)
                if not kept:
                    out.skipped({"kind": "session", "session": s.session, "record_id": None, "call_index": None,
                                 "reason": "role_not_selected", "detail": f"{len(records)} records, roles "
                                 f"{_role_list(records)}; --roles selects {', '.join(sorted(roles))}"})
                    c["sessions_skipped_role"] += 1
                    continue
                records = kept
            reward = session_reward(s.session, events, file_rewards)
            ctx = SessionContext(s.session, s.parent_session, root_of(s.session, parents), fin, reward)
            _export_session(records, s, ctx, out, tally)
    progress.update(c["sessions"])
    progress.finish(f"{c['sessions_exported']} exported")


def _role_set(roles: list[str] | None) -> set[str] | None:
    picked = {r.strip() for r in roles or () if r and r.strip()}
    return picked or None


def _role_list(records: list[dict]) -> str:
    return ", ".join(sorted({str(r.get("role") or "(none)") for r in records}))


def _export_session(records: list[dict], s: SpooledSession, ctx: SessionContext, out: _Writers,
                    tally: _Tally) -> None:
    """Takes one session's records and context; builds its conversations, transitions and skipped calls
    (samples.build_session) and writes them; a session without a successful model call is skipped as a whole.
    Gives nothing but what it counts in `tally`."""
    c, reward = tally.counts, ctx.reward
    built = build_session(records, ctx)
    c.update(built.counts)
    tally.failed.update(built.failed_by_status)
    for row in built.skipped:
        out.skipped(row)
    if not built.transitions:
        out.skipped({"kind": "session", "session": s.session, "record_id": None, "call_index": None,
                     "reason": "no_successful_call", "detail": f"{s.records} records, none a successful "
                     "model call"})
        c["sessions_without_successful_call"] += 1
        return
    c["sessions_exported"] += 1
    c["sessions_unfinished_included"] += ctx.finished_by is None
    tally.rewards["with_reward" if reward.value is not None else "without_reward"] += 1
    tally.rewards[f"from_{reward.source}"] += reward.source is not None
    tally.rewards["file_overrode_event"] += reward.overrode_event
    tally.rewards["several_reward_events"] += reward.several_events
    for row in built.conversations:
        out.conversations(row)
    for row in built.transitions:
        out.transitions(row)
    c["conversations"] += len(built.conversations)
    c["transitions"] += len(built.transitions)


def _collect_result(proxy: ProxyLayout, tally: _Tally, events: dict, file_rewards: dict[str, float],
                    rewards_file: str | None, *, idle_seconds: float, include_unfinished: bool, now: float,
                    started: float, roles: set[str] | None = None) -> dict:
    """Takes what collect counted and read; gives work/collect.json's content (publish reads it)."""
    rewards, seen = tally.rewards, tally.seen_sessions
    return {
        "proxy_out": str(proxy.root), "exported_at": now, "include_unfinished": include_unfinished,
        "idle_seconds": idle_seconds, "grouping": "SQLite spool in a local temporary folder: one streamed pass "
        "over the records, then one session's records in memory at a time",
        "counts": dict(tally.counts), "failed_calls_by_status": dict(tally.failed),
        "finished_by": {k: tally.finished.get(k, 0) for k in ("event", "idle", "parent", "unfinished")},
        "rewards": {"precedence": REWARD_PRECEDENCE, "file": rewards_file,
                    **{k: rewards.get(k, 0) for k in ("with_reward", "without_reward", "from_event", "from_file",
                                                     "file_overrode_event", "several_reward_events")},
                    "file_sessions_not_in_proxy_out": len(set(file_rewards) - seen),
                    "event_sessions_not_in_proxy_out": len({s for s, e in events.items() if e.rewards} - seen)},
        "roles": {"selected": sorted(roles) if roles else None,
                  "calls_by_role": dict(sorted(tally.by_role.items())),
                  "calls_left_out": tally.counts.get("calls_role_not_selected", 0),
                  "sessions_left_out": tally.counts.get("sessions_skipped_role", 0)},
        "seconds": round(time.perf_counter() - started, 3),
    }


def _units(lay: TrajectoryLayout) -> tuple[list[str], list[str], list[str], dict[str, str], int]:
    """(ids, texts, sessions, kind by id, units without a prompt) of every conversation and completions call."""
    ids, texts, sessions, kinds = [], [], [], {}
    no_prompt = 0
    for conv in iter_jsonl(lay.work_conversations):
        if conv.get("prompt_key"):
            ids.append(conv["conversation_id"])
            texts.append(conv["prompt_key"])
            sessions.append(conv["session"])
            kinds[conv["conversation_id"]] = "conversation"
        else:
            no_prompt += 1
    for tr in iter_jsonl(lay.work_transitions):
        if tr["route"] == "completions" and tr.get("prompt_text"):
            ids.append(tr["transition_id"])
            texts.append(tr["prompt_text"])
            sessions.append(tr["session"])
            kinds[tr["transition_id"]] = "completions_call"
    return ids, texts, sessions, kinds, no_prompt


def dedup_prompts(out: str, settings: DedupSettings, enabled: bool = True) -> dict:
    lay = TrajectoryLayout(out)
    t0 = time.perf_counter()
    ids, texts, sessions, kinds, no_prompt = _units(lay)
    session_of = dict(zip(ids, sessions))
    text_of = dict(zip(ids, texts))
    rows, within_session = [], 0
    if enabled and ids:
        res = dedup(texts, ids, settings)
        for d in res.dropped:
            rep = d["duplicate_of"]
            if session_of[rep] == session_of[d["id"]]:
                within_session += 1  # a branch or retry of the same episode: kept
                continue
            rows.append({"id": d["id"], "kind": kinds[d["id"]], "session": session_of[d["id"]],
                         "prompt": text_of[d["id"]], "duplicate_of": rep, "duplicate_of_session": session_of[rep],
                         "method": d["method"], "similarity": d["similarity"], "matched_id": d.get("matched_id"),
                         "matched_similarity": d.get("matched_similarity"),
                         "reason": f"{d['method']} duplicate (similarity {d['similarity']:.3f}) of the prompt of "
                                   f"{rep} in session {session_of[rep]}; {d.get('detail') or ''}".rstrip("; ")})
    with table_stream(lay.duplicates, DUPLICATE_SCHEMA) as t:
        for row in rows:
            t.write(row)
    by_method = Counter(r["method"] for r in rows)
    result = {"enabled": enabled, "key": "first user message (conversations), prompt (completions-route calls)",
              "units": len(ids), "units_without_prompt": no_prompt, "dropped": len(rows),
              "dropped_conversations": sum(r["kind"] == "conversation" for r in rows),
              "dropped_completions_calls": sum(r["kind"] == "completions_call" for r in rows),
              "by_method": dict(by_method), "kept_within_session_repeats": within_session,
              "seconds": round(time.perf_counter() - t0, 3)}
    write_json_atomic(lay.work_dedup, result)
    return result


def _dropped(lay: TrajectoryLayout) -> set[str]:
    return set(read_parquet(lay.duplicates, ["id"]).column("id").to_pylist()) if exists(lay.duplicates) else set()


def token_samples(out: str, tokenizer: str | None = None, embedded_model_path: str = "") -> dict:
    lay = TrajectoryLayout(out)
    t0 = time.perf_counter()
    tok, name = load_tokenizer(tokenizer, embedded_model_path)
    renderer = ChatRenderer(tok, name)
    loaded = time.perf_counter() - t0
    dropped = _dropped(lay)
    c: Counter = Counter()
    failures = []
    built = ((read_json(lay.work_collect) or {}).get("counts") or {}).get("conversations")
    progress = StepProgress("trajectories token samples", built, "conversations")  # live progress
    progress.update()
    with table_stream(lay.tokens, TOKEN_SCHEMA, batch_rows=256) as t:
        for conv in iter_jsonl(lay.work_conversations):
            progress.update(advance=1)
            if conv["conversation_id"] in dropped:
                continue
            try:
                row = token_sample(renderer, conv)
            except Exception as e:  # noqa: BLE001 - a conversation the template cannot render is skipped, named
                failures.append({"kind": "token_sample", "session": conv["session"], "record_id": None,
                                 "call_index": None, "reason": "template_failed",
                                 "detail": f"{conv['conversation_id']}: {type(e).__name__}: {e}"[:500]})
                continue
            t.write(row)
            c["samples"] += 1
            c["tokens"] += row["num_tokens"]
            c["assistant_tokens"] += row["assistant_tokens"]
            c["with_upstream_ids"] += row["upstream_ids_turns"] > 0
            c["drifted"] += row["drift"]
            c[f"rendering:{row['rendering']}"] += 1
            c["with_warnings"] += bool(row["warnings"])
    progress.finish(f"{c['samples']} samples")
    n, up = c["samples"], c["with_upstream_ids"]
    result = {"tokenizer": name, "native_tool_calls": renderer.native_calls, "native_tools": renderer.native_tools,
              "samples": n, "tokens": c["tokens"], "assistant_tokens": c["assistant_tokens"],
              "rendering": {k.split(":", 1)[1]: v for k, v in c.items() if k.startswith("rendering:")},
              "with_upstream_ids": up, "drifted": c["drifted"],
              "drift_rate": round(c["drifted"] / up, 4) if up else None,
              "drift_rate_all_samples": round(c["drifted"] / n, 4) if n else None,
              "with_warnings": c["with_warnings"], "failed": failures,
              "seconds": round(time.perf_counter() - t0, 3), "tokenizer_load_seconds": round(loaded, 3)}
    write_json_atomic(lay.work_tokens, result)
    return result


def publish(out: str, tokens: bool = True) -> dict:
    lay = TrajectoryLayout(out)
    collected = read_json(lay.work_collect)
    if collected is None:
        raise FileNotFoundError(f"{lay.work_collect} is missing: run the collect step first")
    deduped = read_json(lay.work_dedup) or {"enabled": False, "dropped": 0}
    tok = read_json(lay.work_tokens) if tokens else None
    dropped = _dropped(lay)
    sft = trans = 0
    with jsonl_writer(lay.sft) as w:
        for conv in iter_jsonl(lay.work_conversations):
            if conv["conversation_id"] not in dropped:
                w(sft_row(conv))
                sft += 1
    with table_stream(lay.transitions, TRANSITION_SCHEMA) as t:
        for tr in iter_jsonl(lay.work_transitions):
            if tr["transition_id"] in dropped or (tr.get("conversation_id") in dropped):
                continue
            t.write(tr)
            trans += 1
    skipped: Counter = Counter()
    with table_stream(lay.skipped, SKIPPED_SCHEMA) as t:
        for row in [*iter_jsonl(lay.work_skipped), *((tok or {}).get("failed") or [])]:
            t.write(row)
            skipped[row["reason"]] += 1
    if not tokens:
        lay.remove_tokens()
    counts = collected["counts"]
    summary = {
        "proxy_out": collected["proxy_out"], "out": str(lay.root), "exported_at": collected["exported_at"],
        "sessions": {
            "total": counts.get("sessions", 0), "exported": counts.get("sessions_exported", 0),
            "sub_agent_sessions": counts.get("sub_agent_sessions", 0),
            "finished_by": collected["finished_by"],
            "skipped_unfinished": counts.get("sessions_skipped_unfinished", 0),
            "unfinished_included": counts.get("sessions_unfinished_included", 0),
            "without_successful_call": counts.get("sessions_without_successful_call", 0),
            "with_several_conversations": counts.get("sessions_with_several_conversations", 0),
            "include_unfinished": collected["include_unfinished"], "idle_seconds": collected["idle_seconds"]},
        "rewards": collected["rewards"],
        "roles": collected.get("roles") or {"selected": None},
        "calls": {"records": counts.get("records", 0), "model_calls": counts.get("model_calls", 0),
                  "other_routes": counts.get("other_route_calls", 0),
                  "completions_route": counts.get("completions_route_calls", 0),
                  "failed_skipped": counts.get("failed_calls", 0),
                  "failed_by_status": collected["failed_calls_by_status"],
                  "unusable_skipped": counts.get("unusable_calls", 0),
                  "non_text_parts_dropped": counts.get("non_text_parts_dropped", 0),
                  "image_parts_kept": counts.get("image_parts_kept", 0),
                  "responses_history_not_recorded": counts.get("responses_history_not_recorded", 0)},
        "conversations": {"built": counts.get("conversations", 0), "exported": sft},
        "transitions": {"built": counts.get("transitions", 0), "exported": trans},
        "duplicates": deduped,
        "tokens": tok and {k: v for k, v in tok.items() if k != "failed"} | {"failed": len(tok.get("failed") or [])},
        "skipped": dict(skipped),
        "grouping": collected["grouping"],
        "files": {"sft": str(lay.sft), "transitions": str(lay.transitions),
                  "tokens": str(lay.tokens) if tokens else None, "duplicates": str(lay.duplicates),
                  "skipped": str(lay.skipped), "summary": str(lay.summary)},
        "seconds": {"collect": collected["seconds"], "dedup": deduped.get("seconds"),
                    "tokens": (tok or {}).get("seconds")},
    }
    write_json_atomic(lay.summary, summary)
    lay.remove_work()
    return summary
