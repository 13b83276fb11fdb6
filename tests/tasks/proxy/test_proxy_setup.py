"""Set-up that works the first time (issue 40): the output cap for the embedded model (proxy.embedded_max_tokens),
checked on what the scripted upstream received; the start banner's base URLs and token header, used as printed
by the real openai and anthropic SDKs against `evolforge proxy` in front of a scripted upstream; `--translate`;
`--check` on the embedded model priced free."""

from __future__ import annotations

import time

import anthropic
import openai
import pytest

from evolforge.storage.ledger import read_ledger
from evolforge.storage.proxy_sets import ProxyLayout, iter_records
from evolforge.tasks.proxy.server import running_proxy
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.chat_upstream import ChatUpstream
from evolforge.testing.settings import make_settings

EMBEDDED = {"smollm2-135m-instruct"}  # what the CLI passes when the upstream is the embedded model


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch):
    for name in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "EVOLFORGE_PROXY_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def _records(layout: ProxyLayout, n: int, timeout: float = 5.0) -> list[dict]:
    deadline = time.time() + timeout
    while True:
        recs = sorted(iter_records(layout), key=lambda r: r["ts"])
        if len(recs) >= n or time.time() > deadline:
            return recs
        time.sleep(0.02)


def _calls(url: str) -> None:
    """One call per recorded API without an output limit, one with a large one, one within the cap."""
    oa = openai.OpenAI(base_url=f"{url}/s/cap/v1", api_key="x", max_retries=0)
    an = anthropic.Anthropic(base_url=f"{url}/s/cap", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    oa.chat.completions.create(model="m", messages=msgs)                       # none
    oa.chat.completions.create(model="m", messages=msgs, max_completion_tokens=50_000)  # over
    oa.chat.completions.create(model="m", messages=msgs, max_tokens=10)         # within: as sent
    oa.completions.create(model="m", prompt="hi")                                # text completion, none
    oa.responses.create(model="m", input="hi")                                   # Codex sends none
    an.messages.create(model="claude-x", max_tokens=20_000, messages=msgs)       # Claude Code asks 32000


@pytest.mark.parametrize("embedded", [True, False], ids=["embedded-upstream", "other-upstream"])
def test_embedded_upstream_gets_an_output_cap_others_get_calls_as_sent(tmp_path, embedded):
    settings = make_settings(proxy={"embedded_max_tokens": 300})
    with AgentUpstream() as up, running_proxy(settings, up.base_url, str(tmp_path / "rec"),
                                              embedded_models=EMBEDDED if embedded else None) as url:
        _calls(url)
        got = [(r["path"].split("?")[0].removeprefix("/v1/"), r["body"]) for r in up.received if r["body"]]
        recs = _records(ProxyLayout(tmp_path / "rec"), 6)
    limits = [{k: b.get(k) for k in ("max_tokens", "max_completion_tokens", "max_output_tokens") if k in b}
              for _, b in got]
    assert [p for p, _ in got] == ["chat/completions"] * 3 + ["completions", "responses", "messages"]
    if embedded:
        assert limits == [{"max_tokens": 300}, {"max_completion_tokens": 300}, {"max_tokens": 10},
                          {"max_tokens": 300}, {"max_output_tokens": 300}, {"max_tokens": 300}]
        assert [r.get("output_cap") for r in recs] == [
            {"limit": 300, "asked": {"max_tokens": None}}, {"limit": 300, "asked": {"max_completion_tokens": 50_000}},
            None, {"limit": 300, "asked": {"max_tokens": None}}, {"limit": 300, "asked": {"max_output_tokens": None}},
            {"limit": 300, "asked": {"max_tokens": 20_000}}]
        assert recs[5]["request"]["parameters"]["max_tokens"] == 20_000  # the record keeps what the client sent
    else:
        assert limits == [{}, {"max_completion_tokens": 50_000}, {"max_tokens": 10}, {}, {}, {"max_tokens": 20_000}]
        assert not any("output_cap" in r for r in recs)


def test_output_cap_on_a_translated_call_and_off_at_zero(tmp_path):
    """Translated to chat completions (proxy.translate), the chat request the embedded model gets is capped;
    embedded_max_tokens = 0 sends every call as the client asked."""
    for cap, want in ((300, 300), (0, None)):
        settings = make_settings(proxy={"embedded_max_tokens": cap, "translate": "both"})
        with ChatUpstream() as up, running_proxy(settings, up.base_url, str(tmp_path / f"rec{cap}"),
                                                 embedded_models=EMBEDDED) as url:
            an = anthropic.Anthropic(base_url=f"{url}/s/cap", api_key="x", max_retries=0)
            an.messages.create(model="claude-x", max_tokens=20_000, messages=[{"role": "user", "content": "hi"}])
            openai.OpenAI(base_url=f"{url}/s/cap/v1", api_key="x", max_retries=0).responses.create(
                model="m", input="hi")
            sent = [b.get("max_tokens") for b in up.chat_requests()]
            recs = _records(ProxyLayout(tmp_path / f"rec{cap}"), 2)
        assert sent == ([want, want] if cap else [20_000, None])
        assert [r["translation"]["request"].get("max_tokens") for r in recs] == sent
