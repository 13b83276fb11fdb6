"""Long agent sessions train: a Claude Code-shaped (Messages API) and a Codex-shaped (Responses API) session,
recorded through the proxy against the scripted upstream, exported, and fine-tuned one step on the tiny policy with
sft.max_length far below a row's length. Each assistant turn becomes one row whose prompt is shortened from the
left (old turns dropped, then old texts cut) and whose completion is whole; the counts are reported.

Before: every row was longer than max_length, the trainer cut each from the right (losing the completion), and
TRL's trainer was left with no row to train on."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from evolforge.storage.proxy_sets import ProxyLayout, iter_records
from evolforge.storage.sft_sets import SFTFolder, chat_messages, read_rows
from evolforge.tasks.proxy.server import running_proxy
from evolforge.tasks.sft import job, train
from evolforge.tasks.sft.fit import fit_turn
from evolforge.tasks.sft.stage import SFTParams
from evolforge.tasks.trajectories.export import collect, dedup_prompts, publish
from evolforge.testing import agent_apis
from evolforge.testing.agent_upstream import AgentUpstream
from evolforge.testing.ppo_models import one_torch_thread  # noqa: F401 (autouse fixture)
from evolforge.testing.settings import make_settings
from evolforge.testing.tiny_policy import build_tiny_policy

SYSTEM = "You are an agent for software engineering. " * 150  # ~1,000 words, as Claude Code's is many thousand
LONG_OUTPUT = "\n".join(f"line {i}: build step finished without warnings" for i in range(400)) + \
    f"\n{agent_apis.CLI_MARKER}"
BASH = {"name": "Bash", "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                                                          "description": {"type": "string"}},
                         "required": ["command"]}}
SHELL = {"type": "function", "name": "shell_command", "description": "Run a shell command",
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def _words(prompt, completion, tools) -> int:
    return sum(len(str(m.get("content") or "").split()) + 2 for m in prompt + completion) + \
        len(json.dumps(tools).split()) * bool(tools)


def test_fit_turn_drops_old_turns_first_then_cuts_old_text_and_never_the_completion():
    prompt = [{"role": "system", "content": "sys " * 20}] + \
        [{"role": r, "content": f"{r} {i} " + "w " * 30} for i, r in enumerate(["user", "assistant"] * 5)] + \
        [{"role": "user", "content": "the last question"}]
    completion = [{"role": "assistant", "content": "the answer " * 10}]
    assert _words(prompt, completion, None) > 300
    f = fit_turn(prompt, completion, None, _words, 120)
    assert f.prompt[0] == prompt[0] and f.prompt[-1] == prompt[-1] and f.tokens <= 120 and f.cut_chars == 0
    # 22 system + 22 completion + 5 last + 34 a turn: two old turns fit in 120; the fewest (8) are dropped, whole
    assert f.dropped_messages == 8 and f.prompt[1:] == prompt[9:]
    cut = fit_turn(prompt, completion, None, _words, 40)  # even system + last message pass 40: the system is cut
    assert cut.tokens <= 40 and cut.cut_chars > 0 and cut.prompt[-1] == prompt[-1]
    assert cut.prompt[0]["content"].startswith("sys") and "characters cut" in cut.prompt[0]["content"]
    assert fit_turn(prompt, completion, None, _words, 10).prompt is None  # the completion alone is 22 words
    assert fit_turn(prompt, completion, None, _words, 10_000).prompt is prompt


def _claude_code_session(url: str) -> None:
    """Claude Code's shape: system blocks, the Bash tool, a command run, its long output, the answer (streamed)."""
    body = {"model": "claude-test", "max_tokens": 256, "system": [{"type": "text", "text": SYSTEM}], "tools": [BASH],
            "messages": [{"role": "user", "content": agent_apis.CLI_PROMPT}]}
    first = httpx.post(f"{url}/s/cc/v1/messages", json=body, timeout=10).json()
    use = next(b for b in first["content"] if b["type"] == "tool_use")
    body["messages"] += [{"role": "assistant", "content": first["content"]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                       "content": LONG_OUTPUT}]}]
    with httpx.Client(timeout=10) as c, c.stream("POST", f"{url}/s/cc/v1/messages",
                                                 json={**body, "stream": True}) as r:
        assert b"message_stop" in b"".join(r.iter_raw())


