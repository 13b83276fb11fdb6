"""Translation for chat-only upstreams (proxy.translate): the real anthropic SDK and the openai SDK's Responses
API through the proxy to an upstream that speaks only chat completions (testing/chat_upstream.py, and the
project's scripted chat server). What arrives upstream is a chat request; what the client gets is its own API,
plain, streamed and with tool calls; the record keeps the client's view and, under `translation`, the chat call;
one record and one ledger row per call, hostile chat replies and cut streams included."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from evolforge.storage.ledger import read_ledger
from evolforge.storage.proxy_sets import ProxyLayout
from evolforge.tasks.proxy import translate, translate_messages, translate_responses
from evolforge.tasks.proxy.server import running_proxy
from evolforge.testing import chat_upstream
from evolforge.testing.agent_apis import ANSWER
from evolforge.testing.chat_upstream import ChatUpstream
from evolforge.testing.proxy_records import wait_for_records
from evolforge.testing.settings import make_settings

FN_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
AN_TOOLS = [{"name": "get_weather", "description": "Weather of a city",
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
PRICES = {"overrides": {"claude-test": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
                        "resp-model": {"input_per_mtok": 1.0, "output_per_mtok": 4.0}}}


def _records(layout: ProxyLayout, n: int, timeout: float = 5.0) -> list[dict]:
    return wait_for_records(layout, n, timeout, poll=0.02)


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch):
    for name in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY", "EVOLFORGE_PROXY_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def upstream():
    with ChatUpstream() as up:
        yield up


@pytest.fixture
def proxy(upstream, tmp_path):
    settings = make_settings(pricing=PRICES, proxy={"translate": "both"})
    with running_proxy(settings, upstream.base_url, str(tmp_path / "rec")) as url:
        yield url, ProxyLayout(tmp_path / "rec")


def _anthropic(url: str, session: str, **kw):
    return anthropic.Anthropic(base_url=f"{url}/s/{session}", api_key="sk-ant-none", max_retries=0, **kw)


def _only_chat_reached(upstream: ChatUpstream) -> None:
    assert upstream.received and all(r["path"] == "/v1/chat/completions" for r in upstream.received), \
        [r["path"] for r in upstream.received]


# ------------------------------------------------------------------ Messages API (anthropic SDK)


def test_messages_plain_with_system_and_an_image_is_a_chat_call_and_recorded_both_ways(proxy, upstream):
    url, layout = proxy
    content = [{"type": "text", "text": "What is this?"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}]
    msg = _anthropic(url, "t-ant").messages.create(
        model="claude-test", max_tokens=64, system=[{"type": "text", "text": "Be brief."}], extra_body={"temperature": 0.1},
        stop_sequences=["###"], messages=[{"role": "user", "content": content}])
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Echo: What is this? [1 image(s)]"
    assert msg.stop_reason == "end_turn" and msg.role == "assistant"
    _only_chat_reached(upstream)
    (sent,) = upstream.chat_requests()
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}]}]
    assert sent["model"] == "claude-test" and sent["max_tokens"] == 64 and sent["temperature"] == 0.1
    assert sent["stop"] == ["###"] and "stream" not in sent
    chat_usage = upstream.usage(sent, "Echo: What is this? [1 image(s)]")
    assert msg.usage.input_tokens == chat_usage["prompt_tokens"] - 2 and msg.usage.cache_read_input_tokens == 2
    assert msg.usage.output_tokens == chat_usage["completion_tokens"]
    (rec,) = _records(layout, 1)
    assert rec["route"] == "messages" and rec["status"] == 200 and rec["error"] is None and not rec["stream"]
    assert rec["request"]["messages"] == [{"role": "user", "content": content}]  # the client's view
    assert rec["request"]["system"] == [{"type": "text", "text": "Be brief."}]
    assert rec["response"]["content"] == msg.content[0].text and rec["response"]["id"] == msg.id
    assert rec["response"]["content_blocks"] == [b.model_dump(exclude_none=True) for b in msg.content]
    tr = rec["translation"]
    assert tr["route"] == "chat.completions" and tr["status"] == 200 and tr["request"] == sent
    assert tr["response"]["content"] == msg.content[0].text and tr["response"]["usage"] == chat_usage
    assert tr["error"] is None and tr["dropped"] == []
    led = read_ledger(layout.root)
    assert led.height == 1 and led["prompt_tokens"][0] == chat_usage["prompt_tokens"]
    assert led["cost_usd"][0] == pytest.approx((chat_usage["prompt_tokens"] * 3.0
                                                + chat_usage["completion_tokens"] * 15.0) / 1e6)


def test_messages_streamed_thinking_and_tool_use_then_the_tool_result_turn(proxy, upstream):
    url, layout = proxy
    client = _anthropic(url, "t-ant-tools")
    messages: list = [{"role": "user", "content": "CALL_TOOLS: weather in Paris and Oslo?"}]
    with client.messages.stream(model="claude-test", max_tokens=256, messages=messages, tools=AN_TOOLS,
                                tool_choice={"type": "auto", "disable_parallel_tool_use": False}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert [b.type for b in final.content] == ["thinking", "tool_use", "tool_use"]
    assert final.content[0].thinking == chat_upstream.REASONING and final.stop_reason == "tool_use"
    uses = final.content[1:]
    assert [(u.id, u.name, u.input) for u in uses] == [("call_0", "get_weather", {"city": "Paris"}),
                                                        ("call_1", "get_weather", {"city": "Oslo"})]
    first_sent = upstream.chat_requests()[0]
    assert first_sent["stream"] is True and first_sent["stream_options"] == {"include_usage": True}
    assert first_sent["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": AN_TOOLS[0]["input_schema"], "description": "Weather of a city"}}]
    assert first_sent["tool_choice"] == "auto" and "parallel_tool_calls" not in first_sent
    usage = upstream.usage(first_sent, json.dumps(chat_upstream.reply(first_sent)["tool_calls"]))
    assert final.usage.output_tokens == usage["completion_tokens"]
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == usage["prompt_tokens"]
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id,
                                                  "content": "sunny" if i == 0 else [{"type": "text", "text": "cold"}]}
                                                 for i, u in enumerate(uses)]})
    answer = client.messages.create(model="claude-test", max_tokens=256, messages=messages, tools=AN_TOOLS)
    assert answer.content[0].text == ANSWER
    second_sent = upstream.chat_requests()[1]
    assert second_sent["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": u.id, "type": "function", "function": {"name": "get_weather",
                                                           "arguments": translate.to_json(u.input).decode()}}
            for u in uses]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"}]
    _only_chat_reached(upstream)
    first, second = _records(layout, 2)
    assert first["stream"] and first["error"] is None and first["ttft_s"] is not None
    r = first["response"]
    assert r["stream_done"] and r["stream_malformed_events"] == 0 and r["finish_reason"] == "tool_use"
    assert r["reasoning_content"] == chat_upstream.REASONING and r["content"] is None
    assert [(c["id"], json.loads(c["function"]["arguments"])) for c in r["tool_calls"]] == [(u.id, u.input) for u in uses]
    assert r["content_blocks"] == [b.model_dump(exclude_none=True) for b in final.content]
    tr = first["translation"]
    assert tr["dropped"] == [] and tr["response"]["stream_done"] and tr["response"]["usage"] == usage
    assert tr["response"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert second["request"]["messages"] == messages and second["translation"]["request"] == second_sent
    assert second["translation"]["dropped"] == ["thinking blocks"]  # an earlier turn's thinking: no chat form
    led = read_ledger(layout.root)
    assert led.height == 2 and usage["prompt_tokens"] in led["prompt_tokens"].to_list()


def test_messages_streamed_text_reaches_the_client_delta_by_delta(proxy, upstream):
    url, layout = proxy
    with _anthropic(url, "t-ant-s").messages.stream(model="claude-test", max_tokens=32,
                                                    messages=[{"role": "user", "content": "stream me"}]) as s:
        deltas = [e.delta.text for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert "".join(deltas) == final.content[0].text == "Echo: stream me" and len(deltas) == 4
    (rec,) = _records(layout, 1)
    assert rec["response"]["content"] == "Echo: stream me" and rec["response"]["usage"]["output_tokens"] > 0
    assert rec["translation"]["response"]["content"] == "Echo: stream me"


@pytest.mark.parametrize("stream", [False, True])
def test_tool_arguments_that_are_not_json_reach_the_client_as_an_empty_input_and_are_noted(proxy, upstream, stream):
    url, layout = proxy
    client = _anthropic(url, f"t-bad-{stream}")
    kw = dict(model="claude-test", max_tokens=32, tools=AN_TOOLS,
              messages=[{"role": "user", "content": "BAD_JSON weather?"}])
    if stream:
        with client.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**kw)
    assert [(b.type, b.input) for b in msg.content] == [("tool_use", {})]
    (rec,) = _records(layout, 1)
    assert rec["error"] is None and rec["response"]["tool_calls"][0]["function"]["arguments"] == "{}"
    tr = rec["translation"]
    assert tr["response"]["tool_calls"][0]["function"]["arguments"] == chat_upstream.BAD_ARGUMENTS
    assert len(tr["notes"]) == 1 and "not a JSON object" in tr["notes"][0]


def test_a_messages_request_chat_cannot_carry_is_a_400_in_anthropic_form_and_not_forwarded(proxy, upstream):
    url, layout = proxy
    with pytest.raises(anthropic.BadRequestError) as e:
        _anthropic(url, "t-bad").messages.create(model="claude-test", max_tokens=8, messages=[{
            "role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "file_1"}}]}])
    assert e.value.body["type"] == "error" and "file" in e.value.body["error"]["message"]
    assert upstream.received == []
    (rec,) = _records(layout, 1)
    assert rec["status"] == 400 and rec["error"] and "translation" not in rec
    led = read_ledger(layout.root)
    assert led.height == 1 and led["cost_usd"][0] == 0.0 and led["price_source"][0] == "not forwarded"


# ------------------------------------------------------------------ Responses API (openai SDK)


def _oai(url: str, session: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/s/{session}/v1", api_key="none", max_retries=0)


def test_responses_plain_with_instructions_and_a_developer_message(proxy, upstream):
    url, layout = proxy
    items = [{"role": "developer", "content": "Answer in English."}, {"role": "user", "content": [
        {"type": "input_text", "text": "hello there"}, {"type": "input_image", "image_url": f"data:image/png;base64,{PIXEL}"}]}]
    resp = _oai(url, "t-resp").responses.create(model="resp-model", instructions="Be brief.", input=items,
                                                max_output_tokens=40, temperature=0.2)
    assert resp.output_text == "Echo: hello there [1 image(s)]" and resp.status == "completed"
    (sent,) = upstream.chat_requests()
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief.\n\nAnswer in English."},
        {"role": "user", "content": [{"type": "text", "text": "hello there"},
                                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}]}]
    assert sent["max_tokens"] == 40 and sent["temperature"] == 0.2
    usage = upstream.usage(sent, resp.output_text)
    assert resp.usage.input_tokens == usage["prompt_tokens"] and resp.usage.output_tokens == usage["completion_tokens"]
    assert resp.usage.input_tokens_details.cached_tokens == 2
    (rec,) = _records(layout, 1)
    assert rec["route"] == "responses" and rec["request"]["input"] == items and rec["request"]["instructions"] == "Be brief."
    assert rec["response"]["content"] == resp.output_text and rec["response"]["id"] == resp.id
    assert rec["translation"]["request"] == sent and rec["translation"]["response"]["content"] == resp.output_text
    led = read_ledger(layout.root)
    assert led["cost_usd"][0] == pytest.approx((usage["prompt_tokens"] * 1.0 + usage["completion_tokens"] * 4.0) / 1e6)


def test_responses_streamed_function_calls_then_previous_response_id_continues_the_conversation(proxy, upstream):
    url, layout = proxy
    client = _oai(url, "t-resp-tools")
    events = list(client.responses.create(model="resp-model", input="CALL_TOOLS: weather in Paris and Oslo?",
                                          tools=FN_TOOLS, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert [o.type for o in done.output] == ["reasoning", "function_call", "function_call"]
    assert done.output[0].content[0].text == chat_upstream.REASONING
    calls = done.output[1:]
    assert [(c.call_id, json.loads(c.arguments)) for c in calls] == [("call_0", {"city": "Paris"}),
                                                                     ("call_1", {"city": "Oslo"})]
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == \
        "".join(c.arguments for c in calls)
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "sunny" if i == 0 else "cold"}
               for i, c in enumerate(calls)]
    second = client.responses.create(model="resp-model", input=outputs, tools=FN_TOOLS,
                                     previous_response_id=done.id)
    assert second.output_text == ANSWER
    sent = upstream.chat_requests()[1]["messages"]
    assert sent == [{"role": "user", "content": "CALL_TOOLS: weather in Paris and Oslo?"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": c.call_id, "type": "function", "function": {"name": "get_weather",
                                                                           "arguments": c.arguments}} for c in calls]},
                    {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
                    {"role": "tool", "tool_call_id": "call_1", "content": "cold"}]
    first_rec, second_rec = _records(layout, 2)
    r = first_rec["response"]
    assert first_rec["stream"] and r["stream_done"] and r["reasoning_content"] == chat_upstream.REASONING
    assert [c["id"] for c in r["tool_calls"]] == ["call_0", "call_1"] and r["id"] == done.id
    assert second_rec["request"]["previous_response_id"] == done.id and second_rec["request"]["input"] == outputs
    assert second_rec["translation"]["request"]["messages"] == sent


def test_responses_stream_helper_accumulates_the_translated_events(proxy, upstream):
    url, layout = proxy
    with _oai(url, "t-helper").responses.stream(model="resp-model", input="stream me") as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == "Echo: stream me"
    (rec,) = _records(layout, 1)
    assert rec["response"]["content"] == "Echo: stream me" and rec["error"] is None


def test_an_unknown_previous_response_id_is_a_400_and_not_forwarded(proxy, upstream):
    url, layout = proxy
    with pytest.raises(openai.BadRequestError) as e:
        _oai(url, "t-prev").responses.create(model="resp-model", input="hi", previous_response_id="resp_nowhere")
    assert e.value.body["type"] == "previous_response_not_found" and upstream.received == []
    (rec,) = _records(layout, 1)
    assert rec["status"] == 400 and read_ledger(layout.root)["price_source"][0] == "not forwarded"


def test_store_false_responses_are_not_kept_for_previous_response_id(proxy, upstream):
    url, layout = proxy
    client = _oai(url, "t-nostore")
    first = client.responses.create(model="resp-model", input="hi", store=False)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="resp-model", input="again", previous_response_id=first.id)


def test_only_the_configured_api_is_translated(tmp_path):
    from evolforge.testing.agent_upstream import AgentUpstream

    settings = make_settings(proxy={"translate": "messages"})
    with AgentUpstream() as up, running_proxy(settings, up.base_url, str(tmp_path / "rec")) as url:
        _oai(url, "pass").responses.create(model="m", input="hi")
        _anthropic(url, "tr").messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        paths = [r["path"] for r in up.received]
        recs = _records(ProxyLayout(tmp_path / "rec"), 2)
    assert paths == ["/v1/responses", "/v1/chat/completions"]
    assert ["translation" in r for r in recs] == [False, True]


def test_an_upstream_that_answers_streams_in_json_is_replayed_as_the_clients_event_stream(tmp_path):
    """The project's scripted chat server answers every POST with one chat completion, streamed or not."""
    from evolforge.testing.scripted_server import ScriptedServer

    settings = make_settings(proxy={"translate": "both"})
    with ScriptedServer() as srv, running_proxy(settings, srv.base_url, str(tmp_path / "rec")) as url:
        with _anthropic(url, "js").messages.stream(model="m", max_tokens=8,
                                                   messages=[{"role": "user", "content": "hi"}]) as s:
            text = "".join(e.delta.text for e in s if e.type == "content_block_delta")
            final = s.get_final_message()
        events = list(_oai(url, "js").responses.create(model="m", input="hi", stream=True))
        recs = _records(ProxyLayout(tmp_path / "rec"), 2)
    assert text == final.content[0].text and "The answer is: 42" in text and final.usage.output_tokens > 0
    assert events[-1].type == "response.completed" and "The answer is: 42" in events[-1].response.output_text
    assert [r["error"] for r in recs] == [None, None] and all(r["stream"] for r in recs)
    assert all(r["translation"]["response"]["content"] == r["response"]["content"] for r in recs)


