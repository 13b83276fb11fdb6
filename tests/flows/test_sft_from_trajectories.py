"""Recorded traffic trains, end to end: an openai-SDK agent calls the scripted upstream through the real recording
proxy (multi-turn, tool calls, a streamed turn), a grader posts session rewards to the proxy, `evolforge
trajectories` exports the sessions, and `evolforge sft --trajectories --min-turns 2` fine-tunes a tiny Llama for a
few steps with real TRL. Its data/train.parquet holds exactly the assistant turns of the sessions with reward >= 1
and at least two assistant turns, each as the client received it, after exactly the messages the client sent."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from evolforge.cli import main
from evolforge.storage.proxy_sets import ProxyLayout, iter_records
from evolforge.storage.sft_sets import SFTFolder, chat_messages, read_rows, read_table_rows
from evolforge.tasks.proxy.server import running_proxy
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.lazy import lazy_module
from evolforge.testing.ppo_models import one_torch_thread  # noqa: F401 (autouse fixture)
from evolforge.testing.settings import make_settings
from evolforge.testing.tiny_policy import build_tiny_policy

openai = lazy_module("openai")

pytestmark = pytest.mark.usefixtures("prefect_harness")

MODEL = "agent-model"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def _client(url: str, session: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/s/{session}/v1", api_key="sk-test", max_retries=0)


def _turn(client: openai.OpenAI, msgs: list[dict], stream: bool = False, **kw) -> dict:
    """One call: the assistant message the client received, appended to the conversation and returned."""
    if stream:
        text = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
            model=MODEL, messages=msgs, stream=True, **kw) if ch.choices)
        msg = {"role": "assistant", "content": text}
    else:
        msg = client.chat.completions.create(model=MODEL, messages=msgs, **kw).choices[0].message.model_dump(
            exclude_none=True)
    msgs.append(msg)
    return msg


def _agent_sessions(url: str) -> dict[str, list[dict]]:
    """Four sessions: trip (3 assistant turns, tools), rivers (2), hello (1), broken (2, graded 0)."""
    sent = {}
    c = _client(url, "trip")
    trip = [{"role": "system", "content": "You plan trips."},
            {"role": "user", "content": "CALL_TOOLS for Paris and Oslo"}]
    calls = _turn(c, trip, tools=TOOLS)["tool_calls"]
    trip += [{"role": "tool", "tool_call_id": tc["id"], "content": w} for tc, w in zip(calls, ["sunny", "cold"])]
    _turn(c, trip, stream=True, tools=TOOLS)
    trip.append({"role": "user", "content": "Thanks! Anything to pack?"})
    _turn(c, trip, tools=TOOLS)
    sent["trip"] = trip
    for session, questions in (("rivers", ["Name three rivers in Africa", "And three in Asia?"]),
                               ("hello", ["Say hello to the team"]),
                               ("broken", ["Fix the failing build", "It still fails"])):
        c, msgs = _client(url, session), []
        for q in questions:
            msgs.append({"role": "user", "content": q})
            _turn(c, msgs)
        sent[session] = msgs
    return sent


@pytest.mark.long("trains a tiny policy with torch (the worker's first torch import may land here): 7-11 s of CPU")
def test_recorded_sessions_train_a_policy_on_their_assistant_turns(tmp_path, capsys):
    rec, traj, sft = tmp_path / "rec", tmp_path / "traj", tmp_path / "sft"
    with AgentUpstream() as up, running_proxy(make_settings(), up.base_url, str(rec)) as url:
        sent = _agent_sessions(url)
        with httpx.Client(base_url=url, timeout=10) as h:  # the grader
            for session, reward in (("trip", 1.0), ("rivers", 1.0), ("hello", 1.0), ("broken", 0.0)):
                assert h.post(f"/s/{session}/reward", json={"reward": reward}).status_code == 200
                assert h.post(f"/s/{session}/finish").status_code == 200
        deadline = time.time() + 10
        while len(list(iter_records(ProxyLayout(rec)))) < 8 and time.time() < deadline:
            time.sleep(0.05)
    # no dedup (the sessions' prompts differ) and no token samples: neither is what is tested here
    assert main(["trajectories", "--proxy-out", str(rec), "--out", str(traj), "--no-tokens", "--no-dedup"]) == 0, \
        capsys.readouterr().err
    tiny = build_tiny_policy(tmp_path / "tiny")
    code = main(["sft", "--trajectories", str(traj), "--min-turns", "2", "--out", str(sft), "--base-model", str(tiny),
                 "--max-steps", "2", "--config", str(_config(tmp_path))])
    assert code == 0, capsys.readouterr().err

    folder = SFTFolder(sft)
    rows = {r["id"]: r for r in read_rows(folder.train)}
    expected = {f"{s}#0/{i}": (sent[s][:i], m) for s in ("trip", "rivers") for i, m in enumerate(sent[s])
                if m["role"] == "assistant"}
    assert sorted(rows) == sorted(expected) == ["rivers#0/1", "rivers#0/3", "trip#0/2", "trip#0/5", "trip#0/7"]
    for rid, (before, turn) in expected.items():
        row = rows[rid]
        assert [_key(m) for m in chat_messages(row["prompt"])] == [_key(m) for m in before], rid
        assert [_key(m) for m in chat_messages(row["completion"])] == [_key(turn)], rid
        assert row["source"] == "trajectory"
        assert json.loads(row["tools"] or "null") == (TOOLS if "trip" in rid else None), rid
    assert chat_messages(rows["trip#0/2"]["completion"])[0]["tool_calls"][0]["function"]["name"] == "get_weather"
    skipped = {s["id"]: s["reason"] for s in read_table_rows(folder.skipped)}
    assert skipped == {"hello#0": "too few assistant turns: 1 < 2 (sft.trajectory_min_turns)",
                       "broken#0": "not successful: reward 0.0 < 1.0"}
    meta = json.loads((folder.model / "sft_meta.json").read_text())
    assert meta["rows"] == 5 and meta["steps"] == 2 and meta["rows_cut_by_max_length"] == 0
    summary = json.loads((sft / "summary.json").read_text())
    assert summary["data"]["by_source"]["trajectory"] == 5 and summary["data"]["trajectory_conversations"] == 2
    card = (folder.data_dir / "README.md").read_text()
    assert "every assistant turn of the successful conversations, 2 of them" in card

    # bad input: one line, exit 2, nothing created
    capsys.readouterr()
    assert main(["sft", "--trajectories", str(traj), "--min-turns", "0", "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "--min-turns" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "no").exists()


def _config(tmp_path):
    """Two rows a step: the five rows are seen in two steps and a half."""
    path = tmp_path / "sft.toml"
    path.write_text("[sft]\nbatch_size = 2\nsave_steps = 2\n")
    return path


def _key(m: dict):
    calls = [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in m.get("tool_calls") or []]
    return m["role"], m.get("content") or "", calls, m.get("tool_call_id")
