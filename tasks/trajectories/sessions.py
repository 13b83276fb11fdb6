"""Sessions: finished or not, their rewards, and a session's calls split into conversations.

A session is finished when
- it has a `finish` event posted after its last call started (`event`), or
- no call has come for `proxy.session_idle_seconds` (`idle`), or
- an ancestor session (parent, grandparent, ...) has a finish event posted after this session's last call
  started (`parent`: an agent that finishes its run finishes its sub-agents).
A finish event followed by more calls does not count (the session went on).

Rewards: a session's last `reward` event, or its row in the rewards file; the file wins when both exist.

Conversations: a session's successful chat calls, in the order they started, grow conversations. A call
whose prompt starts with an existing conversation (that conversation's last prompt plus the response the
model gave, compared message by message) extends it; failing that, a call whose prompt starts with a
conversation's last prompt followed by an assistant message (the agent sent back an edited response)
extends the longest such one. Any other call starts a conversation of its own (a retry, a branch, another
agent sharing the session). Sub-agent sessions are separate sessions, so never mixed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable

from evolforge.storage.trajectory_sets import SpooledSession

FINISH_SLACK_S = 1e-3


@dataclass
class SessionEvents:
    finish_ts: float | None = None
    rewards: list[tuple[float, float, object, object]] = field(default_factory=list)  # (ts, reward, details, source)


def gather_events(events: Iterable[dict]) -> dict[str, SessionEvents]:
    out: dict[str, SessionEvents] = {}
    for ev in events:
        s = ev.get("session")
        if not s:
            continue
        se = out.setdefault(s, SessionEvents())
        ts = float(ev.get("ts") or 0.0)
        if ev.get("event") == "finish":
            se.finish_ts = ts if se.finish_ts is None else max(se.finish_ts, ts)
        elif ev.get("event") == "reward" and isinstance(ev.get("reward"), (int, float)):
            se.rewards.append((ts, float(ev["reward"]), ev.get("details"), ev.get("source")))
    return out


def finished_by(sessions: list[SpooledSession], events: dict[str, SessionEvents], idle_seconds: float,
                now: float) -> dict[str, str | None]:
    """session -> "event" | "idle" | "parent" | None (unfinished)."""
    parent = {s.session: s.parent_session for s in sessions}
    out: dict[str, str | None] = {}
    for s in sessions:
        fin = events.get(s.session, SessionEvents()).finish_ts
        if fin is not None and fin + FINISH_SLACK_S >= s.last_ts:
            out[s.session] = "event"
        elif now - s.end_ts >= idle_seconds:
            out[s.session] = "idle"
        else:
            out[s.session] = None
            seen = {s.session}
            p = s.parent_session
            while p and p not in seen:
                seen.add(p)
                pf = events.get(p, SessionEvents()).finish_ts
                if pf is not None and pf + FINISH_SLACK_S >= s.last_ts:
                    out[s.session] = "parent"
                    break
                p = parent.get(p)
    return out


def root_of(session: str, parents: dict[str, str | None]) -> str:
    seen = {session}
    while parents.get(session) and parents[session] not in seen:
        session = parents[session]
        seen.add(session)
    return session


@dataclass
class Reward:
    value: float | None
    source: str | None           # "event" | "file" | None
    details: object = None
    overrode_event: bool = False
    several_events: bool = False


def session_reward(session: str, events: dict[str, SessionEvents], file_rewards: dict[str, float]) -> Reward:
    evs = sorted(events.get(session, SessionEvents()).rewards, key=lambda r: r[0])
    last = evs[-1] if evs else None
    if session in file_rewards:
        return Reward(file_rewards[session], "file", None, overrode_event=last is not None,
                      several_events=len(evs) > 1)
    if last is not None:
        return Reward(last[1], "event", last[2], several_events=len(evs) > 1)
    return Reward(None, None)


# ---------------------------------------------------------------- conversations
def message_key(m: dict) -> str:
    """What makes two messages the same turn: role, text, tool calls (arguments compared as JSON), tool call id."""
    calls = []
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function") or {}
        args = fn.get("arguments")
        try:
            args = json.dumps(json.loads(args), sort_keys=True) if isinstance(args, str) else json.dumps(args, sort_keys=True)
        except ValueError:
            pass
        calls.append([tc.get("id"), fn.get("name"), args])
    return json.dumps([m.get("role"), m.get("content") or "", calls, m.get("tool_call_id"), m.get("name")],
                      ensure_ascii=False)


@dataclass
class Chain:
    """One conversation being grown by successive calls."""

    index: int
    prompt_keys: list[str]
    full_keys: list[str]
    calls: list = field(default_factory=list)
    last_seq: int = 0


def assign_conversations(prompts: list[list[dict]], responses: list[dict]) -> list[tuple[int, int]]:
    """For each call (prompt messages, response message, in start order): (conversation index, turn index)."""
    chains: list[Chain] = []
    out = []
    for seq, (prompt, resp) in enumerate(zip(prompts, responses)):
        keys = [message_key(m) for m in prompt]
        best = None
        for ch in chains:  # the model's own response came back unchanged
            n = len(ch.full_keys)
            if n <= len(keys) and keys[:n] == ch.full_keys:
                if best is None or (n, ch.last_seq) > (len(best.full_keys), best.last_seq):
                    best = ch
        if best is None:
            for ch in chains:  # the agent edited the response before sending it back
                n = len(ch.prompt_keys)
                if n < len(keys) and keys[:n] == ch.prompt_keys and prompt[n].get("role") == "assistant":
                    if best is None or (n, ch.last_seq) > (len(best.prompt_keys), best.last_seq):
                        best = ch
        if best is None:
            best = Chain(index=len(chains), prompt_keys=[], full_keys=[])
            chains.append(best)
        best.prompt_keys = keys
        best.full_keys = keys + [message_key(resp)]
        best.calls.append(seq)
        best.last_seq = seq
        out.append((best.index, len(best.calls) - 1))
    return out