def test_a_cut_chat_stream_ends_the_clients_stream_with_an_error_both_sdks_raise(proxy, upstream):
    url, layout = proxy
    upstream.fault = "cut"
    with pytest.raises(anthropic.APIError):
        with _anthropic(url, "cut").messages.stream(model="m", max_tokens=8,
                                                    messages=[{"role": "user", "content": "hello"}]) as s:
            s.get_final_message()
    with pytest.raises(openai.APIError):
        list(_oai(url, "cut").responses.create(model="m", input="hello", stream=True))
    recs = _records(layout, 2)
    assert len(recs) == 2 and all(r["error"].startswith("upstream stream broke") for r in recs), [r["error"] for r in recs]
    assert all(r["translation"]["error"] == r["error"] for r in recs)
    assert read_ledger(layout.root).height == 2


def test_a_client_that_goes_away_mid_stream_stops_the_upstream_call_and_is_one_record(proxy, upstream):
    url, layout = proxy
    upstream.delay = 0.5  # "Echo: a long answer to stream": 8 text chunks and 3 more events, 5 s or more
    body = {"model": "m", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "a long answer to stream"}]}
    with httpx.Client(timeout=10) as c, c.stream("POST", f"{url}/s/gone/v1/messages", json=body) as r:
        first = next(r.iter_raw())
    assert first.startswith(b"event: message_start")
    (rec,) = _records(layout, 1, timeout=10)
    assert rec["error"] == "client disconnected mid-stream" and rec["translation"]["error"] == rec["error"]
    assert read_ledger(layout.root).height == 1
    # the proxy hung up on the upstream: its stream ended at a write, not at its end (a condition, not a time bound)
    deadline = time.monotonic() + 10
    while not upstream.aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream.aborted == 1 and not upstream.sent


