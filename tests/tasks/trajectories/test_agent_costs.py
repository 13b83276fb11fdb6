"""True costs of agent traffic, each figure worked by hand from genai-prices' published rates (per million tokens):

- claude-sonnet-4-5: input 3, cache write 3.75, cache read 0.30, output 15; above 200,000 prompt tokens every token
  of the call pays the long-context tier: input 6, cache write 7.50, cache read 0.60, output 22.50.
- gpt-4o: input 2.50, cached input 1.25, output 10.

Before: cached tokens paid the full input rate, and a tiered model always paid its long-context rate (its rate was
read off a one-million-token call). A Messages stream cut before its message_delta was charged message_start's
output count (0 or 1) instead of what had streamed.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from evolforge.config.settings import PricingSettings
from evolforge.storage.ledger import read_ledger
from evolforge.storage.proxy_sets import ProxyLayout, iter_records
from evolforge.tasks.core.pricing import PriceBook, cache_tokens
from evolforge.tasks.proxy import wires
from evolforge.tasks.proxy.server import running_proxy
from evolforge.testing import agent_apis
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.settings import make_settings

BOOK = PriceBook(PricingSettings())


def _priced(model: str, usage: dict, ledger_usage) -> float:
    u = ledger_usage(usage)
    cost, source = BOOK.cost(model, u["prompt_tokens"], u["completion_tokens"], *cache_tokens(u))
    assert source == "genai-prices"
    return cost


def test_a_claude_code_turn_pays_cache_reads_and_writes_at_their_own_rates():
    # 1,200 fresh + 2,000 written to the cache + 18,000 read from it = 21,200 prompt tokens; 500 out
    # 1,200 x 3 + 2,000 x 3.75 + 18,000 x 0.30 + 500 x 15 = 3,600 + 7,500 + 5,400 + 7,500 = 24,000 / 1e6
    usage = {"input_tokens": 1200, "cache_creation_input_tokens": 2000, "cache_read_input_tokens": 18000,
             "output_tokens": 500}
    cost = _priced("claude-sonnet-4-5", usage, wires.messages_ledger_usage)
    assert cost == pytest.approx(0.024, abs=1e-9)  # was 0.1347: 21,200 x 6 + 500 x 15 (5.6x too high)


def test_openai_cached_prompt_tokens_are_discounted_in_chat_and_responses():
    # 20,000 prompt tokens of which 16,000 cached, 300 out: 4,000 x 2.5 + 16,000 x 1.25 + 300 x 10 = 33,000 / 1e6
    chat = {"prompt_tokens": 20000, "completion_tokens": 300, "total_tokens": 20300,
            "prompt_tokens_details": {"cached_tokens": 16000}}
    assert _priced("gpt-4o", chat, lambda u: u) == pytest.approx(0.033, abs=1e-9)  # was 0.053
    responses = {"input_tokens": 20000, "input_tokens_details": {"cached_tokens": 16000}, "output_tokens": 300,
                 "output_tokens_details": {"reasoning_tokens": 100}, "total_tokens": 20300}
    assert _priced("gpt-4o", responses, wires.responses_ledger_usage) == pytest.approx(0.033, abs=1e-9)


def test_a_tiered_model_pays_the_tier_its_own_prompt_size_selects():
    small = {"input_tokens": 150_000, "output_tokens": 1000}  # 150,000 x 3 + 1,000 x 15 = 465,000 / 1e6
    assert _priced("claude-sonnet-4-5", small, wires.messages_ledger_usage) == pytest.approx(0.465, abs=1e-9)
    # was 0.915: 150,000 x 6 + 1,000 x 15 (the long-context input rate for every call)
    big = {"input_tokens": 50_000, "cache_read_input_tokens": 200_000, "output_tokens": 1000}
    # 250,000 prompt tokens pass the 200,000 tier: 50,000 x 6 + 200,000 x 0.6 + 1,000 x 22.5 = 442,500 / 1e6
    assert _priced("claude-sonnet-4-5", big, wires.messages_ledger_usage) == pytest.approx(0.4425, abs=1e-9)


def test_the_figures_agree_with_genai_prices_own_calculation():
    from genai_prices import Usage, calc_price

    for model, pt, ct, read, write in [("claude-sonnet-4-5", 21_200, 500, 18_000, 2_000),
                                       ("claude-sonnet-4-5", 260_000, 70, 250_000, 0),
                                       ("gpt-4o", 20_000, 300, 16_000, 0), ("gemini-2.5-pro", 210_000, 9, 0, 0),
                                       ("claude-haiku-4-5", 9_000, 40, 0, 8_000)]:
        want = calc_price(Usage(input_tokens=pt, output_tokens=ct, cache_read_tokens=read, cache_write_tokens=write),
                          model).total_price
        assert BOOK.cost(model, pt, ct, read, write)[0] == pytest.approx(float(want), abs=1e-12), model


def _cut_after(events: list[bytes], kinds: int) -> wires.MessagesAssembler:
    asm = wires.MessagesAssembler(0.0)
    for ev in events[:kinds]:
        asm.feed(ev)
    return asm


def test_a_cut_messages_stream_is_charged_the_completion_that_streamed():
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "x" * 80}]}
    events = agent_apis.messages_events(body, "msg_1")  # text "Echo: xxx..." in 5-character deltas
    text = agent_apis.messages_body(body, "msg_1")["content"][0]["text"]
    deltas = [e for e in events if b"text_delta" in e]
    assert len(text) == 66 and len(deltas) == 14
    asm = _cut_after(events, 3 + 10)  # message_start, ping, content_block_start, then 10 deltas (50 characters)
    assert not asm.done and asm.usage["completion_tokens"] == 13  # 50 characters: ceil(50 / 4); was 1
    assert asm.response_part()["stream_estimated_output_tokens"] == 13
    whole = _cut_after(events, len(events))  # a whole stream keeps the API's own count
    assert whole.done and whole.usage["completion_tokens"] == agent_apis.messages_body(body, "m")["usage"]["output_tokens"]
    assert "stream_estimated_output_tokens" not in whole.response_part()


def test_a_cut_translated_messages_stream_is_not_charged_zero():
    # the proxy's own Messages stream (translated from chat) opens with output_tokens 0, one delta per chat chunk
    start = {"id": "m", "type": "message", "role": "assistant", "model": "m", "content": [],
             "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                       "output_tokens": 0}}
    events = [agent_apis._sse("message_start", {"message": start}),
              agent_apis._sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})]
    events += [agent_apis._sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": t}})
               for t in ("The", " answer", " is", " 4")]
    asm = _cut_after(events, len(events))
    assert asm.usage["completion_tokens"] == 4  # one token per delta; was 0


@pytest.fixture
def upstream():
    with AgentUpstream() as up:
        yield up


def test_the_proxy_ledger_prices_a_messages_call_with_its_cache_reads(upstream, tmp_path, monkeypatch):
    for name in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "EVOLFORGE_PROXY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": "Be brief.",
            "messages": [{"role": "user", "content": "hello there"}]}
    usage = agent_apis.messages_body(body, "m")["usage"]  # the scripted upstream reads 2 prompt tokens from cache
    assert usage["cache_read_input_tokens"] == 2 and usage["input_tokens"] == 14 and usage["output_tokens"] == 11
    with running_proxy(make_settings(), upstream.base_url, str(tmp_path / "rec")) as url:
        assert httpx.post(f"{url}/s/cost-1/v1/messages", json=body, timeout=10).status_code == 200
        stream = {**body, "stream": True}
        upstream.fault = "cut"  # message_start, ping, content_block_start, half an event: nothing streamed yet
        with httpx.Client(timeout=10) as c, c.stream("POST", f"{url}/s/cost-2/v1/messages", json=stream) as r:
            b"".join(r.iter_raw())
        layout = ProxyLayout(tmp_path / "rec")
        for _ in range(250):
            if len(list(iter_records(layout))) == 2:
                break
            time.sleep(0.02)
    led = read_ledger(tmp_path / "rec").sort("ts")
    # 14 fresh x 3 + 2 cache reads x 0.30 + 11 out x 15 = 42 + 0.6 + 165 = 207.6 / 1e6
    # (was 16 x 6 + 11 x 15 = 261 / 1e6: the long-context input rate, cache reads at it too)
    assert led["prompt_tokens"][0] == 16 and led["cost_usd"][0] == pytest.approx(207.6e-6, abs=1e-12)
    assert led["price_source"][0] == "genai-prices"
    # the cut one: message_start's count (1) stands when no delta arrived
    assert led["completion_tokens"][1] == 1 and led["cost_usd"][1] == pytest.approx(57.6e-6, abs=1e-12)
    assert json.dumps(led.to_dicts())  # the ledger's rows as written
