"""The Responses API and the Messages API through the recording proxy, driven by the real openai and anthropic
SDKs against the scripted upstream (testing/agent_apis.py): what the client received equals what the upstream
sent, and the record equals what the client sent and received; one ledger row per call, priced from the API's own
usage."""

from __future__ import annotations

import json

import httpx
import pytest

from evolforge.storage.ledger import read_ledger
from evolforge.storage.proxy_sets import ProxyLayout
from evolforge.tasks.proxy.server import running_proxy
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.proxy_records import wait_for_records
from evolforge.testing.settings import make_settings

FN_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
AN_TOOLS = [{"name": "get_weather", "description": "Weather of a city",
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="


def _records(layout: ProxyLayout, n: int, timeout: float = 5.0) -> list[dict]:
    return wait_for_records(layout, n, timeout, poll=0.02)


@pytest.fixture
def upstream():
    with AgentUpstream() as up:
        yield up


@pytest.fixture
def proxy(upstream, tmp_path, monkeypatch):
    for name in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY", "EVOLFORGE_PROXY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    settings = make_settings(pricing={"overrides": {"claude-test": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
                                                 "resp-model": {"input_per_mtok": 1.0, "output_per_mtok": 4.0}}})
    with running_proxy(settings, upstream.base_url, str(tmp_path / "rec")) as url:
        yield url, ProxyLayout(tmp_path / "rec")


# ------------------------------------------------------------------ Responses API (openai SDK)


def test_responses_plain_call_is_recorded_with_input_instructions_and_usage(proxy, upstream):
    url, layout = proxy
    client = openai.OpenAI(base_url=f"{url}/s/resp-1/v1", api_key="none")
    raw = client.responses.with_raw_response.create(model="resp-model", instructions="Be brief.", input="hello there",
                                                    extra_headers={"X-Evolforge-Role": "coder"}, temperature=0.2)
    assert raw.http_response.content == upstream.sent[-1]  # byte for byte
    resp = raw.parse()
    assert resp.output_text == "Echo: hello there"
    (rec,) = _records(layout, 1)
    assert rec["route"] == "responses" and rec["session"] == "resp-1" and rec["role"] == "coder"
    assert rec["status"] == 200 and rec["error"] is None and not rec["stream"] and rec["model"] == "resp-model"
    assert rec["request"]["input"] == "hello there" and rec["request"]["instructions"] == "Be brief."
    assert rec["request"]["parameters"] == {"model": "resp-model", "temperature": 0.2}
    r = rec["response"]
    assert r["content"] == resp.output_text and r["finish_reason"] == "completed" and r["id"] == resp.id
    assert r["usage"]["input_tokens"] == resp.usage.input_tokens and r["output"][0]["type"] == "message"
    led = read_ledger(layout.root)
    assert led.height == 1 and led["prompt_tokens"][0] == resp.usage.input_tokens
    assert led["completion_tokens"][0] == resp.usage.output_tokens
    expected = (resp.usage.input_tokens * 1.0 + resp.usage.output_tokens * 4.0) / 1e6
    assert led["cost_usd"][0] == pytest.approx(expected)


def test_responses_function_calls_streamed_and_the_tool_output_turn(proxy, upstream):
    url, layout = proxy
    client = openai.OpenAI(base_url=f"{url}/s/resp-tools/v1", api_key="none")
    items: list = [{"role": "user", "content": "CALL_TOOLS: weather in Paris and Oslo?"}]
    events = list(client.responses.create(model="resp-model", input=items, tools=FN_TOOLS, stream=True))
    done = [e for e in events if e.type == "response.completed"][0].response
    calls = [o for o in done.output if o.type == "function_call"]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Oslo"]
    args_deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args_deltas == "".join(c.arguments for c in calls)
    items += [o.model_dump(exclude_none=True) for o in done.output]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": "sunny" if i == 0 else "cold"}
              for i, c in enumerate(calls)]
    second = client.responses.create(model="resp-model", input=items, tools=FN_TOOLS,
                                     previous_response_id=done.id)
    first_rec, second_rec = _records(layout, 2)
    assert first_rec["stream"] and first_rec["error"] is None and first_rec["ttft_s"] is not None
    r = first_rec["response"]
    assert r["stream_done"] and r["stream_malformed_events"] == 0
    assert r["tool_calls"] == [{"id": c.call_id, "type": "function", "function": {"name": "get_weather",
                                                                                 "arguments": c.arguments}}
                               for c in calls]
    assert r["reasoning_content"] == "The user wants two cities." and r["content"] is None
    assert r["usage"]["output_tokens"] == done.usage.output_tokens
    assert second_rec["request"]["previous_response_id"] == done.id
    sent_types = [i.get("type", "message") for i in second_rec["request"]["input"]]
    assert sent_types == ["message", "reasoning", "function_call", "function_call", "function_call_output",
                          "function_call_output"]
    assert second_rec["response"]["content"] == second.output_text == "It is sunny in Paris and cold in Oslo."
    led = read_ledger(layout.root)
    assert led.height == 2 and sorted(led["prompt_tokens"].to_list()) == sorted(
        [done.usage.input_tokens, second.usage.input_tokens])


def test_responses_stream_text_deltas_reach_the_client_and_the_record(proxy, upstream):
    url, layout = proxy
    client = openai.OpenAI(base_url=f"{url}/s/resp-s/v1", api_key="none")
    with httpx.Client(timeout=10) as c, c.stream("POST", f"{url}/s/resp-s/v1/responses",
                                                 json={"model": "resp-model", "input": "stream me", "stream": True}) as r:
        got = b"".join(r.iter_raw())
    assert got == upstream.sent[-1]
    text = "".join(e.delta for e in client.responses.create(model="resp-model", input="stream me", stream=True)
                   if e.type == "response.output_text.delta")
    recs = _records(layout, 2)
    assert text == "Echo: stream me" and all(r["response"]["content"] == text for r in recs)
    assert all(r["stream"] and r["response"]["usage"]["total_tokens"] > 0 for r in recs)


# ------------------------------------------------------------------ Messages API (anthropic SDK)


def _anthropic(url: str, session: str):
    return anthropic.Anthropic(base_url=f"{url}/s/{session}", api_key="sk-ant-none")


def test_messages_plain_call_with_an_image_is_recorded(proxy, upstream):
    url, layout = proxy
    client = _anthropic(url, "ant-1")
    content = [{"type": "text", "text": "What is this?"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}]
    raw = client.messages.with_raw_response.create(model="claude-test", max_tokens=64, system="Be brief.",
                                                   messages=[{"role": "user", "content": content}])
    assert raw.http_response.content == upstream.sent[-1]
    msg = raw.parse()
    assert msg.content[0].text == "Echo: What is this? [1 image(s)]"
    assert upstream.received[-1]["path"] == "/v1/messages"
    (rec,) = _records(layout, 1)
    assert rec["route"] == "messages" and rec["status"] == 200 and rec["error"] is None and rec["model"] == "claude-test"
    assert rec["request"]["system"] == "Be brief." and rec["request"]["messages"][0]["content"] == content
    assert rec["request"]["parameters"]["max_tokens"] == 64
    r = rec["response"]
    assert r["content"] == msg.content[0].text and r["finish_reason"] == "end_turn" and r["id"] == msg.id
    assert r["usage"]["input_tokens"] == msg.usage.input_tokens
    led = read_ledger(layout.root)
    prompt = msg.usage.input_tokens + msg.usage.cache_read_input_tokens  # cache reads are prompt tokens too
    assert led["prompt_tokens"][0] == prompt and led["completion_tokens"][0] == msg.usage.output_tokens
    assert led["cost_usd"][0] == pytest.approx((prompt * 3.0 + msg.usage.output_tokens * 15.0) / 1e6)


def test_messages_streamed_tool_use_then_the_tool_result_turn(proxy, upstream):
    url, layout = proxy
    client = _anthropic(url, "ant-tools")
    messages: list = [{"role": "user", "content": "CALL_TOOLS: weather in Paris and Oslo?"}]
    with client.messages.stream(model="claude-test", max_tokens=256, messages=messages, tools=AN_TOOLS) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [u.input["city"] for u in uses] == ["Paris", "Oslo"]
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                                  "content": "sunny" if i == 0 else "cold"}
                                                 for i, u in enumerate(uses)]})
    answer = client.messages.create(model="claude-test", max_tokens=256, messages=messages, tools=AN_TOOLS)
    first, second = _records(layout, 2)
    assert first["stream"] and first["error"] is None and first["ttft_s"] is not None
    r = first["response"]
    assert r["stream_done"] and r["stream_malformed_events"] == 0 and r["finish_reason"] == "tool_use"
    assert r["reasoning_content"] == final.content[0].thinking and r["content"] == "Checking both."
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in r["tool_calls"]] == \
        [(u.id, u.input) for u in uses]
    assert r["content_blocks"] == [b.model_dump(exclude_none=True) for b in final.content]
    assert r["usage"]["output_tokens"] == final.usage.output_tokens
    assert second["request"]["messages"] == messages and second["request"]["tools"] == AN_TOOLS
    assert second["response"]["content"] == answer.content[0].text == "It is sunny in Paris and cold in Oslo."
    led = read_ledger(layout.root)
    assert led.height == 2 and set(led["completion_tokens"].to_list()) >= {final.usage.output_tokens}


