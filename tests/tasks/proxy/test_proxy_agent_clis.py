"""The real agent CLIs through the recording proxy (slow; skipped, saying why, without node or without the CLIs
in the npm cache folder or on PATH, see testing/agent_clis.py): Codex (`codex exec`, a custom model provider with wire_api "responses") and Claude Code
(`claude -p`, ANTHROPIC_BASE_URL at the proxy) each run a small task (run a shell command, report its output)
against the scripted upstreams: passed through to one that speaks their API (testing/agent_apis.py), and
translated for one that speaks only chat completions (testing/chat_upstream.py, proxy.translate). The session
is recorded and exported (the trajectories stage's steps); its turns and tool calls are checked against what the
CLI sent and received."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from evolforge.storage.proxy_sets import ProxyLayout
from evolforge.storage.trajectory_sets import TrajectoryLayout
from evolforge.tasks.proxy.banner import SESSION_HEADER, TOKEN_HEADER
from evolforge.tasks.proxy.server import running_proxy
from evolforge.tasks.trajectories.export import collect, dedup_prompts, publish
from evolforge.testing import agent_clis
from evolforge.testing.agent_apis import CLI_COMMAND, CLI_MARKER, CLI_PROMPT
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.chat_upstream import ChatUpstream
from evolforge.testing.proxy_records import wait_for_records
from evolforge.testing.settings import make_settings

pytestmark = pytest.mark.slow
ANSWER = f"The command printed {CLI_MARKER}."


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch):
    for name in ("EVOLFORGE_API_KEY", "OPENAI_API_KEY", "EVOLFORGE_PROXY_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def _needs(name: str) -> None:
    why = agent_clis.missing(name)
    if why:
        pytest.skip(why)


def _records(layout: ProxyLayout, n: int, timeout: float = 10.0) -> list[dict]:
    return wait_for_records(layout, n, timeout, poll=0.05)


def _session(tmp_path: Path, cli: str, translated: bool, token: str | None = None) -> dict:
    """Run the CLI's task through the proxy, finish the session, export it; what each side saw. With `token`, the
    proxy requires it and the CLI is set up as the start banner says (tasks/proxy/banner.py): Codex sends it by
    env_http_headers, Claude Code (at the proxy's root) sends it and the session in ANTHROPIC_CUSTOM_HEADERS."""
    settings = make_settings(proxy={"translate": "both" if translated else "off"})
    work = tmp_path / "work"
    work.mkdir(parents=True)
    rec = tmp_path / "rec"
    session = f"{cli}-task"
    with (ChatUpstream() if translated else AgentUpstream()) as up, \
            running_proxy(settings, up.base_url, str(rec)) as url:
        if cli == "codex" and token:
            proc = agent_clis.codex_exec(f"{url}/s/{session}/v1", work, tmp_path / "home", CLI_PROMPT,
                                         env_headers={TOKEN_HEADER: "EVOLFORGE_PROXY_TOKEN"},
                                         env={"EVOLFORGE_PROXY_TOKEN": token})
        elif cli == "codex":
            proc = agent_clis.codex_exec(f"{url}/s/{session}/v1", work, tmp_path / "home", CLI_PROMPT)
        elif token:
            proc = agent_clis.claude_print(url, work, tmp_path / "home", CLI_PROMPT,
                                           headers={SESSION_HEADER: session, TOKEN_HEADER: token})
        else:
            proc = agent_clis.claude_print(f"{url}/s/{session}", work, tmp_path / "home", CLI_PROMPT)
        with httpx.Client(base_url=url, timeout=10, headers={TOKEN_HEADER: token} if token else {}) as h:
            h.post(f"/s/{session}/reward", json={"reward": 1.0})
            h.post(f"/s/{session}/finish")
        recs = [r for r in _records(ProxyLayout(rec), 2) if r["route"] in ("responses", "messages")]
        received = [r for r in up.received if r["body"] is not None]
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    out = tmp_path / "out"
    collect(str(rec), str(out), idle_seconds=300)
    dedup_prompts(str(out), settings.dedup, enabled=False)
    summary = publish(str(out), tokens=False)
    sft = [json.loads(line) for line in Path(TrajectoryLayout(out).sft).read_text().splitlines()]
    return {"proc": proc, "records": recs, "received": received, "sent": list(up.sent), "sft": sft,
            "summary": summary, "session": session}


def _tool_turns(messages: list[dict]) -> tuple[dict, dict, dict]:
    """The exported assistant turn with the tool call, the tool turn, the final assistant turn."""
    i = next(i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("tool_calls"))
    return messages[i], messages[i + 1], messages[-1]


def _check_export(s: dict, tool: str, args: dict) -> tuple[dict, dict, dict]:
    (conv,) = [c for c in s["sft"] if c["session"] == s["session"]]
    assert conv["calls"] == 2 and conv["reward"] == 1.0
    call_turn, tool_turn, final = _tool_turns(conv["messages"])
    (call,) = call_turn["tool_calls"]
    assert call["function"]["name"] == tool and json.loads(call["function"]["arguments"]) == args
    assert tool_turn["role"] == "tool" and tool_turn["tool_call_id"] == call["id"]
    assert CLI_MARKER in tool_turn["content"]  # the CLI really ran the command and sent its output back
    assert final == {"role": "assistant", "content": ANSWER}
    assert CLI_PROMPT in json.dumps(conv["messages"][:conv["messages"].index(call_turn)])
    assert ANSWER in s["proc"].stdout
    return call, tool_turn, final


# ------------------------------------------------------------------ Codex: the Responses API


def _codex_output(body: dict) -> str:
    out = [i for i in body["input"] if i.get("type") == "function_call_output"][-1]["output"]
    return out if isinstance(out, str) else json.dumps(out)


def test_codex_and_claude_code_set_up_as_the_banner_says_with_a_proxy_token(tmp_path, monkeypatch):
    """The start banner's set-up with an access token: Codex at /s/SESSION/v1 sending the token by
    env_http_headers; Claude Code at the proxy's root (no /v1) with the session and the token in
    ANTHROPIC_CUSTOM_HEADERS. Each session is recorded under its name and exported."""
    _needs("codex")
    _needs("claude")
    monkeypatch.setenv("EVOLFORGE_PROXY_TOKEN", "proxy-token-cli-77")
    for cli in ("codex", "claude"):
        s = _session(tmp_path / cli, cli, translated=False, token="proxy-token-cli-77")
        assert s["proc"].returncode == 0 and ANSWER in s["proc"].stdout
        assert [r["session"] for r in s["records"]][-2:] == [s["session"]] * 2
        assert all(r["status"] == 200 for r in s["records"])
        _check_export(s, "exec_command" if cli == "codex" else "Bash",
                      {"cmd": CLI_COMMAND} if cli == "codex" else
                      {"command": CLI_COMMAND, "description": "Print the marker"})


@pytest.mark.parametrize("translated", [False, True], ids=["responses-upstream", "chat-upstream"])
def test_codex_exec_through_the_proxy_is_recorded_and_exported(tmp_path, translated):
    _needs("codex")
    s = _session(tmp_path, "codex", translated)
    first, second = s["records"]
    assert [r["route"] for r in s["records"]] == ["responses", "responses"] and all(r["stream"] for r in s["records"])
    assert all(r["status"] == 200 and r["error"] is None for r in s["records"])
    call, tool_turn, _ = _check_export(s, "exec_command", {"cmd": CLI_COMMAND})
    # what Codex sent: its second request carries the call it received and the command's output
    sent_items = second["request"]["input"]
    (fc,) = [i for i in sent_items if i.get("type") == "function_call"]
    assert fc["call_id"] == call["id"] and fc["arguments"] == call["function"]["arguments"]
    assert tool_turn["content"] == _codex_output(second["request"])
    assert first["response"]["tool_calls"] == [call] and second["response"]["content"] == ANSWER
    if translated:
        assert [r["path"] for r in s["received"]] == ["/v1/chat/completions"] * 2
        chat = second["translation"]["request"]["messages"]
        assert chat[-1] == {"role": "tool", "tool_call_id": call["id"], "content": tool_turn["content"]}
        assert chat[-2]["tool_calls"] == [{**call, "type": "function"}]
        assert all(r["translation"]["status"] == 200 for r in s["records"])
        assert "tool namespace" in first["translation"]["dropped"]  # Codex's sub-agent tools have no chat form
    else:
        assert [json.dumps(r["body"]["input"]) for r in s["received"]] == \
            [json.dumps(r["request"]["input"]) for r in s["records"]]  # forwarded unchanged, recorded as sent
        done = [json.loads(line[6:]) for line in s["sent"][0].decode().splitlines() if line.startswith("data: ")]
        output = [e for e in done if e["type"] == "response.completed"][0]["response"]["output"]
        assert [(o["call_id"], o["name"], o["arguments"]) for o in output if o["type"] == "function_call"] == \
            [(call["id"], call["function"]["name"], call["function"]["arguments"])]


# ------------------------------------------------------------------ Claude Code: the Messages API


@pytest.mark.parametrize("translated", [False, True], ids=["messages-upstream", "chat-upstream"])
def test_claude_code_print_through_the_proxy_is_recorded_and_exported(tmp_path, translated):
    _needs("claude")
    s = _session(tmp_path, "claude", translated)
    first, second = s["records"][-2:]  # Claude Code may make side calls first (none with non-essential traffic off)
    assert all(r["route"] == "messages" and r["status"] == 200 and r["error"] is None for r in s["records"])
    call, tool_turn, _ = _check_export(s, "Bash", {"command": CLI_COMMAND, "description": "Print the marker"})
    sent = second["request"]["messages"]
    (use,) = [b for m in sent if m["role"] == "assistant" for b in m["content"] if b.get("type") == "tool_use"]
    assert use["id"] == call["id"] and use["input"] == json.loads(call["function"]["arguments"])
    (result,) = [b for m in sent if m["role"] == "user" and isinstance(m["content"], list)
                 for b in m["content"] if b.get("type") == "tool_result"]
    assert result["tool_use_id"] == call["id"]
    text = result["content"] if isinstance(result["content"], str) else \
        "".join(b.get("text", "") for b in result["content"])
    assert text == tool_turn["content"] and CLI_MARKER in text
    assert second["response"]["content"] == ANSWER
    if translated:
        assert {r["path"] for r in s["received"]} == {"/v1/chat/completions"}
        chat = second["translation"]["request"]["messages"]
        assert {"role": "tool", "tool_call_id": call["id"], "content": text} in chat
    else:
        assert all(r["path"] == "/v1/messages?beta=true" for r in s["received"])
        assert s["received"][-1]["body"]["messages"] == sent  # forwarded unchanged, recorded as sent
