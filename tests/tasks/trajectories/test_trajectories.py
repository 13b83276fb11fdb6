"""The trajectories export, from real traffic: the openai SDK -> the recording proxy -> an OpenAI-compatible
upstream, then the flow over the recorded folder. Asserted: SFT rows load with `datasets` and train with TRL's
SFTTrainer (tool calls and tool schemas rendered), transitions carry the session rewards, the loss mask covers
exactly the assistant tokens, upstream token ids that do not match the tokenizer are flagged as drift, and the
summary counts sessions, rewards, failed calls and duplicates."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import polars as pl
import pytest

from evolforge.cli.status import stage_status
from evolforge.storage.folder import read_marker
from evolforge.storage.proxy_sets import ProxyLayout, RecordLog, iter_records
from evolforge.storage.trajectory_sets import RecordSpool, SpooledSession, TrajectoryLayout, read_rewards
from evolforge.tasks.proxy.server import running_proxy
from evolforge.tasks.trajectories.export import collect
from evolforge.tasks.trajectories.sessions import SessionEvents, assign_conversations, finished_by
from evolforge.tasks.trajectories.tokens import ChatRenderer, load_tokenizer, token_sample
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.lazy import lazy_module
from evolforge.testing.settings import make_settings

openai = lazy_module("openai")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
MODEL = "agent-model"
FINAL = "It is sunny in Paris and cold in Oslo."
HAIKU = "Write a haiku about autumn leaves"
N_RECORDS = 16


def _client(url: str, session: str, **headers) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/s/{session}/v1", api_key="sk-test", max_retries=0,
                         default_headers=headers or None)


def _stream_text(stream) -> str:
    return "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """One recorded proxy folder: a multi-turn tool session with a sub-agent, branches, a doctored-token
    session, a duplicated prompt, failed calls, a completions call, an unfinished session; and a rewards file."""
    root = tmp_path_factory.mktemp("traffic")
    rec = root / "rec"
    sent: dict = {}
    with AgentUpstream() as up, running_proxy(make_settings(), up.base_url, str(rec)) as url:
        # trip-1: tool calls (not streamed), tool results, the answer (streamed), a follow-up (not streamed)
        c = _client(url, "trip-1")
        msgs = [{"role": "system", "content": "You plan trips."},
                {"role": "user", "content": "CALL_TOOLS for Paris and Oslo"}]
        first = c.chat.completions.create(model=MODEL, tools=TOOLS, messages=msgs)
        calls = first.choices[0].message.tool_calls
        msgs.append(first.choices[0].message.model_dump(exclude_none=True))
        msgs += [{"role": "tool", "tool_call_id": tc.id, "content": w} for tc, w in zip(calls, ["sunny", "cold"])]
        answer = _stream_text(c.chat.completions.create(model=MODEL, tools=TOOLS, messages=msgs, stream=True,
                                                        stream_options={"include_usage": True}))
        assert answer == FINAL
        msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks! Anything to pack?"}]
        last = c.chat.completions.create(model=MODEL, tools=TOOLS, messages=msgs)
        sent["trip-1"] = msgs + [{"role": "assistant", "content": last.choices[0].message.content}]
        # its sub-agent: its own session, a parent, a role; finished by the parent's finish event
        sub = _client(url, "trip-1-sub", **{"X-Evolforge-Parent-Session": "trip-1", "X-Evolforge-Role": "researcher"})
        _stream_text(sub.chat.completions.create(model=MODEL, stream=True,
                                                 messages=[{"role": "user", "content": "Find facts about Oslo"}]))
        # branchy: the same prompt twice (a retry) and another prompt (a branch), plus a models call
        b = _client(url, "branchy")
        for text in ("Plan a picnic for four people", "Plan a picnic for four people", "Name three rivers in Africa"):
            b.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}])
        assert [m.id for m in b.models.list()] == [MODEL]
        # drift-1: the upstream returns token ids (one per character), which no real tokenizer produces
        d = _client(url, "drift-1")
        m = [{"role": "user", "content": HAIKU}]
        r = d.chat.completions.create(model=MODEL, messages=m, extra_body={"return_token_ids": True})
        m += [{"role": "assistant", "content": r.choices[0].message.content},
              {"role": "user", "content": "Another one, please"}]
        _stream_text(d.chat.completions.create(model=MODEL, messages=m, stream=True,
                                               extra_body={"return_token_ids": True}))
        # the same prompt in two sessions; dup-b and failed-only also have a failed call
        for s in ("dup-a", "dup-b", "failed-only"):
            if s != "dup-a":
                up.fault = "500"
                with pytest.raises(openai.InternalServerError):
                    _client(url, s).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
                up.fault = None
            if s != "failed-only":
                _client(url, s).chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}])
        _client(url, "comp-1").completions.create(model=MODEL, prompt="2 + 2 =")
        _client(url, "open-1").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Still thinking about this one"}])
        with httpx.Client(base_url=url, timeout=10) as h:
            assert h.post("/s/trip-1/reward", json={"reward": 1.0, "details": {"tests": "4/4"}}).status_code == 200
            assert h.post("/s/drift-1/reward", json={"reward": 0.1}).status_code == 200
            for s in ("trip-1", "branchy", "drift-1", "dup-a", "dup-b", "comp-1", "failed-only"):
                assert h.post(f"/s/{s}/finish").status_code == 200
        deadline = time.time() + 10
        while len(list(iter_records(ProxyLayout(rec)))) < N_RECORDS and time.time() < deadline:
            time.sleep(0.05)
    assert len(list(iter_records(ProxyLayout(rec)))) == N_RECORDS
    rewards = root / "rewards.csv"
    rewards.write_text("session,reward\nbranchy,0.25\ndrift-1,0.9\nghost,0.5\n")  # the file wins for drift-1
    return {"rec": rec, "rewards": rewards, "sent": sent, "root": root}


@pytest.fixture(scope="module")
def exported(traffic, prefect_harness):
    from evolforge.flows.trajectories import TrajectoriesParams, trajectories_flow

    out = traffic["root"] / "out"
    summary = trajectories_flow(TrajectoriesParams(proxy_out=str(traffic["rec"]), out=str(out),
                                                   rewards=str(traffic["rewards"])))
    lay = TrajectoryLayout(out)
    sft = [json.loads(line) for line in Path(lay.sft).read_text().splitlines()]
    return {"summary": summary, "lay": lay, "sft": {r["conversation_id"]: r for r in sft}, "sft_rows": sft,
            "transitions": pl.read_parquet(lay.transitions), "tokens": pl.read_parquet(lay.tokens)}


@pytest.fixture(scope="module")
def tokenizer():
    tok, _ = load_tokenizer(None)
    return tok


@pytest.mark.long("the first test carries the module's export fixture (agent sessions through the proxy, dedup, the "
                  "embedded model's tokenizer for the token samples): ~19 s CPU measured on a loaded machine")
def test_summary_counts_sessions_rewards_failures_and_duplicates(exported):
    s = exported["summary"]
    assert json.loads(Path(exported["lay"].summary).read_text()) == json.loads(json.dumps(s))
    assert s["sessions"]["total"] == 9 and s["sessions"]["exported"] == 7 and s["sessions"]["sub_agent_sessions"] == 1
    assert s["sessions"]["finished_by"] == {"event": 7, "idle": 0, "parent": 1, "unfinished": 1}
    assert s["sessions"]["skipped_unfinished"] == 1 and s["sessions"]["without_successful_call"] == 1
    r = s["rewards"]
    assert (r["with_reward"], r["without_reward"], r["from_event"], r["from_file"]) == (3, 4, 1, 2)
    assert r["file_overrode_event"] == 1 and r["file_sessions_not_in_proxy_out"] == 1 and "file wins" in r["precedence"]
    assert s["calls"]["records"] == N_RECORDS and s["calls"]["failed_skipped"] == 2
    assert s["calls"]["failed_by_status"] == {"500": 2} and s["calls"]["other_routes"] == 1
    assert s["conversations"] == {"built": 8, "exported": 7} and s["transitions"] == {"built": 12, "exported": 11}
    d = s["duplicates"]
    assert d["dropped"] == 1 and d["by_method"] == {"exact": 1} and d["kept_within_session_repeats"] == 1
    t = s["tokens"]
    assert t["samples"] == 7 and t["with_upstream_ids"] == 1 and t["drifted"] == 1 and t["drift_rate"] == 1.0
    assert t["drift_rate_all_samples"] == round(1 / 7, 4)
    assert s["skipped"] == {"failed_call": 2, "unfinished": 1, "no_successful_call": 1}
    assert not Path(exported["lay"].work_dir).exists()  # intermediate files removed
    dups = pl.read_parquet(exported["lay"].duplicates).to_dicts()
    assert [(x["id"], x["duplicate_of"], x["duplicate_of_session"], x["method"]) for x in dups] == [
        ("dup-b#0", "dup-a#0", "dup-a", "exact")]
    assert "What is the capital of France?" == dups[0]["prompt"] and "exact duplicate" in dups[0]["reason"]
    skipped = pl.read_parquet(exported["lay"].skipped)
    assert set(skipped.filter(pl.col("reason") == "failed_call")["session"]) == {"dup-b", "failed-only"}
    assert all("HTTP 500" in x for x in skipped.filter(pl.col("reason") == "failed_call")["detail"])
    assert skipped.filter(pl.col("reason") == "unfinished")["session"].to_list() == ["open-1"]


def test_the_folder_is_marked_as_a_trajectories_stage_and_status_reads_it(exported, traffic):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    lay, s = exported["lay"], exported["summary"]
    marker = read_marker(lay.root)
    assert marker["kind"] == "trajectories" and marker["started_at"] and marker["finished_at"]
    assert marker["counts"] == {"sessions": 7, "conversations": 7, "transitions": 11}
    st = stage_status(lay.root)
    assert (st["kind"], st["finished"], st["units"], st["cost"]["calls"]) == ("trajectories", True, [], 0)
    assert not Path(lay.ledger_dir).exists() and not (Path(lay.root) / "logs").exists()  # no model is called
    assert s["run_id"] and s["out_dir"] == str(lay.root) and "cost" not in s
    assert Path(s["card"]).name == "README.md" and set(s["plots"]) == {"trajectory_calls", "session_rewards"}
    with get_client(sync_client=True) as client:
        arts = {a.key: a for a in client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[s["run_id"]])))}
    assert {"trajectories-summary", "trajectories-report", "trajectories-plots"} <= set(arts)
    assert any(k.startswith("trajectories-progress-") for k in arts)
    table = {row["what"]: row["count"] for row in json.loads(arts["trajectories-summary"].data)}
    assert table["sessions exported"] == 7 and table["transitions"] == 11 and table["token samples with drift"] == 1
    assert arts["trajectories-summary"].description == f"Trajectories from {traffic['rec']}"
    assert f"Files: `{traffic['root'] / 'out'}`" in arts["trajectories-report"].data
    assert "7 exported" in arts["trajectories-report"].data


def test_sft_rows_are_trl_conversations_with_tool_calls(exported, traffic):
    import datasets
    from trl.data_utils import is_conversational

    rows, by_id = exported["sft_rows"], exported["sft"]
    ds = datasets.Dataset.from_list(rows)
    assert ds.num_rows == 7 and all(is_conversational(ex) for ex in ds)
    assert set(by_id) == {"trip-1#0", "trip-1-sub#0", "branchy#0", "branchy#1", "branchy#2", "drift-1#0", "dup-a#0"}
    trip = by_id["trip-1#0"]
    tool_calls = [{"id": f"call_{i}", "type": "function",
                   "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
                  for i, city in enumerate(("Paris", "Oslo"))]
    assert trip["messages"] == [
        {"role": "system", "content": "You plan trips."},
        {"role": "user", "content": "CALL_TOOLS for Paris and Oslo"},
        {"role": "assistant", "content": "", "tool_calls": tool_calls},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
        {"role": "assistant", "content": FINAL},
        {"role": "user", "content": "Thanks! Anything to pack?"},
        {"role": "assistant", "content": "Echo: Thanks! Anything to pack?"}]
    assert [m["content"] for m in trip["messages"]] == [m.get("content") or "" for m in traffic["sent"]["trip-1"]]
    assert json.loads(trip["tools"]) == TOOLS and trip["calls"] == 3 and trip["reward"] == 1.0
    sub = by_id["trip-1-sub#0"]  # the sub-agent is its own conversation, linked, never mixed
    assert (sub["parent_session"], sub["root_session"], sub["agent_role"]) == ("trip-1", "trip-1", "researcher")
    assert sub["messages"][0]["content"] == "Find facts about Oslo" and sub["finished_by"] == "parent"
    assert not any("Oslo" in m["content"] and m["role"] == "user" and "Find" in m["content"] for m in trip["messages"])
    assert sub["reward"] is None and sub["tools"] is None
    assert [by_id[f"branchy#{i}"]["messages"][0]["content"] for i in range(3)] == [
        "Plan a picnic for four people", "Plan a picnic for four people", "Name three rivers in Africa"]
    assert {by_id[f"branchy#{i}"]["reward"] for i in range(3)} == {0.25}
    assert by_id["drift-1#0"]["reward"] == 0.9 and by_id["drift-1#0"]["reward_source"] == "file"
    assert len(by_id["drift-1#0"]["messages"]) == 4


def test_sft_rows_train_with_trl_sfttrainer(exported, tokenizer, tmp_path):
    """TRL itself reads the rows: tool schemas from the `tools` column and the tool calls are rendered."""
    import datasets
    import trl.chat_template_utils as ctu
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (Path(ctu.__file__).parent / "chat_templates" / "qwen2_5_training.jinja").read_text()
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    trainer = SFTTrainer(model=model, processing_class=tok, train_dataset=datasets.Dataset.from_list(exported["sft_rows"]),
                         args=SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=2,
                                        report_to=[], assistant_only_loss=True, use_cpu=True, save_strategy="no"))
    ex = next(e for e in trainer.train_dataset if e["conversation_id"] == "trip-1#0")
    text = tok.decode(ex["input_ids"])
    assert "<tools>" in text and '"name": "get_weather"' in text and "<tool_call>" in text and "sunny" in text
    trained = tok.decode([i for i, lab in zip(ex["input_ids"], ex["labels"]) if lab != -100])
    assert FINAL in trained and "Echo: Thanks! Anything to pack?" in trained and "CALL_TOOLS" not in trained
    assert trainer.train().training_loss > 0


def test_transitions_carry_rewards_prompts_and_completions(exported, tmp_path):
    tr = exported["transitions"]
    assert tr.height == 11 and "dup-b" not in tr["session"].to_list()
    rewards = dict(tr.group_by("session").agg(pl.col("reward").first()).iter_rows())
    assert rewards == {"trip-1": 1.0, "trip-1-sub": None, "branchy": 0.25, "drift-1": 0.9, "dup-a": None, "comp-1": None}
    trip = tr.filter(pl.col("session") == "trip-1").sort("call_index").to_dicts()
    assert [t["call_index"] for t in trip] == [0, 1, 2] and [t["turn_index"] for t in trip] == [0, 1, 2]
    assert [t["finish_reason"] for t in trip] == ["tool_calls", "stop", "stop"]
    assert [c["function"]["name"] for c in trip[0]["completion"][0]["tool_calls"]] == ["get_weather"] * 2
    assert [m["role"] for m in trip[1]["prompt"]] == ["system", "user", "assistant", "tool", "tool"]
    assert trip[1]["completion"][0]["content"] == FINAL and trip[2]["last_in_conversation"]
    assert json.loads(trip[0]["tools"]) == TOOLS and trip[0]["model"] == MODEL and trip[0]["reward_source"] == "event"
    assert json.loads(trip[0]["reward_details"]) == {"tests": "4/4"}
    comp = tr.filter(pl.col("session") == "comp-1").to_dicts()[0]
    assert comp["route"] == "completions" and comp["prompt_text"] == "2 + 2 =" and comp["prompt"] is None
    assert comp["completion_text"].startswith("Completion of")
    drift = tr.filter(pl.col("session") == "drift-1").sort("call_index").to_dicts()
    for t in drift:  # the upstream's own ids, kept as returned (streamed ones reassembled)
        assert t["completion_token_ids"] == [ord(ch) for ch in t["completion"][0]["content"]]
    import datasets

    ds = datasets.Dataset.from_parquet(str(exported["lay"].transitions), cache_dir=str(tmp_path))
    assert ds.num_rows == 11 and ds[0]["prompt"][0]["role"] in ("system", "user")


def test_loss_mask_covers_exactly_the_assistant_tokens(exported, tokenizer):
    sft = exported["sft"]
    for row in exported["tokens"].to_dicts():
        ids, mask = row["input_ids"], row["assistant_mask"]
        assert len(ids) == len(mask) == row["num_tokens"] and sum(mask) == row["assistant_tokens"] > 0
        msgs = sft[row["conversation_id"]]["messages"]
        expected = [1 if t["role"] == "assistant" and p >= t["loss_start"] else 0
                    for t in row["turns"] for p in range(t["start"], t["end"])]
        assert mask == expected and row["turns"][-1]["end"] == len(ids)
        assistant = [t for t in row["turns"] if t["role"] == "assistant"]
        assert [t["message_index"] for t in assistant] == [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        if row["drift"]:
            continue
        for t in assistant:
            m = msgs[t["message_index"]]
            text = tokenizer.decode(ids[t["loss_start"]:t["end"]])
            assert text in (m["content"] + "<|im_end|>\n", m["content"] + "<|im_end|>") or m.get("tool_calls")
            for tc in m.get("tool_calls") or []:  # SmolLM2's template knows no tools: tool calls as text
                assert json.dumps({"name": "get_weather", "arguments": json.loads(tc["function"]["arguments"])}) in text
            before = tokenizer.decode(ids[t["start"]:t["loss_start"]])
            assert m["content"] not in before or not m["content"]
        masked = tokenizer.decode([i for i, x in zip(ids, mask) if x])
        assert masked == "".join(tokenizer.decode(ids[t["loss_start"]:t["end"]]) for t in assistant)
        unmasked = tokenizer.decode([i for i, x in zip(ids, mask) if not x])
        assert all(m["content"] in unmasked for m in msgs if m["role"] != "assistant")
    trip = exported["tokens"].filter(pl.col("conversation_id") == "trip-1#0").to_dicts()[0]
    assert trip["rendering"] == "template+tool_fallback" and "get_weather" in tokenizer.decode(trip["input_ids"])


def test_doctored_upstream_token_ids_are_flagged_as_drift(exported, tokenizer):
    tokens = exported["tokens"]
    assert tokens.filter(pl.col("drift"))["conversation_id"].to_list() == ["drift-1#0"]
    row = tokens.filter(pl.col("drift")).to_dicts()[0]
    reasons = " | ".join(row["drift_reasons"])
    assert "turn 1: the upstream returned" in reasons and "turn 3: the upstream returned" in reasons
    assert "prompt of turn 1" in reasons  # prompt_token_ids [1, 2, 3] are not this tokenizer's either
    ids = row["input_ids"]
    for t in (t for t in row["turns"] if t["role"] == "assistant"):
        content = exported["sft"]["drift-1#0"]["messages"][t["message_index"]]["content"]
        assert t["source"] == "upstream"  # what the model sampled is what is trained on
        assert ids[t["loss_start"]:t["end"]][:len(content)] == [ord(c) for c in content]
    assert row["upstream_ids_turns"] == 2


@pytest.fixture(scope="module")
def renderer(tokenizer):
    return ChatRenderer(tokenizer, "smollm2")


def _conv(messages, tools=None, turn_calls=()):
    return {"conversation_id": "c#0", "session": "c", "messages": messages, "tools": json.dumps(tools) if tools else None,
            "turn_calls": list(turn_calls)}


def test_upstream_ids_that_match_the_tokenizer_are_no_drift(renderer, tokenizer):
    msgs = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hello there, friend!"}]
    body = renderer.ids("Hello there, friend!")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = renderer.ids(renderer.render(msgs[:1], gen=True))
    ok = token_sample(renderer, _conv(msgs, turn_calls=[{"message_index": 1, "response_matches": True,
                                                         "token_ids": body + [eos], "prompt_token_ids": prompt}]))
    assert not ok["drift"] and ok["turns"][1]["source"] == "upstream" and ok["upstream_ids_turns"] == 1
    plain = token_sample(renderer, _conv(msgs))
    assert ok["input_ids"] == plain["input_ids"] and ok["assistant_mask"] == plain["assistant_mask"]
    bad = token_sample(renderer, _conv(msgs, turn_calls=[{"message_index": 1, "response_matches": True,
                                                          "token_ids": body[:-1] + [body[-1] + 1]}]))
    assert bad["drift"] and "first difference at token" in bad["drift_reasons"][0]
    edited = token_sample(renderer, _conv(msgs, turn_calls=[{"message_index": 1, "response_matches": False,
                                                             "token_ids": body}]))
    assert edited["drift"] and "edited" in edited["drift_reasons"][0] and edited["input_ids"] == plain["input_ids"]


@pytest.mark.long("the quick tier's first test here to load the embedded model's tokenizer, importing transformers "
                  "(no longer imported at collection): ~10 s CPU measured alone")
def test_a_tool_aware_template_renders_tool_calls_natively(tokenizer):
    import trl.chat_template_utils as ctu

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (Path(ctu.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    r = ChatRenderer(tok, "qwen2.5-template")
    assert r.native_calls and r.native_tools
    msgs = [{"role": "user", "content": "CALL_TOOLS for Paris"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
            {"role": "assistant", "content": "Sunny in Paris."}]
    row = token_sample(r, _conv(msgs, TOOLS))
    assert row["rendering"] == "template" and not row["warnings"]
    spans = [tok.decode(row["input_ids"][t["loss_start"]:t["end"]]) for t in row["turns"] if t["role"] == "assistant"]
    assert spans == ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n',
                     "Sunny in Paris.<|im_end|>\n"]
    assert "<tools>" in tok.decode(row["input_ids"][:row["turns"][1]["start"]])


def test_calls_split_into_conversations_by_prefix_extension():
    u1, u2 = {"role": "user", "content": "task A"}, {"role": "user", "content": "task B"}
    a1, a1_edited = {"role": "assistant", "content": "answer A"}, {"role": "assistant", "content": "answer A (edited)"}
    more = {"role": "user", "content": "more"}
    prompts = [[u1], [u1, a1, more], [u2], [u1], [u1, a1_edited, more, a1, more]]
    responses = [a1, a1, {"role": "assistant", "content": "B"}, {"role": "assistant", "content": "A again"}, a1]
    placed = assign_conversations(prompts, responses)
    # call 1 extends call 0; call 2 is another task; call 3 is a retry of task A (a branch); call 4 extends the
    # retry's prompt with an edited response, so it joins the most recent conversation starting with [u1]
    assert placed == [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]


def test_finished_sessions_by_event_idle_and_parent():
    now = 1000.0
    mk = lambda s, last, parent=None: SpooledSession(s, parent, last - 5, last, last + 1, 2)  # noqa: E731
    sessions = [mk("done", 990), mk("idle", 600), mk("resumed", 995), mk("child", 994, "done"), mk("orphan", 996, "idle"),
                mk("late-child", 999, "done")]
    events = {"done": SessionEvents(finish_ts=998.0), "resumed": SessionEvents(finish_ts=990.0)}
    status = finished_by(sessions, events, idle_seconds=300, now=now)
    assert status == {"done": "event", "idle": "idle", "resumed": None, "child": "parent", "orphan": None,
                      "late-child": None}


def test_a_session_split_over_two_proxy_processes_is_one_conversation(tmp_path):
    """Records come from several append logs (one per proxy process): the spool groups them by session."""
    proxy = ProxyLayout(tmp_path / "rec")
    for d in (proxy.records_dir, proxy.events_dir):
        d.mkdir(parents=True)
    logs = [RecordLog(proxy), RecordLog(proxy)]
    u = {"role": "user", "content": "hello"}
    ok = {"route": "chat.completions", "status": 200, "error": None, "latency_s": 0.1}
    for i, log in enumerate([logs[0], logs[1], logs[0], logs[1]]):
        msgs = [u] + [{"role": "assistant", "content": f"r{j}"} if j % 2 == 0 else {"role": "user", "content": f"q{j}"}
                      for j in range(2 * i)]
        log.record({**ok, "record_id": f"r{i}", "session": "s1" if i != 3 else "s2", "ts": 100.0 + i,
                    "request": {"messages": msgs}, "response": {"content": f"r{2 * i}", "model": "m"}})
    for log in logs:
        log.event({"session": "s1", "event": "finish", "ts": 200.0})
        log.close()
    assert len(list(proxy.records_dir.glob("*.jsonl"))) == 2
    with RecordSpool() as spool:
        assert spool.add(iter_records(proxy)) == 4
        assert [(s.session, s.records) for s in spool.sessions()] == [("s1", 3), ("s2", 1)]
        assert [r["record_id"] for r in spool.records_of("s1")] == ["r0", "r1", "r2"]
    res = collect(str(proxy.root), str(tmp_path / "out"), idle_seconds=300, now=500.0)
    assert res["counts"]["conversations"] == 2 and res["finished_by"] == {"event": 1, "idle": 1, "parent": 0,
                                                                          "unfinished": 0}
    convs = [json.loads(x) for x in Path(TrajectoryLayout(tmp_path / "out").work_conversations).read_text().splitlines()]
    assert [(c["conversation_id"], c["calls"], len(c["messages"])) for c in convs] == [("s1#0", 3, 6), ("s2#0", 1, 8)]


def test_rewards_file_formats_and_errors(tmp_path):
    (tmp_path / "r.jsonl").write_text('{"session": "a", "reward": 1}\n{"session": "b", "reward": null}\n')
    assert read_rewards(tmp_path / "r.jsonl") == {"a": 1.0}
    pl.DataFrame({"session": ["a", "b"], "reward": [0.5, -1.0]}).write_parquet(tmp_path / "r.parquet")
    assert read_rewards(tmp_path / "r.parquet") == {"a": 0.5, "b": -1.0}
    (tmp_path / "dup.csv").write_text("session,reward\na,1\na,2\n")
    with pytest.raises(ValueError, match="more than one reward"):
        read_rewards(tmp_path / "dup.csv")
    (tmp_path / "cols.csv").write_text("id,score\na,1\n")
    with pytest.raises(ValueError, match="lacks the column"):
        read_rewards(tmp_path / "cols.csv")
    (tmp_path / "text.csv").write_text("session,reward\na,high\n")
    with pytest.raises(ValueError, match="must hold numbers"):
        read_rewards(tmp_path / "text.csv")


def test_cli_exports_a_recorded_folder_with_unfinished_sessions(traffic, tmp_path, prefect_harness, capsys):
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    out = tmp_path / "cli-out"
    r = subprocess.run([sys.executable, "-m", "evolforge.cli", "trajectories", "--proxy-out", str(traffic["rec"]),
                        "--out", str(out), "--rewards", str(traffic["rewards"]), "--include-unfinished",
                        "--no-tokens", "--no-dedup"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sessions"]["exported"] == 8 and summary["sessions"]["unfinished_included"] == 1
    assert summary["duplicates"]["enabled"] is False and summary["tokens"] is None
    assert not (out / "tokens.parquet").exists() and pl.read_parquet(out / "duplicates.parquet").height == 0
    sessions = {json.loads(x)["session"] for x in (out / "sft.jsonl").read_text().splitlines()}
    assert {"open-1", "dup-a", "dup-b"} <= sessions

    from evolforge.cli import main

    assert main(["trajectories", "--proxy-out", str(traffic["rec"]), "--out", str(tmp_path / "bad"),
                 "--rewards", str(tmp_path / "missing.csv"), "--no-tokens"]) == 2  # a user error, found up front
    assert "rewards file" in capsys.readouterr().err
    assert main(["trajectories", "--proxy-out", str(tmp_path), "--out", str(tmp_path / "bad"), "--no-tokens"]) == 2
    assert "recording proxy" in capsys.readouterr().err and not (tmp_path / "bad").exists()