def test_count_tokens_and_models_pass_through_and_are_on_the_record(proxy, upstream):
    url, layout = proxy
    client = _anthropic(url, "ant-c")
    n = client.messages.count_tokens(model="claude-test", messages=[{"role": "user", "content": "hi"}])
    assert n.input_tokens >= 1 and upstream.received[-1]["path"] == "/v1/messages/count_tokens"
    assert httpx.get(f"{url}/s/ant-c/v1/models").json()["data"][0]["id"] == "agent-model"
    recs = _records(layout, 2)
    assert sorted(r["route"] for r in recs) == ["messages/count_tokens", "models"]
    assert all(r["request"] is None and r["status"] == 200 for r in recs)
    assert read_ledger(layout.root).height == 2


def test_a_messages_stream_without_message_stop_passes_as_sent_and_is_a_failed_record(proxy, upstream):
    url, layout = proxy
    upstream.fault = "cut"  # the upstream ends the response after three events and half of the fourth
    body = {"model": "claude-test", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=10) as c, c.stream("POST", f"{url}/s/ant-cut/v1/messages", json=body) as r:
        got = b"".join(r.iter_raw())
    assert got == upstream.sent[-1] and b"message_stop" not in got  # as sent: the proxy adds nothing
    (rec,) = _records(layout, 1)
    assert rec["error"] == "stream ended without message_stop" and rec["response"]["model"] == "claude-test"
    led = read_ledger(layout.root)
    assert led.height == 1 and led["outcome"][0] == "error" and led["prompt_tokens"][0] > 0  # message_start's usage