def _codex_session(url: str) -> None:
    """Codex's shape: instructions, a function tool, its call, the long output, the answer."""
    body = {"model": "resp-model", "instructions": "You are Codex. " + SYSTEM, "tools": [SHELL],
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                      "text": agent_apis.CLI_PROMPT}]}]}
    first = httpx.post(f"{url}/s/codex/v1/responses", json=body, timeout=10).json()
    call = first["output"][0]
    body["input"] += [call, {"type": "function_call_output", "call_id": call["call_id"], "output": LONG_OUTPUT}]
    assert httpx.post(f"{url}/s/codex/v1/responses", json=body, timeout=10).status_code == 200


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("long")
    rec, traj = root / "rec", root / "traj"
    with AgentUpstream() as up, running_proxy(make_settings(), up.base_url, str(rec)) as url:
        _claude_code_session(url)
        _codex_session(url)
        with httpx.Client(base_url=url, timeout=10) as h:
            for s in ("cc", "codex"):
                assert h.post(f"/s/{s}/reward", json={"reward": 1.0}).status_code == 200
                assert h.post(f"/s/{s}/finish").status_code == 200
        deadline = time.time() + 10
        while len(list(iter_records(ProxyLayout(rec)))) < 4 and time.time() < deadline:
            time.sleep(0.05)
    collect(str(rec), str(traj), idle_seconds=3600)
    dedup_prompts(str(traj), make_settings().dedup, enabled=False)
    publish(str(traj), tokens=False)
    return root, traj


def _length(tok, messages) -> int:
    return len(tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"])


@pytest.mark.long("records two agent sessions, exports them and trains the tiny policy one step: ~12 s CPU measured")
def test_recorded_long_sessions_train_one_step_with_every_completion_whole(exported):
    root, traj = exported
    tiny = build_tiny_policy(root / "tiny")
    params = SFTParams(trajectories=str(traj), out=str(root / "sft"), base_model=str(tiny), max_steps=1,
                       overrides={"sft": {"batch_size": 2, "save_steps": 1, "max_length": 256}})
    settings = params.settings()
    folder = SFTFolder(params.out).ensure()
    job.prepare(params, settings, folder)
    rows = read_rows(folder.train)
    assert sorted(r["id"].split("#")[0] for r in rows) == ["cc", "cc", "codex", "codex"]  # two turns a session

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    full = train.sft_dataset(rows, tok)
    longest = max(_length(tok, ex["prompt"] + ex["completion"]) for ex in full)
    assert longest > 1000  # every session's rows are far past max_length = 256
    fitted: dict = {}
    data = train.sft_dataset(rows, tok, 256, fitted)
    assert fitted["trajectory_rows_shortened"] == 4 and fitted["trajectory_rows_too_long"] == 0
    for ex, whole in zip(data, full):
        assert ex["completion"] == whole["completion"]  # never cut
        assert ex["prompt"][-1] == whole["prompt"][-1] or "characters cut" in ex["prompt"][-1]["content"]
        assert _length(tok, ex["prompt"] + ex["completion"]) <= 256

    result = train.train(folder, tiny, settings.sft)
    assert result["steps"] == 1 and result["rows_cut_by_max_length"] == 0
    assert result["trajectory_rows_shortened"] == 4 and result["max_length"] == 256
    answers = {chat_messages(r["completion"])[0]["content"] for r in rows}
    assert f"The command printed {agent_apis.CLI_MARKER}." in answers


def test_a_turn_that_cannot_fit_is_counted_and_no_row_at_all_is_an_error_naming_the_lengths(exported):
    root, traj = exported
    tiny = build_tiny_policy(root / "tiny2")
    params = SFTParams(trajectories=str(traj), out=str(root / "sft2"), base_model=str(tiny), max_steps=1,
                       overrides={"sft": {"max_length": 16}})
    folder = SFTFolder(params.out).ensure()
    job.prepare(params, params.settings(), folder)
    with pytest.raises(ValueError, match=r"no row fits sft.max_length = 16 tokens: all 4 trajectory turns"):
        train.train(folder, tiny, params.settings().sft)
