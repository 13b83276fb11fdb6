"""One export shape whatever the API: tool schemas in chat completions' function form (what TRL and chat templates
take), and a system turn inside a Messages conversation (Claude Code sends them) kept as a system turn."""

from __future__ import annotations

import json

from evolforge.tasks.trajectories.samples import function_tool, tools_json
from evolforge.tasks.trajectories.wire_messages import messages_prompt

PARAMS = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
CHAT = {"type": "function", "function": {"name": "Bash", "description": "Run a command", "parameters": PARAMS}}


def test_each_apis_tool_schema_becomes_the_chat_function_form():
    responses = {"type": "function", "name": "Bash", "description": "Run a command", "parameters": PARAMS}
    anthropic = {"name": "Bash", "description": "Run a command", "input_schema": PARAMS}
    assert function_tool(CHAT) == function_tool(responses) == function_tool(anthropic) == CHAT
    assert json.loads(tools_json([responses, anthropic])) == [CHAT, CHAT]


def test_custom_and_built_in_tools_get_a_function_form_too():
    patch = {"type": "custom", "name": "apply_patch", "description": "Patch files",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
    fn = function_tool(patch)["function"]
    assert fn["name"] == "apply_patch" and fn["parameters"]["required"] == ["input"] and "lark" in \
        fn["parameters"]["properties"]["input"]["description"]
    assert function_tool({"type": "local_shell"}) == {"type": "function", "function": {
        "name": "local_shell", "parameters": {"type": "object", "properties": {}}}}
    assert function_tool({"type": "web_search_20250305", "name": "web_search", "max_uses": 5})["function"]["name"] \
        == "web_search"
    assert tools_json([1, "x", {}]) is None and tools_json(None) is None


def test_a_mid_conversation_system_turn_of_a_messages_call_stays_a_system_turn():
    request = {"system": [{"type": "text", "text": "You are Claude Code."}], "messages": [
        {"role": "user", "content": "fix the build"},
        {"role": "assistant", "content": [{"type": "text", "text": "On it."}]},
        {"role": "system", "content": "The user changed the working directory to /src."},
        {"role": "user", "content": "go on"}]}
    msgs, _ = messages_prompt(request)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "system", "user"]
    assert msgs[3]["content"] == "The user changed the working directory to /src."