# ------------------------------------------------------------------ hostile upstreams: one record, one ledger row


@pytest.fixture
def hproxy(tmp_path, monkeypatch):
    from evolforge.testing.hostile_upstream import HostileUpstream

    for name in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY", "EVOLFORGE_PROXY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with HostileUpstream() as up, running_proxy(make_settings(), up.base_url, str(tmp_path / "rec")) as url:
        yield url, ProxyLayout(tmp_path / "rec")


REQUEST = {"responses": {"model": "m", "input": "hi"},
           "messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}}


def _shapes(table: dict) -> list[tuple[str, str]]:
    return [(api, name) for api in sorted(table) for name in sorted(table[api])]


def _typed_fields_ok(resp: dict) -> None:
    assert isinstance(resp["content"], (str, type(None))) and isinstance(resp["tool_calls"], (list, type(None)))
    for call in resp["tool_calls"] or []:
        assert isinstance(call["function"]["name"], str) and isinstance(call["function"]["arguments"], str)
    assert all(isinstance(resp[k], (str, type(None))) for k in ("model", "id", "finish_reason", "reasoning_content"))
    assert resp["usage"] is None or all(isinstance(v, int) for v in resp["usage"].values() if not isinstance(v, dict))


from evolforge.testing.hostile_upstream import API_PASSING, API_REPLIES, API_STREAMS, API_STREAMS_PASSING  # noqa: E402
from evolforge.testing.lazy import lazy_module

anthropic = lazy_module("anthropic")
openai = lazy_module("openai")


@pytest.mark.parametrize("api,shape", _shapes(API_REPLIES))
def test_an_api_reply_of_unexpected_shape_is_a_502_or_passes_and_is_one_record(hproxy, api, shape):
    url, layout = hproxy
    r = httpx.post(f"{url}/s/h/v1/{api}", json=REQUEST[api], headers={"X-Hostile-Reply": shape}, timeout=10)
    passing = shape in API_PASSING
    if passing:
        assert r.status_code == 200 and r.content == API_REPLIES[api][shape][2]
    else:
        assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_invalid_response"
    (rec,) = _records(layout, 1)
    led = read_ledger(layout.root)
    assert led.height == 1 and led["outcome"][0] == ("ok" if passing else "malformed_response")
    assert rec["route"] == api and (rec["error"] is None) == passing
    if passing:
        _typed_fields_ok(rec["response"])
        assert led["prompt_tokens"][0] == 5 and led["completion_tokens"][0] == 2


@pytest.mark.parametrize("api,shape", _shapes(API_STREAMS))
def test_an_api_stream_of_unexpected_shape_reaches_the_client_and_is_one_record(hproxy, api, shape):
    url, layout = hproxy
    with httpx.Client(timeout=10) as c, c.stream("POST", f"{url}/s/h/v1/{api}", json={**REQUEST[api], "stream": True},
                                                 headers={"X-Hostile-Reply": shape}) as r:
        assert r.status_code == 200
        got = b"".join(r.iter_raw())
    sent = b"".join(API_STREAMS[api][shape])
    if shape == "s_cut":  # what came, then an error event both SDKs raise
        assert got.startswith(b"".join(API_STREAMS[api][shape][:-1])) and got.endswith(b"\n\n")
        assert b"event: error\ndata: " in got and b'"upstream_error"' in got
    else:
        assert got == sent
    (rec,) = _records(layout, 1)
    led = read_ledger(layout.root)
    fine = shape in API_STREAMS_PASSING
    assert rec["stream"] and rec["status"] == 200 and led.height == 1
    assert (rec["error"] is None) == fine, rec["error"]
    assert (led["outcome"][0] == "ok") == fine
    _typed_fields_ok(rec["response"])
    if fine:
        assert rec["response"]["content"] == "ok"


def test_both_sdks_raise_on_a_stream_the_upstream_breaks(hproxy):
    url, layout = hproxy
    hdr = {"X-Hostile-Reply": "s_cut"}
    with pytest.raises(anthropic.APIError):
        with anthropic.Anthropic(base_url=f"{url}/s/cut", api_key="x", default_headers=hdr, max_retries=0).messages.stream(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as s:
            s.get_final_message()
    with pytest.raises((openai.APIError, ValueError)):  # the half event before the error event is not JSON
        list(openai.OpenAI(base_url=f"{url}/s/cut/v1", api_key="x", default_headers=hdr, max_retries=0).responses.create(
            model="m", input="hi", stream=True))
    recs = _records(layout, 2)
    assert len(recs) == 2 and all(r["error"].startswith("upstream stream broke") for r in recs)


@pytest.mark.slow
@pytest.mark.embedded
def test_both_sdks_through_the_proxy_to_the_embedded_llama_server(tmp_path):
    """llama.cpp's llama-server serves /v1/responses and /v1/messages itself: the real SDKs, the real server."""
    from evolforge.tasks.core import llama_server
    from evolforge.tasks.core.embedded_model import embedded_server

    settings = make_settings(embedded={"server": "llama-server"})
    if not llama_server.find_binary(settings.embedded):
        pytest.skip("llama-server is not built here: evolforge serve-model --build")
    alias = settings.embedded.alias
    with embedded_server(settings.embedded, tmp_path) as upstream, \
            running_proxy(settings, upstream, str(tmp_path / "rec"), {alias}) as url:
        ant = anthropic.Anthropic(base_url=f"{url}/s/smol", api_key="none", max_retries=0)
        msgs = [{"role": "user", "content": "Name one colour."}]
        plain = ant.messages.create(model=alias, max_tokens=12, messages=msgs, extra_body={"temperature": 0})
        with ant.messages.stream(model=alias, max_tokens=12, messages=msgs, extra_body={"temperature": 0}) as s:
            streamed = s.get_final_message()
        oai = openai.OpenAI(base_url=f"{url}/s/smol/v1", api_key="none", max_retries=0)
        r_plain = oai.responses.create(model=alias, input="Name one colour.", max_output_tokens=12, temperature=0)
        r_text = "".join(e.delta for e in oai.responses.create(model=alias, input="Name one colour.",
                                                                max_output_tokens=12, temperature=0, stream=True)
                         if e.type == "response.output_text.delta")
        recs = _records(ProxyLayout(tmp_path / "rec"), 4, timeout=30)
    assert [r["route"] for r in recs] == ["messages", "messages", "responses", "responses"]
    assert all(r["status"] == 200 and r["error"] is None for r in recs), [r["error"] for r in recs]
    text = "".join(b.text for b in plain.content if b.type == "text")
    assert recs[0]["response"]["content"] == text and text
    assert recs[1]["stream"] and recs[1]["response"]["content"] == "".join(
        b.text for b in streamed.content if b.type == "text")
    assert recs[2]["response"]["content"] == r_plain.output_text and r_plain.output_text
    assert recs[3]["stream"] and recs[3]["response"]["content"] == r_text
    led = read_ledger(tmp_path / "rec")
    assert led.height == 4 and (led["cost_usd"] == 0.0).all() and (led["completion_tokens"] > 0).all()


def test_openai_agents_sdk_with_its_default_responses_model_through_the_proxy(proxy, upstream):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    url, layout = proxy
    agents.set_tracing_disabled(True)
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        asked.append(city)
        return "sunny" if city == "Paris" else "cold"

    client = AsyncOpenAI(base_url=f"{url}/s/agents-resp/v1", api_key="none",
                         default_headers={"X-OpenForge-Role": "weather-agent"})
    agent = agents.Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather],
                         model=agents.OpenAIResponsesModel(model="resp-model", openai_client=client))
    result = agents.Runner.run_sync(agent, "CALL_TOOLS: weather in Paris and Oslo?")
    assert result.final_output == "It is sunny in Paris and cold in Oslo." and asked == ["Paris", "Oslo"]
    first, second = _records(layout, 2)
    assert {first["route"], second["route"]} == {"responses"} and first["role"] == "weather-agent"
    assert first["request"]["instructions"] == "Answer with the weather."
    assert [json.loads(c["function"]["arguments"])["city"] for c in first["response"]["tool_calls"]] == ["Paris", "Oslo"]
    outputs = [i for i in second["request"]["input"] if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == ["sunny", "cold"]
    assert [o["call_id"] for o in outputs] == [c["id"] for c in first["response"]["tool_calls"]]
    assert second["response"]["content"] == result.final_output


def test_responses_logprobs_are_recorded_when_the_upstream_returns_them(proxy, upstream):
    url, layout = proxy
    client = openai.OpenAI(base_url=f"{url}/s/resp-lp/v1", api_key="none")
    include = ["message.output_text.logprobs"]
    plain = client.responses.create(model="resp-model", input="abc", include=include)
    events = list(client.responses.create(model="resp-model", input="abc", include=include, stream=True))
    client.responses.create(model="resp-model", input="abc")
    got = [lp.logprob for lp in plain.output[0].content[0].logprobs]
    streamed = [lp.logprob for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    recs = _records(layout, 3)
    assert len(got) == len("Echo: abc") and streamed == got
    assert [x["logprob"] for x in recs[0]["response"]["logprobs"]["content"]] == got
    assert [x["logprob"] for x in recs[1]["response"]["logprobs"]["content"]] == streamed
    assert recs[2]["response"]["logprobs"] is None
