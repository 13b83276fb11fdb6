"""The recording proxy, driven by the real openai SDK against an OpenAI-compatible upstream on loopback.
Asserted from both ends: what the client received equals what the upstream sent, and the record equals both."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import polars as pl
import pytest

from evolforge.storage.ledger import read_ledger
from evolforge.storage.proxy_sets import ProxyLayout, iter_events
from evolforge.tasks.proxy.server import running_proxy
from evolforge.tasks.proxy.upstream import ProxyConfigError
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.lazy import lazy_module
from evolforge.testing.net import free_port
from evolforge.testing.proxy_records import wait_for_records
from evolforge.testing.settings import make_settings

openai = lazy_module("openai")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
UPSTREAM_KEY = "sk-upstream-SECRET-0123456789"
CLIENT_KEY = "sk-client-SECRET-9876543210"


@pytest.fixture
def upstream():
    with AgentUpstream() as up:
        yield up


@pytest.fixture
def proxy(upstream, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", UPSTREAM_KEY)
    with running_proxy(make_settings(), upstream.base_url, str(tmp_path / "rec")) as url:
        yield url, ProxyLayout(tmp_path / "rec")


def _header(received: dict, name: str) -> str | None:
    return next((v for k, v in received["headers"].items() if k.lower() == name), None)


def _records(layout: ProxyLayout, n: int, timeout: float = 5.0) -> list[dict]:
    return wait_for_records(layout, n, timeout, poll=0.02, by_time=False)


def test_chat_call_passes_through_unchanged_and_is_recorded(proxy, upstream):
    url, layout = proxy
    client = openai.OpenAI(base_url=f"{url}/s/agent-1/v1", api_key=CLIENT_KEY)
    raw = client.chat.completions.with_raw_response.create(
        model="agent-model", messages=[{"role": "user", "content": "hello there"}], temperature=0.3,
        extra_body={"return_token_ids": True}, logprobs=True, extra_headers={"X-Evolforge-Role": "planner"})
    assert raw.http_response.content == upstream.sent[-1]  # byte for byte
    resp = raw.parse()
    assert resp.choices[0].message.content == "Echo: hello there"
    assert _header(upstream.received[-1], "authorization") == f"Bearer {UPSTREAM_KEY}"  # the env key, not the client's
    assert not any(k.lower().startswith("x-evolforge") for k in upstream.received[-1]["headers"])
    (rec,) = _records(layout, 1)
    assert rec["session"] == "agent-1" and rec["role"] == "planner" and rec["status"] == 200 and not rec["stream"]
    assert rec["request"]["messages"] == [{"role": "user", "content": "hello there"}]
    assert rec["request"]["parameters"]["temperature"] == 0.3
    sent = json.loads(upstream.sent[-1])
    assert rec["response"]["content"] == sent["choices"][0]["message"]["content"] == resp.choices[0].message.content
    assert rec["response"]["token_ids"] == sent["choices"][0]["token_ids"] and rec["response"]["prompt_token_ids"] == [1, 2, 3]
    assert rec["response"]["usage"] == sent["usage"] and rec["response"]["logprobs"]["content"][0]["logprob"] == -0.5
    led = read_ledger(layout.root)
    assert led.height == 1 and led["stage"][0] == "proxy" and led["task_id"][0] == "agent-1"
    assert led["prompt_tokens"][0] == sent["usage"]["prompt_tokens"]


def test_streamed_parallel_tool_calls_are_relayed_and_reassembled(proxy, upstream):
    url, layout = proxy
    client = openai.OpenAI(base_url=f"{url}/s/agent-2/v1", api_key=CLIENT_KEY)
    with client.chat.completions.with_streaming_response.create(
            model="agent-model", tools=TOOLS, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "CALL_TOOLS for Paris and Oslo"}]) as resp:
        received = b"".join(resp.iter_bytes())
    assert received == upstream.sent[-1]
    (rec,) = _records(layout, 1)
    assert rec["stream"] and rec["response"]["finish_reason"] == "tool_calls" and rec["response"]["stream_done"]
    calls = rec["response"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert [c["id"] for c in calls] == ["call_0", "call_1"] and rec["response"]["usage"]["completion_tokens"] > 0
    assert rec["request"]["tools"] == TOOLS and rec["ttft_s"] is not None and rec["ttft_s"] <= rec["latency_s"]


def test_streamed_text_with_the_sdk_parser_and_a_tool_round_trip(proxy, upstream):
    url, layout = proxy
    client = openai.OpenAI(base_url=f"{url}/s/agent-3/v1", api_key=CLIENT_KEY)
    first = client.chat.completions.create(model="agent-model", tools=TOOLS,
                                           messages=[{"role": "user", "content": "CALL_TOOLS please"}])
    calls = first.choices[0].message.tool_calls
    msgs = [{"role": "user", "content": "CALL_TOOLS please"}, first.choices[0].message.model_dump(exclude_none=True)]
    msgs += [{"role": "tool", "tool_call_id": c.id, "content": "sunny" if i == 0 else "cold"} for i, c in enumerate(calls)]
    stream = client.chat.completions.create(model="agent-model", tools=TOOLS, messages=msgs, stream=True,
                                            extra_body={"return_token_ids": True})
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == "It is sunny in Paris and cold in Oslo."
    recs = sorted(_records(layout, 2), key=lambda r: r["ts"])
    assert [r["session"] for r in recs] == ["agent-3", "agent-3"]
    assert recs[1]["response"]["content"] == text and recs[1]["response"]["token_ids"] == [ord(c) for c in text]
    assert recs[1]["request"]["messages"][-1]["role"] == "tool" and len(recs[0]["response"]["tool_calls"]) == 2


def test_completions_models_and_passthrough_routes(proxy, upstream):
    url, layout = proxy
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=CLIENT_KEY)
    assert client.completions.create(model="agent-model", prompt="2 + 2 =").choices[0].text.startswith("Completion of")
    assert [m.id for m in client.models.list()] == ["agent-model"]
    recs = _records(layout, 2)
    assert {r["route"] for r in recs} == {"completions", "models"} and {r["session"] for r in recs} == {"default"}
    comp = next(r for r in recs if r["route"] == "completions")
    assert comp["request"]["prompt"] == "2 + 2 =" and comp["response"]["content"].startswith("Completion of")


def test_bad_input_gets_a_json_error_is_recorded_and_the_proxy_keeps_serving(proxy, upstream, tmp_path):
    url, layout = proxy
    with httpx.Client(base_url=url, timeout=10) as c:
        r = c.post("/s/a/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_json"
        r = c.post("/s/a/v1/chat/completions", content=b"x" * 9_000_000)
        assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"]
        r = c.post("/s/..%2F..%2Fetc/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.status_code in (400, 404)
        r = c.post("/s/bad$name/v1/chat/completions", json={"model": "m", "messages": []})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_session"
        upstream.fault = "junk"
        r = c.post("/s/a/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_invalid_response"
        upstream.fault = "500"
        r = c.post("/s/a/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 500  # the upstream's own error passes through
        upstream.fault = None
        r = c.post("/s/a/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "ok"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Echo: ok"
    recs = _records(layout, 6)
    by_status = sorted(r["status"] for r in recs)
    assert by_status == [200, 400, 400, 413, 500, 502] and all(r["error"] for r in recs if r["status"] != 200)


def test_dot_segments_never_reach_the_upstream(proxy, upstream):
    url, layout = proxy
    before = len(upstream.received)
    with httpx.Client(base_url=url, timeout=10) as c:
        for path in ("/v1/../admin", "/s/a/v1/./chat/../../secret", "/v1/%2E%2E/admin"):
            r = c.post(path, json={"model": "m", "messages": []})
            assert r.status_code in (400, 404), path
            if r.status_code == 400:
                assert r.json()["error"]["type"] == "invalid_path"
    assert len(upstream.received) == before  # nothing was forwarded


def test_a_client_leaving_mid_stream_is_recorded_and_the_proxy_keeps_serving(tmp_path):
    import socket

    with AgentUpstream(delay=0.05) as up, running_proxy(make_settings(), up.base_url, str(tmp_path / "rec")) as url:
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps({"model": "m", "stream": True,
                           "messages": [{"role": "user", "content": "a long answer please " * 5}]}).encode()
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /s/leaver/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json"
                      b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            assert s.recv(4096).startswith(b"HTTP/1.1 200")  # the first chunk came through, then we leave
        (rec,) = _records(ProxyLayout(tmp_path / "rec"), 1, timeout=10)
        assert rec["session"] == "leaver" and rec["error"] == "client disconnected mid-stream"
        r = httpx.post(f"{url}/s/next/v1/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                              "content": "still there?"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Echo: still there?"


def test_upstream_down_is_a_502_and_sub_agent_sessions_form_a_tree(tmp_path):
    with running_proxy(make_settings(), "http://127.0.0.1:9/v1", str(tmp_path / "rec")) as url:
        with httpx.Client(base_url=url, timeout=10) as c:
            r = c.post("/s/root/v1/chat/completions", json={"model": "m", "messages": []})
            assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_unreachable"
            h = {"X-Evolforge-Parent-Session": "root"}
            assert c.post("/s/child/v1/chat/completions", json={"model": "m", "messages": []}, headers=h).status_code == 502
            r = c.post("/s/child/v1/chat/completions", json={"model": "m", "messages": []},
                       headers={"X-Evolforge-Parent-Session": "other"})
            assert r.status_code == 409 and "already belongs to parent 'root'" in r.json()["error"]["message"]
            r = c.post("/s/root/v1/chat/completions", json={"model": "m", "messages": []},
                       headers={"X-Evolforge-Parent-Session": "child"})
            assert r.status_code == 409  # root already has no parent; no loops, no mixing
        recs = _records(ProxyLayout(tmp_path / "rec"), 4)
    child = [r for r in recs if r["session"] == "child" and r["status"] == 502]
    assert child and child[0]["parent_session"] == "root"


def test_rewards_and_finish_events(proxy):
    url, layout = proxy
    with httpx.Client(base_url=url, timeout=10) as c:
        assert c.post("/s/agent-9/reward", json={"reward": 0.75, "details": {"tests": "3/4"}}).status_code == 200
        assert c.post("/s/agent-9/reward", json={"reward": "high"}).status_code == 400
        assert c.post("/s/agent-9/reward", content=b"{", headers={"content-type": "application/json"}).status_code == 400
        assert c.post("/s/agent-9/finish").status_code == 200
    events = list(iter_events(layout))
    assert [(e["event"], e.get("reward")) for e in events] == [("reward", 0.75), ("finish", None)]


def test_a_public_bind_needs_a_token_and_clients_must_send_it(upstream, tmp_path, monkeypatch):
    monkeypatch.delenv("EVOLFORGE_PROXY_TOKEN", raising=False)
    # a free port: the default 8787 may be taken by another test's proxy on a parallel worker
    r = subprocess.run([sys.executable, "-m", "evolforge.cli", "proxy", "--host", "0.0.0.0", "--port", str(free_port()),
                        "--upstream", upstream.base_url, "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "EVOLFORGE_PROXY_TOKEN" in r.stderr
    from evolforge.tasks.proxy.upstream import check_bind

    with pytest.raises(ProxyConfigError):
        check_bind("0.0.0.0", None)
    monkeypatch.setenv("EVOLFORGE_PROXY_TOKEN", "tok-123")
    with running_proxy(make_settings(), upstream.base_url, str(tmp_path / "rec")) as url:
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert httpx.get(f"{url}/v1/models", headers={"X-Evolforge-Proxy-Token": "tok-123"}).status_code == 200
        client = openai.OpenAI(base_url=f"{url}/s/t/v1", api_key="tok-123")  # the token as the bearer key
        assert client.models.list().data[0].id == "agent-model"
    assert "tok-123" not in (_header(upstream.received[-1], "authorization") or "")


def test_no_key_reaches_any_file_of_the_run(proxy, upstream, tmp_path):
    url, layout = proxy
    client = openai.OpenAI(base_url=f"{url}/s/k/v1", api_key=CLIENT_KEY)
    client.chat.completions.create(model="agent-model", messages=[{"role": "user", "content": "hi"}])
    with client.chat.completions.with_streaming_response.create(
            model="agent-model", stream=True, messages=[{"role": "user", "content": "hi"}]) as r:
        r.read()
    httpx.post(f"{url}/s/k/v1/chat/completions", content=b"{bad", headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    _records(layout, 3)
    time.sleep(0.2)
    files = [p for p in Path(layout.root).rglob("*") if p.is_file()]
    assert files
    for p in files:
        data = p.read_bytes()
        assert UPSTREAM_KEY.encode() not in data and CLIENT_KEY.encode() not in data, p


@pytest.mark.long("the proxy check command in fresh processes, both outcomes: ~9.5 s CPU measured, at the budget")
def test_proxy_check_command_reports_latency_or_the_fix(upstream, tmp_path):
    ok = subprocess.run([sys.executable, "-m", "evolforge.cli", "proxy", "--check", "--upstream", upstream.base_url,
                         "--out", str(tmp_path / "c1"), "--model", "agent-model"], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and "OK" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "evolforge.cli", "proxy", "--check", "--upstream",
                          "http://127.0.0.1:9/v1", "--out", str(tmp_path / "c2")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and "502" in bad.stderr and "fix:" in bad.stderr


def test_records_survive_as_a_table(proxy):
    url, layout = proxy
    client = openai.OpenAI(base_url=f"{url}/s/tab/v1", api_key="x")
    for i in range(5):
        client.chat.completions.create(model="agent-model", messages=[{"role": "user", "content": f"q{i}"}])
    recs = _records(layout, 5)
    df = pl.DataFrame([{"session": r["session"], "status": r["status"]} for r in recs])
    assert df.height == 5 and df["status"].to_list() == [200] * 5
