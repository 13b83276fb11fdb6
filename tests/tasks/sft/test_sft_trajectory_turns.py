"""SFT on recorded trajectories (tasks/sft/data.py trajectory_rows, tasks/sft/train.py sft_dataset): a successful
conversation (reward, enough assistant turns) gives one prompt-completion row per assistant turn; with real TRL
tokenising them for a tiny Llama (the MiniLM tokenizer, and SmolLM2's own tokenizer and chat template, which has no
{% generation %} tags), the system, user and tool tokens carry no loss and every assistant turn's tokens do, tool
calls included."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from evolforge.config.settings import Settings
from evolforge.storage.sft_sets import read_rows, write_rows
from evolforge.tasks.sft import train
from evolforge.tasks.sft.data import build
from evolforge.tasks.text.chat import tool_call_text
from evolforge.tasks.trajectories.tokens import load_tokenizer
from evolforge.testing.ppo_models import one_torch_thread  # noqa: F401 (autouse fixture)
from evolforge.testing.tiny_policy import build_tiny_policy


@pytest.fixture
def torch():
    """torch, imported by the tests that use it: at module level it cost every test worker ~4 s of CPU at
    collection."""
    import torch

    return torch

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALLS = [{"id": f"call_{i}", "type": "function",
          "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
         for i, city in enumerate(("Paris", "Oslo"))]
MESSAGES = [
    {"role": "system", "content": "You are walrus the trip planner."},
    {"role": "user", "content": "zebra asks: CALL_TOOLS for Paris and Oslo"},
    {"role": "assistant", "content": "", "tool_calls": CALLS},
    {"role": "tool", "tool_call_id": "call_0", "content": "quokka says sunny"},
    {"role": "tool", "tool_call_id": "call_1", "content": "quokka says cold"},
    {"role": "assistant", "content": "Alpha: sunny in Paris and cold in Oslo."},
    {"role": "user", "content": "zebra again: anything to pack?"},
    {"role": "assistant", "content": "Bravo: an umbrella and a warm coat."},
]
PROMPT_ONLY = ("walrus", "zebra", "quokka")  # a word of each system, user and tool turn
TURNS = {2: "\n".join(tool_call_text(c) for c in CALLS), 5: MESSAGES[5]["content"], 7: MESSAGES[7]["content"]}


def _conv(cid: str, messages: list[dict], reward: float | None = 1.0, tools=TOOLS) -> dict:
    return {"conversation_id": cid, "session": cid.split("#")[0], "reward": reward, "messages": messages,
            "tools": json.dumps(tools) if tools else None, "agent_role": None}


def _cfg(**kw):
    return Settings().sft.model_copy(update={"decontaminate": "off", **kw})


def test_every_assistant_turn_of_a_selected_conversation_is_one_row():
    convs = [_conv("trip#0", MESSAGES),
             _conv("short#0", [{"role": "user", "content": "zebra asks: CALL_TOOLS for Rome"}, MESSAGES[2],
                               {"role": "assistant", "content": ""}]),  # 1 turn (and an empty one)
             _conv("failed#0", MESSAGES, reward=0.2), _conv("unrated#0", MESSAGES, reward=None),
             _conv("silent#0", [{"role": "user", "content": "hello?"}, {"role": "assistant", "content": ""}])]
    built = build([], [], convs, set(), _cfg(trajectory_min_turns=2), None)
    rows = {r["id"]: r for r in built.rows}
    assert set(rows) == {"trip#0/2", "trip#0/5", "trip#0/7"}
    for i, row in ((int(k.split("/")[1]), r) for k, r in rows.items()):
        assert [m["role"] for m in row["prompt"]] == [m["role"] for m in MESSAGES[:i]]  # everything before the turn
        assert [m["content"] for m in row["prompt"]] == [m["content"] for m in MESSAGES[:i]]
        assert len(row["completion"]) == 1 and row["completion"][0]["role"] == "assistant"
        assert row["source"] == "trajectory" and row["domain"] == "agent" and json.loads(row["tools"]) == TOOLS
    assert json.loads(rows["trip#0/2"]["completion"][0]["tool_calls"]) == CALLS  # the OpenAI form, kept
    assert json.loads(rows["trip#0/5"]["prompt"][2]["tool_calls"]) == CALLS
    assert [m["tool_call_id"] for m in rows["trip#0/5"]["prompt"][3:5]] == ["call_0", "call_1"]
    reasons = {s["id"]: s["reason"] for s in built.skipped}
    assert reasons == {"short#0": "too few assistant turns: 1 < 2 (sft.trajectory_min_turns)",
                       "failed#0": "not successful: reward 0.2 < 1.0", "unrated#0": "not successful: no reward",
                       "silent#0": "no assistant turn to learn"}
    # by default (one turn is enough) the short conversation gives its one turn, the empty turn none
    default = {r["id"] for r in build([], [], convs, set(), _cfg(), None).rows}
    assert default == {"trip#0/2", "trip#0/5", "trip#0/7", "short#0/1"}


def test_hand_made_lines_of_odd_shapes_are_skipped_or_kept_never_a_crash():
    convs = [{"conversation_id": "words#0", "reward": "high", "messages": MESSAGES},
             {"conversation_id": "flag#0", "reward": True, "messages": MESSAGES},
             {"conversation_id": "text#0", "reward": 1.0, "messages": "not a list"},
             {"conversation_id": "odd#0", "reward": 1, "tools": "{not json", "messages": [
                 "a string", {"role": "user", "content": [{"type": "text", "text": "zebra?"}, 7]},
                 {"role": "assistant", "content": None, "tool_calls": ["x", {"function": {"name": "ls"}}]},
                 {"role": "tool", "tool_call_id": 5, "content": "quokka"},
                 {"role": "assistant", "content": "Echo."}]}]
    built = build([], [], convs, set(), _cfg(), None)
    reasons = {s["id"]: s["reason"] for s in built.skipped}
    assert reasons == {"words#0": "not successful: reward 'high' is not a number",
                       "flag#0": "not successful: reward 'True' is not a number",
                       "text#0": "no assistant turn to learn"}
    rows = {r["id"]: r for r in built.rows}
    assert set(rows) == {"odd#0/1", "odd#0/3"} and rows["odd#0/1"]["tools"] is None
    assert json.loads(rows["odd#0/1"]["completion"][0]["tool_calls"]) == [
        {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]
    assert rows["odd#0/3"]["prompt"][2]["tool_call_id"] == "5"


def test_rows_round_trip_through_train_parquet(tmp_path):
    rows = build([], [], [_conv("trip#0", MESSAGES)], set(), _cfg(), None).rows
    write_rows(rows, tmp_path / "train.parquet")
    back = {r["id"]: r for r in read_rows(tmp_path / "train.parquet")}
    assert back == {r["id"]: r for r in rows}


def test_a_branch_sharing_turns_is_not_trained_twice(torch):
    branch = MESSAGES[:6] + [{"role": "user", "content": "zebra: and tomorrow?"},
                             {"role": "assistant", "content": "Charlie: rain tomorrow."}]
    built = build([], [], [_conv("trip#0", MESSAGES), _conv("trip#1", branch)], set(), _cfg(), None)
    assert sorted(r["id"] for r in built.rows) == ["trip#0/2", "trip#0/5", "trip#0/7", "trip#1/7"]
    assert sorted(s["id"] for s in built.skipped if s["reason"] == "repeated prompt") == ["trip#1/2", "trip#1/5"]


# ---------------------------------------------------------------- the loss, tokenised by real TRL
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "policy")


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """A 1-layer Llama with SmolLM2's own tokenizer and chat template (the embedded model's GGUF)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok, _ = load_tokenizer(None)
    dest = tmp_path_factory.mktemp("smol") / "policy"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id or tok.eos_token_id,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest


def _labelled(policy: Path, rows: list[dict], tmp_path, chat_template: str | None = None) -> list[dict]:
    """Every row as TRL's SFTTrainer tokenises and collates it: the ids, the labels, the ids of its prompt."""
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(policy)
    if chat_template:
        tok.chat_template = chat_template
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    trainer = SFTTrainer(model=str(policy), processing_class=tok, train_dataset=train.sft_dataset(rows, tok),
                         args=SFTConfig(output_dir=str(tmp_path / "t"), use_cpu=True, report_to="none",
                                        max_length=2048, completion_only_loss=True))
    out = []
    for ex in trainer.train_dataset:
        batch = trainer.data_collator([ex])
        tools = json.loads(ex["tools"]) if ex["tools"] else None
        prompt_text = tok.apply_chat_template(ex["prompt"], tools=tools, tokenize=False, add_generation_prompt=True)
        out.append({"ids": batch["input_ids"][0], "labels": batch["labels"][0], "completion": ex["completion"],
                    "prompt_ids": tok(prompt_text, add_special_tokens=False)["input_ids"], "tok": tok})
    assert len(out) == len(rows)  # none dropped
    return out


def _check_loss(examples: list[dict]) -> list[str]:
    """The prompt carries no loss, every completion token does; returns each row's trained text."""
    trained = []
    for ex in examples:
        labels, ids, n = ex["labels"], ex["ids"], len(ex["prompt_ids"])
        assert ids[:n].tolist() == ex["prompt_ids"]  # the prompt as the chat template renders it
        assert (labels[:n] == -100).all(), "a prompt token carries loss"
        assert (labels[n:] == ids[n:]).all() and len(ids) > n, "a completion token carries no loss"
        text = ex["tok"].decode(ids[labels != -100])
        assert not any(w in text.lower() for w in PROMPT_ONLY), text
        trained.append(text)
    return trained


