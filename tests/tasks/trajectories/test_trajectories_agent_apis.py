"""Responses API and Messages API sessions exported like chat: the anthropic SDK and the openai SDK's
responses.create through the recording proxy (scripted upstream), then the export's steps over the folder.
Asserted against what the clients sent and received: roles, tool calls and results in order, thinking /
reasoning in `reasoning_content`, images kept as TRL multimodal parts, a previous_response_id chain continued,
and a session that mixes the three APIs exported in call order."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import polars as pl
import pytest

from evolforge.storage.proxy_sets import ProxyLayout, iter_records
from evolforge.storage.trajectory_sets import TrajectoryLayout
from evolforge.tasks.proxy.server import running_proxy
from evolforge.tasks.trajectories.export import collect, dedup_prompts, publish, token_samples
from evolforge.tasks.trajectories.wire_messages import messages_prompt, responses_prompt
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.lazy import lazy_module
from evolforge.testing.settings import make_settings

anthropic = lazy_module("anthropic")
openai = lazy_module("openai")


FN_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
AN_TOOLS = [{"name": "get_weather", "description": "Weather of a city",
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
FINAL = "It is sunny in Paris and cold in Oslo."
N_RECORDS = 8


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("apis")
    rec = root / "rec"
    seen: dict = {}
    with AgentUpstream() as up, running_proxy(make_settings(), up.base_url, str(rec)) as url:
        # claude: Messages API, an image, streamed tool_use with thinking, the tool_result turn
        ant = anthropic.Anthropic(base_url=f"{url}/s/claude-1", api_key="x", max_retries=0)
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}
        msgs: list = [{"role": "user", "content": [{"type": "text", "text": "CALL_TOOLS: weather here?"}, image]}]
        with ant.messages.stream(model="claude-test", max_tokens=256, system="You check weather.", messages=msgs,
                                 tools=AN_TOOLS) as s:
            first = s.get_final_message()
        msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
        uses = [b for b in first.content if b.type == "tool_use"]
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": w}
                                                 for u, w in zip(uses, ["sunny", "cold"])]})
        answer = ant.messages.create(model="claude-test", max_tokens=256, system="You check weather.", messages=msgs,
                                     tools=AN_TOOLS)
        seen["claude"] = (first, answer)
        # codex: Responses API, streamed function calls, outputs sent with previous_response_id (items only)
        oai = openai.OpenAI(base_url=f"{url}/s/codex-1/v1", api_key="x", max_retries=0)
        events = list(oai.responses.create(model="resp-model", instructions="You are terse.", tools=FN_TOOLS,
                                           input="CALL_TOOLS: Paris and Oslo?", stream=True))
        done = [e for e in events if e.type == "response.completed"][0].response
        calls = [o for o in done.output if o.type == "function_call"]
        outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": w}
                   for c, w in zip(calls, ["sunny", "cold"])]
        second = oai.responses.create(model="resp-model", instructions="You are terse.", tools=FN_TOOLS,
                                      input=outputs, previous_response_id=done.id)
        seen["codex"] = (done, second)
        # mixed: chat, then Messages, then Responses in one session
        oai_m = openai.OpenAI(base_url=f"{url}/s/mixed/v1", api_key="x", max_retries=0)
        oai_m.chat.completions.create(model="agent-model", messages=[{"role": "user", "content": "one"}])
        anthropic.Anthropic(base_url=f"{url}/s/mixed", api_key="x").messages.create(
            model="claude-test", max_tokens=16, messages=[{"role": "user", "content": "two"}])
        oai_m.responses.create(model="resp-model", input="three")
        with httpx.Client(base_url=url, timeout=10) as h:
            for s in ("claude-1", "codex-1", "mixed"):
                h.post(f"/s/{s}/reward", json={"reward": 1.0})
                h.post(f"/s/{s}/finish")
        deadline = time.time() + 10
        while len(list(iter_records(ProxyLayout(rec)))) < N_RECORDS and time.time() < deadline:
            time.sleep(0.05)
    out = root / "out"
    collect(str(rec), str(out), idle_seconds=300)
    dedup_prompts(str(out), make_settings().dedup, enabled=False)
    token_samples(str(out))
    summary = publish(str(out))
    lay = TrajectoryLayout(out)
    sft = {r["session"]: r for r in map(json.loads, Path(lay.sft).read_text().splitlines())}
    return {"summary": summary, "sft": sft, "transitions": pl.read_parquet(lay.transitions),
            "tokens": pl.read_parquet(lay.tokens), "seen": seen}


@pytest.mark.long("the first test carries the module's export fixture (three agent sessions through the proxy, the "
                  "embedded model's tokenizer for the token samples): ~18 s CPU measured on a loaded machine")
def test_a_messages_session_is_one_conversation_with_thinking_tools_and_the_image(exported):
    first, answer = exported["seen"]["claude"]
    msgs = exported["sft"]["claude-1"]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert msgs[0]["content"] == "You check weather."
    assert msgs[1]["content"] == [{"type": "text", "text": "CALL_TOOLS: weather here?"},
                                  {"type": "image", "image": f"data:image/png;base64,{PIXEL}"}]
    thinking = [b.thinking for b in first.content if b.type == "thinking"]
    uses = [b for b in first.content if b.type == "tool_use"]
    assert msgs[2]["reasoning_content"] == thinking[0] and msgs[2]["content"] == "Checking both."
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in msgs[2]["tool_calls"]] == \
        [(u.id, u.input) for u in uses]
    assert [(m["tool_call_id"], m["content"]) for m in msgs[3:5]] == [(uses[0].id, "sunny"), (uses[1].id, "cold")]
    assert msgs[5] == {"role": "assistant", "content": answer.content[0].text}
    assert exported["sft"]["claude-1"]["calls"] == 2 and exported["sft"]["claude-1"]["reward"] == 1.0
    tr = exported["transitions"].filter(pl.col("session") == "claude-1").sort("call_index")
    assert tr["route"].to_list() == ["messages", "messages"] and tr["finish_reason"].to_list() == ["tool_use", "end_turn"]
    assert tr["prompt"][0][1]["images"] == [f"data:image/png;base64,{PIXEL}"]
    assert tr["prompt"][0][1]["content"] == "CALL_TOOLS: weather here?"
    assert tr["completion"][0][0]["reasoning_content"] == thinking[0]
    assert tr["prompt_tokens"][1] == answer.usage.input_tokens + answer.usage.cache_read_input_tokens
    assert exported["summary"]["calls"]["image_parts_kept"] >= 1


def test_a_responses_chain_by_previous_response_id_is_one_conversation(exported):
    done, second = exported["seen"]["codex"]
    msgs = exported["sft"]["codex-1"]["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert msgs[0]["content"] == "You are terse." and msgs[1]["content"] == "CALL_TOOLS: Paris and Oslo?"
    calls = [o for o in done.output if o.type == "function_call"]
    assert [(c["id"], c["function"]["arguments"]) for c in msgs[2]["tool_calls"]] == \
        [(c.call_id, c.arguments) for c in calls]
    assert msgs[2]["reasoning_content"] == done.output[0].summary[0].text
    assert [m["content"] for m in msgs[3:5]] == ["sunny", "cold"] and msgs[5]["content"] == second.output_text == FINAL
    assert exported["sft"]["codex-1"]["calls"] == 2
    assert json.loads(exported["sft"]["codex-1"]["tools"])[0]["function"]["name"] == "get_weather"
    assert exported["summary"]["calls"]["responses_history_not_recorded"] == 0


def test_a_session_mixing_the_three_apis_is_exported_in_call_order(exported):
    tr = exported["transitions"].filter(pl.col("session") == "mixed").sort("call_index")
    assert tr["route"].to_list() == ["chat.completions", "messages", "responses"]
    assert [p[-1]["content"] for p in tr["prompt"].to_list()] == ["one", "two", "three"]
    assert [c[0]["content"] for c in tr["completion"].to_list()] == ["Echo: one", "Echo: two", "Echo: three"]
    tokens = exported["tokens"]
    assert tokens.filter(pl.col("session") == "claude-1").height == 1  # the image turn renders as its text


def test_request_converters_keep_order_and_refuse_empty_requests():
    msgs, parts = messages_prompt({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "document", "source": {}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}, {"type": "tool_use", "id": "u1",
                                                                                  "name": "f", "input": {"x": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1", "content": [
            {"type": "text", "text": "r"}]}, {"type": "text", "text": "next"}]}]})
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "user"] and parts.dropped == 1
    assert msgs[1] == {"role": "assistant", "content": "", "reasoning_content": "t", "tool_calls": [
        {"id": "u1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}
    assert msgs[2] == {"role": "tool", "tool_call_id": "u1", "content": "r"} and msgs[3]["content"] == "next"
    msgs, _ = responses_prompt({"input": [{"role": "developer", "content": "d"},
                                          {"type": "message", "role": "user", "content": [
                                              {"type": "input_text", "text": "look"},
                                              {"type": "input_image", "image_url": "https://x/i.png"}]}]})
    assert msgs == [{"role": "system", "content": "d"}, {"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image", "image": "https://x/i.png"}]}]
    for bad in ({}, {"messages": []}, {"messages": "hi"}):
        with pytest.raises(ValueError):
            messages_prompt(bad)
    with pytest.raises(ValueError):
        responses_prompt({"input": 5})


HOSTILE_BODIES = [
    ("responses", {"model": "m", "input": {"role": "user"}}),
    ("responses", {"model": "m", "input": [1, "x", {"type": "function_call", "arguments": {"a": 1}}, {"content": 7}]}),
    ("responses", {"model": "m", "input": [{"type": "function_call_output", "call_id": None, "output": [{"x": 1}]}],
                   "previous_response_id": "resp_never_recorded", "instructions": ["not", "text"]}),
    ("messages", {"model": "m", "messages": "hi", "max_tokens": 4}),
    ("messages", {"model": "m", "messages": [{"role": "user", "content": [1, None, {"type": "image", "source": 5}]}],
                  "system": [{"type": "text", "text": 3}], "max_tokens": 4}),
    ("messages", {"model": "m", "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "input": "not an object"}, {"type": "thinking", "thinking": 5}]}], "max_tokens": 4}),
]


def test_hostile_requests_are_recorded_and_exported_or_skipped_never_a_crash(tmp_path, monkeypatch):
    from evolforge.testing.hostile_upstream import HostileUpstream

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    rec = tmp_path / "rec"
    with HostileUpstream() as up, running_proxy(make_settings(), up.base_url, str(rec)) as url:
        for route, body in HOSTILE_BODIES:
            assert httpx.post(f"{url}/s/hostile/v1/{route}", json=body, timeout=10).status_code == 200
        httpx.post(f"{url}/s/hostile/finish")
        deadline = time.time() + 10
        while len(list(iter_records(ProxyLayout(rec)))) < len(HOSTILE_BODIES) and time.time() < deadline:
            time.sleep(0.05)
    out = tmp_path / "out"
    res = collect(str(rec), str(out), idle_seconds=300)
    dedup_prompts(str(out), make_settings().dedup, enabled=False)
    summary = publish(str(out), tokens=False)
    assert res["counts"]["model_calls"] == len(HOSTILE_BODIES)
    exported = res["counts"].get("transitions", 0)
    unusable = summary["calls"]["unusable_skipped"]
    assert exported + unusable == len(HOSTILE_BODIES) and unusable >= 2  # `input` an object, `messages` a string
    assert summary["calls"]["responses_history_not_recorded"] == 1
    tr = pl.read_parquet(TrajectoryLayout(out).transitions)
    assert tr.height == exported and all(isinstance(p, list) for p in tr["prompt"].to_list())


@pytest.mark.slow
@pytest.mark.embedded
def test_two_turn_sessions_of_both_apis_on_the_embedded_llama_server_export_as_conversations(tmp_path):
    from evolforge.tasks.core import llama_server
    from evolforge.tasks.core.embedded_model import embedded_server

    settings = make_settings(embedded={"server": "llama-server"})
    if not llama_server.find_binary(settings.embedded):
        pytest.skip("llama-server is not built here: evolforge serve-model --build")
    alias, rec = settings.embedded.alias, tmp_path / "rec"
    with embedded_server(settings.embedded, tmp_path) as upstream, \
            running_proxy(settings, upstream, str(rec), {alias}) as url:
        ant = anthropic.Anthropic(base_url=f"{url}/s/smol-msg", api_key="none", max_retries=0)
        msgs: list = [{"role": "user", "content": "Name one colour."}]
        first = ant.messages.create(model=alias, max_tokens=8, system="Be brief.", messages=msgs)
        msgs += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "Another?"}]
        with ant.messages.stream(model=alias, max_tokens=8, system="Be brief.", messages=msgs) as s:
            last = s.get_final_message()
        oai = openai.OpenAI(base_url=f"{url}/s/smol-resp/v1", api_key="none", max_retries=0)
        items: list = [{"role": "user", "content": "Name one fruit."}]
        r1 = oai.responses.create(model=alias, instructions="Be brief.", input=items, max_output_tokens=8)
        items += [o.model_dump(exclude_none=True) for o in r1.output] + [{"role": "user", "content": "Another?"}]
        r2 = "".join(e.delta for e in oai.responses.create(model=alias, instructions="Be brief.", input=items,
                                                            max_output_tokens=8, stream=True)
                     if e.type == "response.output_text.delta")
        with httpx.Client(base_url=url) as h:
            for s in ("smol-msg", "smol-resp"):
                h.post(f"/s/{s}/finish")
        deadline = time.time() + 30
        while len(list(iter_records(ProxyLayout(rec)))) < 4 and time.time() < deadline:
            time.sleep(0.05)
    out = tmp_path / "out"
    collect(str(rec), str(out), idle_seconds=300)
    dedup_prompts(str(out), settings.dedup, enabled=False)
    publish(str(out), tokens=False)
    sft = {r["session"]: r for r in map(json.loads, Path(TrajectoryLayout(out).sft).read_text().splitlines())}
    m = sft["smol-msg"]["messages"]
    assert [x["role"] for x in m] == ["system", "user", "assistant", "user", "assistant"] and sft["smol-msg"]["calls"] == 2
    assert m[2]["content"] == first.content[0].text and m[4]["content"] == "".join(
        b.text for b in last.content if b.type == "text")
    r = sft["smol-resp"]["messages"]
    assert [x["role"] for x in r] == ["system", "user", "assistant", "user", "assistant"] and sft["smol-resp"]["calls"] == 2
    assert r[2]["content"] == r1.output_text and r[4]["content"] == r2


def test_codex_custom_tool_and_local_shell_items_are_tool_calls_in_order():
    from evolforge.tasks.proxy.wires import responses_part

    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    items = [{"role": "user", "content": [{"type": "input_text", "text": "add a.txt"}]},
             {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "patch it"}],
              "encrypted_content": "opaque"},
             {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": patch},
             {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
             {"type": "local_shell_call", "call_id": "c2", "action": {"type": "exec", "command": ["ls"]}},
             {"type": "local_shell_call_output", "call_id": "c2", "output": "a.txt"}]
    msgs, parts = responses_prompt({"input": items})
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant", "tool"] and parts.dropped == 0
    assert msgs[1]["reasoning_content"] == "patch it"
    assert msgs[1]["tool_calls"] == [{"id": "c1", "type": "function", "function": {"name": "apply_patch",
                                                                                  "arguments": patch}}]
    assert msgs[3]["tool_calls"][0]["function"]["name"] == "local_shell"
    assert json.loads(msgs[3]["tool_calls"][0]["function"]["arguments"])["command"] == ["ls"]
    assert [m["content"] for m in msgs if m["role"] == "tool"] == ["Done!", "a.txt"]
    rec = responses_part({"output": [items[2]], "status": "completed"})  # what the proxy records of the reply
    assert rec["tool_calls"] == msgs[1]["tool_calls"] and rec["content"] is None


CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_tools_are_exported_in_one_schema_whatever_the_api(exported):
    # the Messages API's input_schema form and the Responses API's flat form: both the chat function form
    assert json.loads(exported["sft"]["claude-1"]["tools"]) == [CHAT_TOOL]
    assert json.loads(exported["sft"]["codex-1"]["tools"]) == [CHAT_TOOL]
    tr = exported["transitions"].filter(pl.col("session").is_in(["claude-1", "codex-1"]))
    assert {t for t in tr["tools"].to_list()} == {json.dumps([CHAT_TOOL])}
