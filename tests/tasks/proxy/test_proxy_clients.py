"""Real clients through the recording proxy: the OpenAI Agents SDK running a tool-using agent, and the openai
SDK against the embedded model (llama.cpp), streamed and not."""

from __future__ import annotations

import json

import pytest

from evolforge.storage.proxy_sets import ProxyLayout
from evolforge.tasks.proxy.server import running_proxy
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.lazy import lazy_module
from evolforge.testing.proxy_records import wait_for_records
from evolforge.testing.settings import make_settings

openai = lazy_module("openai")


def _records(layout: ProxyLayout, n: int, timeout: float = 10.0) -> list[dict]:
    return wait_for_records(layout, n, timeout, poll=0.05)


def test_openai_agents_sdk_agent_with_tools_through_the_proxy(tmp_path):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no trace export: this machine has no network, and none is wanted
    weather_asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        weather_asked.append(city)
        return "sunny" if city == "Paris" else "cold"

    with AgentUpstream() as upstream, running_proxy(make_settings(), upstream.base_url, str(tmp_path / "rec")) as url:
        client = AsyncOpenAI(base_url=f"{url}/s/weather-agent/v1", api_key="sk-test",
                             default_headers={"X-OpenForge-Role": "weather-agent"})
        agent = agents.Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather],
                             model=agents.OpenAIChatCompletionsModel(model="agent-model", openai_client=client))
        result = agents.Runner.run_sync(agent, "CALL_TOOLS: weather in Paris and Oslo?")
        recs = _records(ProxyLayout(tmp_path / "rec"), 2)
        sent = [json.loads(b) for b in upstream.sent if b.startswith(b"{")]
    assert result.final_output == "It is sunny in Paris and cold in Oslo."
    assert weather_asked == ["Paris", "Oslo"]
    assert len(recs) == 2 and {r["session"] for r in recs} == {"weather-agent"}
    assert {r["role"] for r in recs} == {"weather-agent"}
    first, second = recs
    assert [json.loads(c["function"]["arguments"])["city"] for c in first["response"]["tool_calls"]] == ["Paris", "Oslo"]
    assert first["response"]["tool_calls"] == sent[0]["choices"][0]["message"]["tool_calls"]  # as the upstream sent
    tool_msgs = [m for m in second["request"]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["sunny", "cold"]
    assert second["response"]["content"] == result.final_output
    assert first["request"]["tools"][0]["function"]["name"] == "get_weather"


@pytest.mark.slow
@pytest.mark.embedded
def test_openai_sdk_through_the_proxy_to_the_embedded_model(tmp_path):
    from evolforge.tasks.core.embedded_model import embedded_server

    settings = make_settings()
    with embedded_server(settings.embedded, tmp_path) as upstream, \
            running_proxy(settings, upstream, str(tmp_path / "rec"), {settings.embedded.alias}) as url:
        client = openai.OpenAI(base_url=f"{url}/s/smol/v1", api_key="none")
        messages = [{"role": "user", "content": "Name one colour."}]
        plain = client.chat.completions.create(model=settings.embedded.alias, messages=messages, max_tokens=12,
                                               temperature=0)
        chunks = list(client.chat.completions.create(model=settings.embedded.alias, messages=messages, max_tokens=12,
                                                     temperature=0, stream=True))
        recs = _records(ProxyLayout(tmp_path / "rec"), 2, timeout=30)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert plain.choices[0].message.content == streamed  # greedy: the same text both ways
    assert recs[0]["response"]["content"] == plain.choices[0].message.content
    assert recs[1]["stream"] and recs[1]["response"]["content"] == streamed and recs[1]["ttft_s"] is not None
    assert all(r["status"] == 200 and r["model"] for r in recs)