@pytest.mark.long("the real SmolLM2 chat template and tokenizer: ~9.4 s CPU measured, at the budget")
def test_smollm2_template_prompt_tokens_carry_no_loss_and_every_assistant_turn_does(smol, tmp_path):
    rows = build([], [], [_conv("trip#0", MESSAGES)], set(), _cfg(), None).rows
    trained = _check_loss(_labelled(smol, rows, tmp_path))
    # SmolLM2 renders no tool_calls: the calls are the turn's text, exactly what the loss covers, with <|im_end|>
    assert sorted(trained) == sorted(f"{t}<|im_end|>\n" for t in TURNS.values())
    assert any('{"name": "get_weather", "arguments": {"city": "Oslo"}}' in t for t in trained)


def test_tiny_policy_prompt_tokens_carry_no_loss_and_every_assistant_turn_does(tiny, tmp_path):
    rows = build([], [], [_conv("trip#0", MESSAGES)], set(), _cfg(), None).rows
    examples = _labelled(tiny, rows, tmp_path)
    trained = _check_loss(examples)
    tok = examples[0]["tok"]
    assert sorted(tok(t, add_special_tokens=False)["input_ids"] for t in trained) == \
        sorted(tok(t, add_special_tokens=False)["input_ids"] for t in TURNS.values())
    # the tool schemas reach the prompt (the template renders none: a # Tools block in the system turn)
    assert all("get _ weather" in tok.decode(ex["prompt_ids"]) for ex in examples)


def test_a_tool_aware_template_gets_native_tool_calls_of_any_argument_shape(smol, tmp_path):
    """Qwen2.5's template renders tool_calls itself: the arguments reach it as objects, each call with its own keys
    (arrow would have merged {city} and {path} into one struct, adding "path": null to the weather call)."""
    import trl.chat_template_utils as ctu

    qwen = (Path(ctu.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    read = [{"id": "call_9", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}]
    other = [{"role": "user", "content": "zebra: show a.txt"}, {"role": "assistant", "content": "", "tool_calls": read},
             {"role": "tool", "tool_call_id": "call_9", "content": "quokka text"},
             {"role": "assistant", "content": "Delta: it says text."}]
    rows = build([], [], [_conv("trip#0", MESSAGES), _conv("file#0", other, tools=None)], set(), _cfg(), None).rows
    examples = _labelled(smol, rows, tmp_path, chat_template=qwen)
    trained = _check_loss(examples)
    calls = [t for t in trained if "<tool_call>" in t]
    assert sorted(calls) == sorted([
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n',
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call><|im_end|>\n'])
    assert any("<tools>" in ex["tok"].decode(ex["prompt_ids"]) for ex in examples)  # the schemas, natively


def test_the_dataset_keeps_every_message_shape(tiny):
    from transformers import AutoTokenizer

    rows = build([], [], [_conv("trip#0", MESSAGES)], set(), _cfg(), None).rows
    ds = train.sft_dataset(rows, AutoTokenizer.from_pretrained(tiny))
    first = next(r for r in ds if r["completion"][0]["content"].startswith("<tool_call>"))
    assert first["prompt"][0]["content"].startswith("You are walrus") and "# Tools" in first["prompt"][0]["content"]
    assert all(set(m) <= {"role", "content", "tool_call_id"} for m in first["prompt"])  # no null-filled keys
    assert copy.deepcopy(first["completion"]) == [{"role": "assistant", "content": TURNS[2]}]
