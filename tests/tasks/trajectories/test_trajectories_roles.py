"""`evolforge trajectories --roles`: in a multi-agent session recorded through the real proxy (two agents sharing a
session, a sub-agent with its own session, a session whose calls carry no role), only the named agents' calls are
exported: their conversations, transitions and token samples, nothing of the other agents; a --roles that names a
role no call carries is one line, exit 2, before anything starts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import polars as pl
import pytest

from evolforge.storage.proxy_sets import ProxyLayout, iter_records
from evolforge.storage.trajectory_sets import TrajectoryLayout, recorded_roles
from evolforge.tasks.proxy.server import running_proxy
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.lazy import lazy_module
from evolforge.testing.settings import make_settings

openai = lazy_module("openai")

MODEL = "agent-model"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
N_RECORDS = 7


def _client(url: str, session: str, role: str | None = None, parent: str | None = None) -> openai.OpenAI:
    headers = {**({"X-Evolforge-Role": role} if role else {}),
               **({"X-Evolforge-Parent-Session": parent} if parent else {})}
    return openai.OpenAI(base_url=f"{url}/s/{session}/v1", api_key="sk-test", max_retries=0,
                         default_headers=headers or None)


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """team-1: a planner and a coder share the session, their calls interleaved (the coder's a tool-using two-call
    conversation); team-1-review: a reviewer sub-agent (X-OpenForge-Role) in its own session; solo: no role."""
    root = tmp_path_factory.mktemp("team")
    rec = root / "rec"
    sent: dict[str, list[dict]] = {}
    with AgentUpstream() as up, running_proxy(make_settings(), up.base_url, str(rec)) as url:
        planner, coder = _client(url, "team-1", "planner"), _client(url, "team-1", "coder")
        plan = [{"role": "user", "content": "Plan the weather report for two cities"}]
        plan.append({"role": "assistant", "content": planner.chat.completions.create(
            model=MODEL, messages=plan).choices[0].message.content})
        code = [{"role": "system", "content": "You write weather reports."},
                {"role": "user", "content": "CALL_TOOLS for Paris and Oslo"}]
        first = coder.chat.completions.create(model=MODEL, tools=TOOLS, messages=code)
        code.append(first.choices[0].message.model_dump(exclude_none=True))
        plan += [{"role": "user", "content": "And what comes after the report?"}]
        plan.append({"role": "assistant", "content": planner.chat.completions.create(
            model=MODEL, messages=plan).choices[0].message.content})  # the planner again, between the coder's calls
        code += [{"role": "tool", "tool_call_id": tc.id, "content": w}
                 for tc, w in zip(first.choices[0].message.tool_calls, ["sunny", "cold"])]
        code.append({"role": "assistant", "content": coder.chat.completions.create(
            model=MODEL, tools=TOOLS, messages=code).choices[0].message.content})
        review = openai.OpenAI(base_url=f"{url}/s/team-1-review/v1", api_key="sk-test", max_retries=0,
                               default_headers={"X-OpenForge-Role": "reviewer", "X-Evolforge-Parent-Session": "team-1"})
        rev = [{"role": "user", "content": "Review the weather report"}]
        rev.append({"role": "assistant", "content": review.chat.completions.create(
            model=MODEL, messages=rev).choices[0].message.content})
        _client(url, "solo").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Alone here"}])
        assert [m.id for m in coder.models.list()] == [MODEL]  # a coder call on another route: not a model call
        with httpx.Client(base_url=url, timeout=10) as h:
            for s in ("team-1", "solo"):
                assert h.post(f"/s/{s}/reward", json={"reward": 1.0}).status_code == 200
                assert h.post(f"/s/{s}/finish").status_code == 200  # team-1's finishes its reviewer too
        deadline = time.time() + 10
        while len(list(iter_records(ProxyLayout(rec)))) < N_RECORDS and time.time() < deadline:
            time.sleep(0.05)
    sent.update(planner=plan, coder=code, reviewer=rev)
    assert len(list(iter_records(ProxyLayout(rec)))) == N_RECORDS
    return {"rec": rec, "root": root, "sent": sent}


def _export(team, prefect_harness, name: str, roles):
    from evolforge.flows.trajectories import TrajectoriesParams, trajectories_flow

    out = team["root"] / name
    summary = trajectories_flow(TrajectoriesParams(proxy_out=str(team["rec"]), out=str(out), roles=roles))
    lay = TrajectoryLayout(out)
    sft = [json.loads(line) for line in Path(lay.sft).read_text().splitlines()]
    return {"summary": summary, "sft": sft, "transitions": pl.read_parquet(lay.transitions),
            "tokens": pl.read_parquet(lay.tokens), "skipped": pl.read_parquet(lay.skipped)}


def test_recorded_roles_are_read_from_the_records(team):
    assert recorded_roles(team["rec"]) == {"planner", "coder", "reviewer"}
    assert recorded_roles(team["rec"], stop_when={"planner"}) >= {"planner"}


def test_only_the_named_agents_calls_are_exported(team, prefect_harness):
    got = _export(team, prefect_harness, "coder-reviewer", ["coder", "reviewer"])
    by_role = {r["agent_role"]: r for r in got["sft"]}
    assert sorted(r["agent_role"] for r in got["sft"]) == ["coder", "reviewer"]  # one conversation each
    assert _same_turns(by_role["coder"]["messages"], team["sent"]["coder"])  # not a planner turn in between
    assert by_role["coder"]["session"] == "team-1" and by_role["coder"]["calls"] == 2
    assert by_role["reviewer"]["session"] == "team-1-review" and by_role["reviewer"]["parent_session"] == "team-1"
    assert _same_turns(by_role["reviewer"]["messages"], team["sent"]["reviewer"])
    everything = json.dumps(got["sft"]) + json.dumps(got["transitions"].to_dicts(), default=str)
    assert "Plan the weather report" not in everything and "Alone here" not in everything  # nothing of the others
    assert set(got["transitions"]["agent_role"].to_list()) == {"coder", "reviewer"}
    assert got["transitions"].height == 3 and got["tokens"].height == 2
    roles = got["summary"]["roles"]
    assert roles["selected"] == ["coder", "reviewer"]
    assert roles["calls_by_role"] == {"(none)": 1, "coder": 3, "planner": 2, "reviewer": 1}  # models call included
    assert roles["calls_left_out"] == 3 and roles["sessions_left_out"] == 1  # 2 planner calls, solo's call
    skipped = got["skipped"].filter(pl.col("reason") == "role_not_selected").to_dicts()
    assert [s["session"] for s in skipped] == ["solo"] and "roles (none)" in skipped[0]["detail"]


def test_one_agent_of_a_shared_session(team, prefect_harness):
    got = _export(team, prefect_harness, "planner", ["planner"])
    assert [r["agent_role"] for r in got["sft"]] == ["planner"]
    assert _same_turns(got["sft"][0]["messages"], team["sent"]["planner"])  # its two calls, one conversation
    assert got["summary"]["sessions"]["exported"] == 1 and got["summary"]["roles"]["sessions_left_out"] == 2
    # without --roles every agent is exported, as before
    every = _export(team, prefect_harness, "all", None)
    assert sorted(r["agent_role"] or "-" for r in every["sft"]) == ["-", "coder", "planner", "reviewer"]
    assert every["summary"]["roles"]["selected"] is None and every["summary"]["roles"]["calls_left_out"] == 0


def _same_turns(exported: list[dict], sent: list[dict]) -> bool:
    def key(m):
        calls = [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in m.get("tool_calls") or []]
        return m["role"], m.get("content") or "", calls, m.get("tool_call_id")
    return [key(m) for m in exported] == [key(m) for m in sent]


def test_roles_no_call_carries_are_refused_up_front(team, tmp_path, capsys):
    from evolforge.cli import main

    out = tmp_path / "out"
    for roles, says in (("nobody", "--roles nobody: no call in"), ("coder,nobdy", "--roles nobdy: no call in")):
        assert main(["trajectories", "--proxy-out", str(team["rec"]), "--out", str(out), "--roles", roles]) == 2
        err = capsys.readouterr().err
        assert says in err and "roles recorded: coder, planner, reviewer" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
