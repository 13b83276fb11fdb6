"""Set-up that works the first time (issue 40): the output cap for the embedded model (proxy.embedded_max_tokens),
checked on what the scripted upstream received; the start banner's base URLs and token header, used as printed
by the real openai and anthropic SDKs against `evolforge proxy` in front of a scripted upstream; `--translate`;
`--check` on the embedded model priced free."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
import typing

import httpx
import pytest

from evolforge.config.sections.proxy import ProxySettings
from evolforge.storage.ledger import read_ledger
from evolforge.storage.proxy_sets import ProxyLayout
from evolforge.tasks.proxy.banner import banner
from evolforge.tasks.proxy.server import running_proxy
from evolforge.tasks.proxy.state import output_capped
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.chat_upstream import ChatUpstream
from evolforge.testing.lazy import lazy_module
from evolforge.testing.net import free_port
from evolforge.testing.proxy_records import wait_for_records
from evolforge.testing.settings import make_settings

anthropic = lazy_module("anthropic")
openai = lazy_module("openai")

EMBEDDED = {"smollm2-135m-instruct"}  # what the CLI passes when the upstream is the embedded model


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch):
    for name in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "EVOLFORGE_PROXY_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def _records(layout: ProxyLayout, n: int, timeout: float = 5.0) -> list[dict]:
    return wait_for_records(layout, n, timeout, poll=0.02)


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
        assert limits == [{"max_tokens": 300}, {"max_tokens": 300, "max_completion_tokens": 300}, {"max_tokens": 10},
                          {"max_tokens": 300}, {"max_output_tokens": 300}, {"max_tokens": 300}]
        assert [r.get("output_cap") for r in recs] == [
            {"limit": 300, "asked": {"max_tokens": None}},
            {"limit": 300, "asked": {"max_completion_tokens": 50_000, "max_tokens": None}},
            None, {"limit": 300, "asked": {"max_tokens": None}}, {"limit": 300, "asked": {"max_output_tokens": None}},
            {"limit": 300, "asked": {"max_tokens": 20_000}}]
        assert recs[5]["request"]["parameters"]["max_tokens"] == 20_000  # the record keeps what the client sent
    else:
        assert limits == [{}, {"max_completion_tokens": 50_000}, {"max_tokens": 10}, {}, {}, {"max_tokens": 20_000}]
        assert not any("output_cap" in r for r in recs)


def test_output_capped_edge_cases():
    chat = "chat/completions"
    assert output_capped({"max_tokens": 10, "max_completion_tokens": 50_000}, chat, 300) == (
        {"max_tokens": 10, "max_completion_tokens": 300}, {"max_completion_tokens": 50_000})
    assert output_capped({"max_tokens": -1}, chat, 300) == ({"max_tokens": 300}, {"max_tokens": -1})
    assert output_capped({"max_tokens": True}, "messages", 300) == ({"max_tokens": 300}, {"max_tokens": True})
    assert output_capped({"max_tokens": 300}, chat, 300) is None
    assert output_capped({}, chat, 0) is None and output_capped({}, "embeddings", 300) is None


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


# ------------------------------------------------------------------ the start banner, used as printed

TOKEN = "proxy-token-SECRET-4242"


def _start_proxy(upstream_url: str, out, port: int, env: dict) -> tuple[subprocess.Popen, str]:
    """`evolforge proxy` in its own process; its banner (stdout up to the anthropic SDK's line)."""
    proc = subprocess.Popen([sys.executable, "-m", "evolforge.cli", "proxy", "--upstream", upstream_url,
                             "--port", str(port), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "anthropic SDK:" in line:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=60)  # a banner without the SDK lines fails the test instead of hanging it
    deadline = time.time() + 60
    while time.time() < deadline:  # the banner comes just before the port is bound
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code in (200, 401):
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    return proc, "".join(lines)


def _printed(banner: str, client: str) -> str:
    """The Python expression the banner prints for `client` ("openai SDK", "anthropic SDK")."""
    (line,) = [ln for ln in banner.splitlines() if ln.strip().startswith(f"{client}:")]
    return line.split(":", 1)[1].strip()


@pytest.mark.long("the proxy command in a fresh process, three SDK calls through it: ~4 s CPU")
def test_banner_base_urls_work_as_printed_with_the_real_sdks(tmp_path, monkeypatch):
    """The banner's openai and anthropic SDK lines, run as printed (SESSION replaced by a name), reach the
    scripted upstream through `evolforge proxy` and are recorded under that session; the token goes in its header
    and the banner names its variable, never its value. Claude Code's settings are the proxy root and the
    session header; Codex's config is TOML with the OpenAI base URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update(EVOLFORGE_PROXY_TOKEN=TOKEN)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-client")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-client")
    monkeypatch.setenv("EVOLFORGE_PROXY_TOKEN", TOKEN)
    with AgentUpstream() as up:
        proc, banner = _start_proxy(up.base_url, tmp_path / "rec", port, env)
        try:
            assert TOKEN not in banner
            ns = {"OpenAI": openai.OpenAI, "Anthropic": anthropic.Anthropic, "os": os}
            oa = eval(_printed(banner, "openai SDK").replace("SESSION", "sdk-openai"), ns)  # noqa: S307
            an = eval(_printed(banner, "anthropic SDK").replace("SESSION", "sdk-anthropic"), ns)  # noqa: S307
            oa.chat.completions.create(model="agent-model", messages=[{"role": "user", "content": "hi"}])
            oa.responses.create(model="agent-model", input="hi")
            an.messages.create(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
            recs = _records(ProxyLayout(tmp_path / "rec"), 3)
            # without the token header, the same base URL is refused: the banner's header is what lets calls in
            bare = openai.OpenAI(base_url=str(oa.base_url), api_key="sk-client", max_retries=0)
            with pytest.raises(openai.AuthenticationError):
                bare.chat.completions.create(model="agent-model", messages=[{"role": "user", "content": "hi"}])
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert [(r["session"], r["route"], r["status"]) for r in recs] == [
        ("sdk-openai", "chat.completions", 200), ("sdk-openai", "responses", 200), ("sdk-anthropic", "messages", 200)]
    assert [r["path"].split("?")[0] for r in up.received if r["body"]] == \
        ["/v1/chat/completions", "/v1/responses", "/v1/messages"]
    root = f"http://127.0.0.1:{port}"
    claude = [ln.strip() for ln in banner.split("  Claude Code")[1].split("  openai SDK")[0].splitlines()]
    assert f"export ANTHROPIC_BASE_URL={root}" in claude  # the root: no /v1, no /s/SESSION/v1
    assert 'export ANTHROPIC_CUSTOM_HEADERS="X-Evolforge-Session: SESSION"$\'\\n\'"X-Evolforge-Proxy-Token: ' \
        '$EVOLFORGE_PROXY_TOKEN"' in claude
    codex = banner.split("config.toml:\n")[1].split("  Claude Code")[0]
    conf = tomllib.loads(textwrap.dedent(codex))
    provider = conf["model_providers"][conf["model_provider"]]
    assert provider["base_url"] == f"{root}/s/SESSION/v1" and provider["wire_api"] == "responses"
    assert provider["env_http_headers"] == {"X-Evolforge-Proxy-Token": "EVOLFORGE_PROXY_TOKEN"}


def test_claude_code_headers_reach_the_proxy_as_claude_code_sends_them(tmp_path):
    """ANTHROPIC_CUSTOM_HEADERS as the banner prints it, expanded by bash and split as Claude Code splits it
    (lines of "Name: value"), names the session and carries the token; the root base URL then gets the call in."""
    text = banner(make_settings(), "http://up/v1", "runs/proxy", token_set=True, embedded=False)
    line = next(ln.strip() for ln in text.splitlines() if "ANTHROPIC_CUSTOM_HEADERS=" in ln)
    expanded = subprocess.run(["bash", "-c", f"{line.replace('SESSION', 'cc-1')}; printf %s "
                               "\"$ANTHROPIC_CUSTOM_HEADERS\""], env={"EVOLFORGE_PROXY_TOKEN": TOKEN, "PATH":
                              os.environ["PATH"]}, capture_output=True, text=True, check=True).stdout
    headers = dict(h.split(":", 1) for h in expanded.split("\n"))
    headers = {k.strip(): v.strip() for k, v in headers.items()}
    assert headers == {"X-Evolforge-Session": "cc-1", "X-Evolforge-Proxy-Token": TOKEN}
    settings = make_settings()
    with AgentUpstream() as up, running_proxy(settings, up.base_url, str(tmp_path / "rec")) as url:
        an = anthropic.Anthropic(base_url=url, api_key="x", default_headers=headers, max_retries=0)
        an.messages.create(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
        (rec,) = _records(ProxyLayout(tmp_path / "rec"), 1)
    assert rec["session"] == "cc-1" and rec["route"] == "messages" and rec["status"] == 200


def test_banner_without_token_and_on_the_embedded_model():
    s = make_settings(proxy={"embedded_max_tokens": 512}, embedded={"n_ctx": 8192})
    text = banner(s, "http://127.0.0.1:5555/v1", "runs/agent", token_set=False, embedded=True)
    assert "Token" not in text and "env_http_headers" not in text
    assert 'export ANTHROPIC_CUSTOM_HEADERS="X-Evolforge-Session: SESSION"\n' in text
    assert 'OpenAI(base_url="http://127.0.0.1:8787/s/SESSION/v1")' in text
    assert f'model = "{s.embedded.alias}"' in text
    assert "a context of 8192 tokens" in text and "capped at 512 tokens" in text and "free (cost 0" in text
    assert "EVOLFORGE__EMBEDDED__STALL_SECONDS=0" in text  # the watchdog killed the server on Codex's first prompt
    quiet = make_settings(embedded={"stall_seconds": 0})
    assert "watchdog" not in banner(quiet, "u", "o", False, True)
    bound_to_all = s.model_copy(update={"proxy": s.proxy.model_copy(update={"host": "0.0.0.0"})})
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:8787\n" in banner(bound_to_all, "u", "o", False, False)


# ------------------------------------------------------------------ --translate


def test_translate_flag_lists_the_settings_values_and_refuses_others_in_one_line(tmp_path):
    allowed = typing.get_args(ProxySettings.model_fields["translate"].annotation)
    help_text = subprocess.run([sys.executable, "-m", "evolforge.cli", "proxy", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    assert "--translate" in help_text
    flat = " ".join(help_text.split())
    assert all(v in flat for v in allowed), (allowed, flat)
    bad = subprocess.run([sys.executable, "-m", "evolforge.cli", "proxy", "--translate", "chat", "--upstream",
                          "http://127.0.0.1:9/v1", "--port", str(free_port()), "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "--translate" in bad.stderr
    assert all(repr(v) in bad.stderr for v in allowed)
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------ --check on the embedded model


def test_check_on_the_embedded_model_says_it_is_free(tmp_path, monkeypatch, capsys):
    """`evolforge proxy --check` with no upstream (the embedded model; here the scripted upstream stands in for
    its server, answering in the alias's name as the server does) prices the call at 0 as the embedded model,
    says so, and its ledger row says so too; not as an unknown model."""
    import contextlib

    from evolforge.cli import main
    from evolforge.tasks.core import embedded_model

    with AgentUpstream() as up:
        monkeypatch.setattr(embedded_model, "embedded_server", lambda cfg: contextlib.nullcontext(up.base_url))
        monkeypatch.delenv("EVOLFORGE__PROXY__UPSTREAM", raising=False)
        code = main(["proxy", "--check", "--out", str(tmp_path / "chk")])
        (body,) = [r["body"] for r in up.received if r["body"]]
    out = capsys.readouterr().out
    assert code == 0 and "cost $0: embedded model (free)" in out, out
    assert body["model"] == make_settings().embedded.alias
    led = read_ledger(tmp_path / "chk")
    assert led["cost_usd"].to_list() == [0.0] and led["price_source"].to_list() == ["embedded model (free)"]


@pytest.mark.slow
@pytest.mark.embedded
def test_the_embedded_llama_server_stops_at_the_cap(tmp_path):
    """The real embedded server behind the proxy, as `evolforge proxy` starts it: a chat call and a translated
    Responses call (Codex's kind) that set no output limit end at proxy.embedded_max_tokens; the ledger prices
    them free."""
    from evolforge.tasks.core import llama_server
    from evolforge.tasks.core.embedded_model import embedded_server

    settings = make_settings(embedded={"server": "llama-server"},
                             proxy={"translate": "responses", "embedded_max_tokens": 8})
    if not llama_server.find_binary(settings.embedded):
        pytest.skip("llama-server is not built here: evolforge serve-model --build")
    alias = settings.embedded.alias
    story = "Write a very long story about a dragon, at least five hundred words."
    with embedded_server(settings.embedded, tmp_path) as up, \
            running_proxy(settings, up, str(tmp_path / "rec"), {alias}) as url:
        oai = openai.OpenAI(base_url=f"{url}/s/cap-real/v1", api_key="x", max_retries=0)
        chat = oai.chat.completions.create(model=alias, messages=[{"role": "user", "content": story}],
                                           temperature=0)
        resp = oai.responses.create(model=alias, input=story, temperature=0)
        recs = _records(ProxyLayout(tmp_path / "rec"), 2, timeout=30)
    assert chat.usage.completion_tokens <= 8 and chat.choices[0].finish_reason == "length"
    assert resp.usage.output_tokens <= 8 and resp.status == "incomplete"
    assert [r["output_cap"]["limit"] for r in recs] == [8, 8]
    led = read_ledger(tmp_path / "rec")
    assert led["cost_usd"].to_list() == [0.0, 0.0]