# ------------------------------------------------------------------ hostile chat upstreams
from evolforge.testing.hostile_upstream import REPLIES, STREAMS  # noqa: E402
from evolforge.testing.lazy import lazy_module

anthropic = lazy_module("anthropic")
openai = lazy_module("openai")

REQUEST = {"responses": {"model": "m", "input": "hi"},
           "messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}}
# what still parses into the chat form (tests/tasks/proxy/test_proxy_boundaries.py's PASSING and the plain ok)
PASSING = {"ok", "model_list", "model_dict", "model_int", "id_dict", "finish_reason_dict", "logprobs_list",
           "token_ids_str", "prompt_token_ids_dict", "reasoning_list", "big_int", "lone_surrogate", "surrogate_model"}
ERRORS = {"error_str", "error_list", "error_junk", "error_nested", "status_201"}
STREAMS_PASSING = {"s_ok", "s_crlf", "s_surrogate", "s_model_dict", "s_id_list", "s_finish_reason_list",
                   "s_logprobs_str", "s_token_ids_str", "s_prompt_token_ids_dict", "s_reasoning_int"}


@pytest.fixture
def hproxy(tmp_path):
    from evolforge.testing.hostile_upstream import HostileUpstream

    settings = make_settings(proxy={"translate": "both"})
    with HostileUpstream() as up, running_proxy(settings, up.base_url, str(tmp_path / "rec")) as url:
        yield url, ProxyLayout(tmp_path / "rec"), up


def _error_of(api: str, body: dict) -> dict:
    if api == "messages":
        assert body["type"] == "error"
    assert isinstance(body["error"]["message"], str) and isinstance(body["error"]["type"], str)
    return body["error"]


@pytest.mark.parametrize("api", ["messages", "responses"])
@pytest.mark.parametrize("shape", sorted(REPLIES))
def test_a_hostile_chat_reply_is_a_well_formed_answer_or_error_and_one_record(hproxy, api, shape):
    url, layout, up = hproxy
    r = httpx.post(f"{url}/s/h/v1/{api}", json=REQUEST[api], headers={"X-Hostile-Reply": shape}, timeout=10)
    assert up.received[-1]["path"] == "/v1/chat/completions"
    (rec,) = _records(layout, 1)
    led = read_ledger(layout.root)
    assert led.height == 1 and rec["route"] == api and rec["translation"]["status"] == REPLIES[shape][0]
    if shape in PASSING:
        assert r.status_code == 200 and rec["error"] is None and led["outcome"][0] == "ok"
        body = r.json()
        text = body["content"][0]["text"] if api == "messages" else body["output"][0]["content"][0]["text"]
        assert text in ("ok", "\ud800 x") and rec["response"]["content"] == text
        assert isinstance(rec["response"]["model"], (str, type(None)))
    elif shape in ERRORS:
        status = REPLIES[shape][0]
        assert r.status_code == (status if status >= 400 else 502) and rec["status"] == r.status_code
        _error_of(api, r.json())
        assert rec["error"] and led["outcome"][0] == f"http_{r.status_code}"
    else:
        assert r.status_code == 502 and _error_of(api, r.json())["type"] == "upstream_invalid_response"
        assert rec["error"] and led["outcome"][0] == "malformed_response"


def _events(raw: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            lines = dict(line.split(": ", 1) for line in block.splitlines())
            out.append((lines["event"], json.loads(lines["data"])))
    return out


@pytest.mark.parametrize("api", ["messages", "responses"])
@pytest.mark.parametrize("shape", sorted(STREAMS))
def test_a_hostile_chat_stream_ends_the_clients_stream_well_formed_and_is_one_record(hproxy, api, shape):
    url, layout, up = hproxy
    with httpx.Client(timeout=10) as c, c.stream("POST", f"{url}/s/hs/v1/{api}", json={**REQUEST[api], "stream": True},
                                                 headers={"X-Hostile-Reply": shape}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        got = b"".join(r.iter_raw())
    events = _events(got)  # every event whole: an event line and a JSON data line
    assert all(data["type"] == kind for kind, data in events)
    (rec,) = _records(layout, 1)
    led = read_ledger(layout.root)
    assert rec["stream"] and led.height == 1
    fine = shape in STREAMS_PASSING
    assert (rec["error"] is None) == fine, rec["error"]
    assert (led["outcome"][0] == "ok") == fine
    end = "message_stop" if api == "messages" else "response.completed"
    if fine:
        assert events[-1][0] == end and rec["response"]["content"].startswith("ok")
        assert rec["response"]["content"] == rec["translation"]["response"]["content"]  # what the upstream sent
        assert events[0][0] == ("message_start" if api == "messages" else "response.created")
    else:
        assert events[-1][0] == "error" and end not in [k for k, _ in events]
        assert rec["translation"]["error"] == rec["error"]


@pytest.mark.parametrize("api", ["messages", "responses"])
@pytest.mark.parametrize("shape", ["s_ok", "s_cut", "s_junk_event", "s_no_done"])
def test_a_chat_stream_to_a_client_that_asked_for_none_is_one_json_answer_or_a_502(hproxy, api, shape):
    url, layout, up = hproxy
    r = httpx.post(f"{url}/s/hj/v1/{api}", json=REQUEST[api], headers={"X-Hostile-Reply": shape}, timeout=10)
    (rec,) = _records(layout, 1)
    assert not rec["stream"] and read_ledger(layout.root).height == 1
    if shape == "s_ok":
        body = r.json()
        assert r.status_code == 200 and rec["error"] is None
        assert (body["content"][0]["text"] if api == "messages" else body["output"][0]["content"][0]["text"]) == "ok"
        assert rec["translation"]["response"]["stream_done"]
    else:
        assert r.status_code == 502 and _error_of(api, r.json())["type"] == "upstream_error" and rec["error"]


def test_translate_model_names_the_upstream_model_and_the_ledger_prices_what_it_reports(upstream, tmp_path):
    settings = make_settings(pricing=PRICES, proxy={"translate": "both", "translate_model": "resp-model"})
    with running_proxy(settings, upstream.base_url, str(tmp_path / "rec")) as url:
        msg = _anthropic(url, "tm").messages.create(model="claude-sonnet-4-5", max_tokens=8,
                                                    messages=[{"role": "user", "content": "hi"}])
        recs = _records(ProxyLayout(tmp_path / "rec"), 1)
    assert upstream.chat_requests()[0]["model"] == "resp-model" and msg.model == "resp-model"
    assert recs[0]["request"]["parameters"]["model"] == "claude-sonnet-4-5"  # the client's view
    led = read_ledger(tmp_path / "rec")
    assert led["model"][0] == "resp-model" and led["price_source"][0] != "unknown model"
    assert led["cost_usd"][0] == pytest.approx((led["prompt_tokens"][0] * 1.0 + led["completion_tokens"][0] * 4.0) / 1e6)


# ------------------------------------------------------------------ the translation's pure functions


def test_messages_request_maps_blocks_tools_and_choices():
    body = {"model": "c", "max_tokens": 5, "top_k": 3, "system": "S", "tools": [
        AN_TOOLS[0], {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                              {"type": "text", "text": "a"},
                                              {"type": "tool_use", "id": "u1", "name": "get_weather", "input": {"city": "X"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "u1", "is_error": True, "content": [
                    {"type": "text", "text": "r"},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
                {"type": "text", "text": "more"}]}]}
    tr = translate_messages.messages_request(body, model="served")
    assert tr.body["model"] == "served" and tr.body["top_k"] == 3 and tr.body["parallel_tool_calls"] is False
    assert tr.body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert [t["function"]["name"] for t in tr.body["tools"]] == ["get_weather"]
    assert tr.body["messages"] == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "tool_calls": [
            {"id": "u1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"X"}'}}]},
        {"role": "tool", "tool_call_id": "u1", "content": "r"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                                     {"type": "text", "text": "more"}]}]
    assert tr.dropped == ["thinking blocks", "tool_result is_error flags", "tool web_search_20250305"]
    assert translate_messages.messages_request({**body, "tool_choice": {"type": "any"}}).body["tool_choice"] == "required"
    for bad in ({"messages": "x"}, {"messages": [{"role": "tool", "content": "x"}]},
                {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 3}]}]},
                {"messages": [], "system": [{"type": "image", "source": {"type": "url", "url": "u"}}]}):
        with pytest.raises(translate.Untranslatable):
            translate_messages.messages_request(bad)


def test_responses_request_maps_items_custom_and_shell_tools_and_back():
    body = {"model": "m", "instructions": "I", "tools": [
        FN_TOOLS[0], {"type": "custom", "name": "apply_patch", "description": "Patch files.",
                      "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
        {"type": "local_shell"}, {"type": "web_search"}],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
        "input": [{"type": "message", "role": "user", "content": "go"},
                  {"type": "reasoning", "id": "rs", "summary": []},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                  {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
                  {"type": "local_shell_call", "call_id": "c2", "action": {"type": "exec", "command": ["ls"]}},
                  {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
                  {"type": "local_shell_call_output", "call_id": "c2", "output": [
                      {"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "https://x/i.png"}]}]}
    tr = translate_responses.responses_request(body)
    assert tr.custom_tools == {"apply_patch"} and tr.shell_tools == {"local_shell"}
    tools = {t["function"]["name"]: t["function"] for t in tr.body["tools"]}
    assert set(tools) == {"get_weather", "apply_patch", "local_shell"} and "start: /.+/" in tools["apply_patch"]["description"]
    assert tr.body["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert tr.body["messages"] == [
        {"role": "system", "content": "I"}, {"role": "user", "content": "go"},
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "apply_patch", "arguments": '{"input":"*** Begin Patch"}'}},
            {"id": "c2", "type": "function", "function": {"name": "local_shell", "arguments": '{"command":["ls"]}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        {"role": "tool", "tool_call_id": "c2", "content": "a"}]
    assert tr.dropped == ["reasoning items", "non-text parts of tool outputs", "tool web_search"]
    part = {"content": None, "finish_reason": "tool_calls", "usage": {"prompt_tokens": 9, "completion_tokens": 3},
            "tool_calls": [{"id": "k1", "function": {"name": "apply_patch", "arguments": '{"input": "P"}'}},
                           {"id": "k2", "function": {"name": "local_shell", "arguments": '{"command": ["pwd"]}'}},
                           {"id": "k3", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
    out = translate_responses.chat_to_responses(part, tr, "resp_1")["output"]
    assert [(o["type"], o["call_id"]) for o in out] == [("custom_tool_call", "k1"), ("local_shell_call", "k2"),
                                                        ("function_call", "k3")]
    assert out[0]["input"] == "P" and out[1]["action"] == {"type": "exec", "command": ["pwd"]}
    assert translate_responses.chat_to_responses({**part, "tool_calls": None, "content": "x",
                                                  "finish_reason": "length"}, tr, "r")["status"] == "incomplete"


# ------------------------------------------------------------------ the embedded model's llama-server, chat only


@pytest.mark.slow
@pytest.mark.embedded
def test_both_sdks_translated_to_the_embedded_llama_servers_chat_completions(tmp_path):
    """The real SDKs, the real server: every call goes to llama-server's /v1/chat/completions, plain, streamed and
    a tool-result turn. (The 135M model's chat template has no tools: llama-server makes it no tool calls, even
    with tool_choice required, so the turns before the result are the client's own.)"""
    from evolforge.tasks.core import llama_server
    from evolforge.tasks.core.embedded_model import embedded_server

    settings = make_settings(embedded={"server": "llama-server"}, proxy={"translate": "both"})
    if not llama_server.find_binary(settings.embedded):
        pytest.skip("llama-server is not built here: evolforge serve-model --build")
    alias = settings.embedded.alias
    greedy = {"temperature": 0}
    ask = "What is the weather in Paris?"
    with embedded_server(settings.embedded, tmp_path) as up, \
            running_proxy(settings, up, str(tmp_path / "rec"), {alias}) as url:
        ant = _anthropic(url, "smol-ant")
        msgs: list = [{"role": "user", "content": "Name one colour."}]
        plain = ant.messages.create(model=alias, max_tokens=12, messages=msgs, extra_body=greedy)
        with ant.messages.stream(model=alias, max_tokens=12, messages=msgs, extra_body=greedy) as s:
            streamed = s.get_final_message()
        turn = [{"role": "user", "content": ask},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                   "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
        with ant.messages.stream(model=alias, max_tokens=16, messages=turn, tools=AN_TOOLS, extra_body=greedy) as s:
            after = s.get_final_message()
        oai = _oai(url, "smol-resp")
        r_plain = oai.responses.create(model=alias, input="Name one colour.", max_output_tokens=12, temperature=0)
        r_text = "".join(e.delta for e in oai.responses.create(model=alias, input="Name one colour.",
                                                                max_output_tokens=12, temperature=0, stream=True)
                         if e.type == "response.output_text.delta")
        items = [{"role": "user", "content": ask},
                 {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                 {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
        r_after = oai.responses.create(model=alias, input=items, tools=FN_TOOLS, max_output_tokens=16, temperature=0)
        r_next = oai.responses.create(model=alias, previous_response_id=r_after.id, input="And in Oslo?",
                                      max_output_tokens=8, temperature=0)
        recs = _records(ProxyLayout(tmp_path / "rec"), 7, timeout=30)
    text = "".join(b.text for b in plain.content if b.type == "text")
    assert text and text == "".join(b.text for b in streamed.content if b.type == "text")  # greedy: the same
    after_text = "".join(b.text for b in after.content if b.type == "text")
    assert after_text and after.stop_reason in ("end_turn", "max_tokens")
    assert r_plain.output_text and r_plain.output_text == r_text
    assert r_after.output_text and r_next.output_text
    assert [r["route"] for r in recs] == ["messages"] * 3 + ["responses"] * 4
    assert all(r["status"] == 200 and r["error"] is None for r in recs), [r["error"] for r in recs]
    assert all(r["translation"]["path"] == "chat/completions" and r["translation"]["status"] == 200 for r in recs)
    assert recs[0]["response"]["content"] == text and recs[3]["response"]["content"] == r_plain.output_text
    assert recs[2]["response"]["content"] == after_text and recs[2]["stream"]
    tool_turn = [{"role": "user", "content": ask},
                 {"role": "assistant", "content": None, "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
                     "name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
                 {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}]
    assert recs[2]["translation"]["request"]["messages"] == tool_turn
    chain = recs[6]["translation"]["request"]["messages"]  # previous_response_id: the earlier turns, then this input
    assert chain[:3] == [{**m, "tool_calls": [{**m["tool_calls"][0], "id": "call_1"}]} if m["role"] == "assistant"
                         else {**m, "tool_call_id": "call_1"} if m["role"] == "tool" else m for m in tool_turn]
    assert chain[3] == {"role": "assistant", "content": r_after.output_text}
    assert chain[4] == {"role": "user", "content": "And in Oslo?"}
    led = read_ledger(tmp_path / "rec")
    assert led.height == 7 and (led["cost_usd"] == 0.0).all() and (led["completion_tokens"] > 0).all()
