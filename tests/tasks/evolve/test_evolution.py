"""Evol-Instruct pieces without Prefect: operation choice, cleaning, elimination rules, seed import."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from evolforge.storage.datasets import SeedFileError, import_seeds
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.evolve import elimination as rules
from evolforge.tasks.evolve import prompts
from evolforge.tasks.evolve.evolution import choose_operation, clean_evolved, evolve_record, rewrite_chars
from evolforge.testing.settings import make_settings


def test_operation_choice_follows_ratios_and_is_reproducible():
    cfg = make_settings().evol_instruct
    ops = [choose_operation(cfg, f"rec-{i}", "general", 1) for i in range(4000)]
    dirs = Counter(prompts.DIRECTION[o] for o in ops)
    assert abs(dirs["down"] / 4000 - 0.3) < 0.03
    assert abs(dirs["breadth"] / 4000 - 0.7 / 6) < 0.03
    assert ops == [choose_operation(cfg, f"rec-{i}", "general", 1) for i in range(4000)]
    assert ops != [choose_operation(cfg, f"rec-{i}", "general", 2) for i in range(4000)]
    code_ops = {choose_operation(cfg, f"c-{i}", "code", 1) for i in range(500)}
    assert code_ops & set(prompts.CODE_OPERATIONS) and not code_ops & set(prompts.UP_OPERATIONS)


def test_all_up_or_all_down():
    up = make_settings(evol_instruct={"evolve_up_ratio": 1.0, "evolve_down_ratio": 0.0}).evol_instruct
    assert all(prompts.DIRECTION[choose_operation(up, str(i), "math", 1)] in ("up", "breadth") for i in range(300))
    down = make_settings(evol_instruct={"evolve_up_ratio": 0.0, "evolve_down_ratio": 1.0}).evol_instruct
    assert all(prompts.DIRECTION[choose_operation(down, str(i), "math", 1)] == "down" for i in range(300))


@pytest.mark.parametrize("raw,clean", [
    ("#Rewritten Prompt#: Compute the sum.", "Compute the sum."),
    ('"Compute the sum of 3 numbers."', "Compute the sum of 3 numbers."),
    ("Created Prompt:\nWrite a haiku.", "Write a haiku."),
    ("Explain the given prompt rules.", "Explain the given prompt rules."),  # rule 4 must still see it
    # the reply's JSON (issue 37): whole, fenced, cut inside the string, or with another key
    ('{"instruction": "Write a haiku about rain."}', "Write a haiku about rain."),
    ('```json\n{"instruction": "Write a haiku."}\n```', "Write a haiku."),
    ('{"instruction": "Write a haiku about \\"rain\\" and', 'Write a haiku about "rain" and'),
    ('{"new_task": "Write a haiku."}', "Write a haiku."),
    # an announcing first line, trailing talk about the task, a brace left after the JSON string
    ("Here's a possible rewording of the task:\n\n\"Suggest a meal plan for a week.\"", "Suggest a meal plan for a week."),
    ("Write a function that sorts a list.\n\nReply with the new task only.\n\nHere's how you can implement it:",
     "Write a function that sorts a list."),
    ("What is 7 x 8?\nCreate the new task.", "What is 7 x 8?"),
    ("What is 7 x 8?\n\nYou can ask a question in the following format", "What is 7 x 8?"),
    ("Convert 'IV' to an integer.\n\nQuestion:", "Convert 'IV' to an integer."),
    ("Ask how many days Lena needs?}", "Ask how many days Lena needs?"),
    # kept: a task that introduces its input, input/output lines, a first line that is the task itself
    ("Sort this list:\n[3, 1, 2]", "Sort this list:\n[3, 1, 2]"),
    ("Write add(a, b).\nInput: 2, 3\nOutput: 5", "Write add(a, b).\nInput: 2, 3\nOutput: 5"),
    ("Write a new version of this function that handles the following task:\nx = 1",
     "Write a new version of this function that handles the following task:\nx = 1"),
    ("Reply with the new task only.", "Reply with the new task only."),  # only talk: left for rule 4
])
def test_clean_evolved(raw, clean):
    assert clean_evolved(raw) == clean


@pytest.mark.parametrize(("raw", "clean"), [
    ("Write a poem about rain. Use the sound of the drops to convey it. Choose a setting that is not too", 
     "Write a poem about rain. Use the sound of the drops to convey it."),
    ("Consider a meal plan that includes lentils, and a no", "Consider a meal plan that includes lentils, and a no"),
    ("What is 2 + 3?", "What is 2 + 3?"),
])
def test_a_cut_reply_ends_at_its_last_whole_sentence(raw, clean):
    assert clean_evolved(raw, cut=True) == clean


def test_the_rewrite_call_asks_for_one_field_sized_to_its_budget(server):
    gw, cfg = _gw(server, answer=False, equal_check=False)
    row = {"id": "s-1", "seed_id": "s-1", "instruction": "Name a colour.", "domain": "general", "generation": 0}
    server.script('text:{"instruction": "Name a colour of the rainbow and a fruit of that colour."}')
    evo = evolve_record(row, 1, gw, cfg)
    fmt = server.posts()[0]["response_format"]["json_schema"]
    assert fmt["name"] == "Rewrite" and list(fmt["schema"]["properties"]) == [prompts.REPLY_FIELD]
    assert evo.instruction == "Name a colour of the rainbow and a fruit of that colour." and evo.status == "accepted"
    assert rewrite_chars(128) == 336 and rewrite_chars(1024) > 3000


def test_elimination_rules():
    assert rules.instruction_rule("Rewrite the given prompt in French") == rules.RULE_COPY
    assert rules.instruction_rule("#Rewritten Prompt# add a table") == rules.RULE_COPY
    assert rules.instruction_rule("  ") == rules.RULE_EMPTY
    assert rules.instruction_rule("Compute 3 + 4 and explain each step.") is None
    assert rules.answer_rule("I'm sorry, I can't help with that.") == rules.RULE_SORRY
    assert rules.answer_rule("Sorry " + "word " * 90) is None  # long answers may apologise
    assert rules.answer_rule("... , the and of ?!") == rules.RULE_PUNCT
    assert rules.answer_rule("Step 1: 3 + 4 = 7. The answer is 7.") is None


@pytest.mark.parametrize("text,verdict", [("Equal", "equal"), ("Not Equal", "not_equal"), ("not equal.", "not_equal"),
                                          ("They are equal.", "equal"), ("Hmm, banana", None), ("NOT EQUAL", "not_equal")])
def test_equal_verdict_parsing(text, verdict):
    assert rules.parse_equal_verdict(text) == verdict


def _gw(server, **evol):
    s = make_settings(server.base_url, gateway={"backoff_base_seconds": 0.0}, evol_instruct=evol)
    return Gateway(s, base_url=server.base_url, run_id="t"), s.evol_instruct


def test_evolve_record_accepts_and_keeps_lineage(server):
    gw, cfg = _gw(server)
    row = {"id": "s-1", "seed_id": "s-1", "instruction": "What is 2 + 3?", "domain": "math", "generation": 0}
    evo = evolve_record(row, 1, gw, cfg)
    assert evo.status == "accepted" and evo.parent_id == "s-1" and evo.seed_id == "s-1" and evo.round == 1
    assert evo.operation in prompts.DIRECTION and evo.direction == prompts.DIRECTION[evo.operation]
    assert evo.answer.startswith("Step 1:") and evo.judge_verdict == "not_equal" and evo.calls == 3
    assert evo.generation == 1 and evo.instruction != row["instruction"]


@pytest.mark.parametrize("script,rule,calls", [
    (["text:Rewritten prompt: the given prompt but longer"], rules.RULE_COPY, 1),
    (["ok", "text:Sorry, I cannot do that."], rules.RULE_SORRY, 2),
    (["ok", "text:... the, of!"], rules.RULE_PUNCT, 2),
    (["ok", "ok", "text:Equal"], rules.RULE_EQUAL, 3),
])
def test_evolve_record_elimination(server, script, rule, calls):
    server.script(*script)
    gw, cfg = _gw(server)
    row = {"id": "s-1", "seed_id": "s-1", "instruction": "What is 2 + 3?", "domain": "math", "generation": 0}
    evo = evolve_record(row, 1, gw, cfg)
    assert evo.status == "eliminated" and evo.elimination_rule == rule and evo.calls == calls
    assert len(server.posts()) == calls  # cheap rules run before further calls are spent


def test_unparseable_verdict_policy(server):
    row = {"id": "s-1", "seed_id": "s-1", "instruction": "What is 2 + 3?", "domain": "math", "generation": 0}
    server.script("ok", "ok", "text:banana")
    gw, cfg = _gw(server)
    assert evolve_record(row, 1, gw, cfg).status == "accepted"
    server.script("ok", "ok", "text:banana")
    gw, cfg = _gw(server, unparseable_verdict="eliminate")
    evo = evolve_record(row, 1, gw, cfg)
    assert evo.status == "eliminated" and evo.judge_verdict == "unparseable"


def test_equal_check_can_be_switched_off(server):
    gw, cfg = _gw(server, equal_check=False, answer=False)
    row = {"id": "s-1", "seed_id": "s-1", "instruction": "Name a colour.", "domain": "general", "generation": 0}
    evo = evolve_record(row, 1, gw, cfg)
    assert evo.calls == 1 and evo.answer is None and evo.judge_verdict is None


def test_seed_import_rejects_bad_rows_and_keeps_going(tmp_path):
    src = tmp_path / "seeds.jsonl"
    src.write_text("\n".join([
        json.dumps({"instruction": "Add 2 and 3."}),
        "{not json",
        json.dumps({"prompt": "wrong field"}),
        json.dumps({"instruction": "   "}),
        json.dumps({"instruction": "add 2  and 3."}),  # duplicate after normalisation
        json.dumps([1, 2]),
        json.dumps({"id": "x", "instruction": "Write a Python function that reverses a list."}),
        json.dumps({"id": "x", "instruction": "Another one with the same id."}),
    ]) + "\n")
    dest, rej = tmp_path / "pool.parquet", tmp_path / "rejects.jsonl"
    counts = import_seeds(src, dest, rej, batch_size=1)
    assert counts == {"seeds": 2, "rejected": 6}
    table = pq.read_table(dest)
    assert table.column("domain").to_pylist() == ["general", "code"]
    assert pq.ParquetFile(dest).num_row_groups == 2  # one row group per batch
    reasons = [json.loads(l)["reason"] for l in rej.read_text().splitlines()]
    assert any("not valid JSON" in r for r in reasons) and any("duplicate id" in r for r in reasons)
    assert any("duplicate instruction" in r for r in reasons) and any("expected a JSON object" in r for r in reasons)


def test_seed_import_csv_parquet_and_errors(tmp_path):
    csv_path = tmp_path / "s.csv"
    csv_path.write_text("question,id\n\"How many legs do 3 cats have?\",q1\n,q2\n")
    counts = import_seeds(csv_path, tmp_path / "p.parquet", tmp_path / "r.jsonl", instruction_field="question")
    assert counts == {"seeds": 1, "rejected": 1}
    pq.write_table(pq.read_table(tmp_path / "p.parquet").rename_columns(
        ["id", "seed_id", "text", "domain", "generation"]), tmp_path / "in.parquet")
    assert import_seeds(tmp_path / "in.parquet", tmp_path / "p2.parquet", tmp_path / "r2.jsonl",
                        instruction_field="text")["seeds"] == 1
    with pytest.raises(SeedFileError, match="instruction_field"):
        import_seeds(csv_path, tmp_path / "p3.parquet", tmp_path / "r3.jsonl")
    with pytest.raises(SeedFileError, match="unsupported"):
        (tmp_path / "s.txt").write_text("x")
        import_seeds(tmp_path / "s.txt", tmp_path / "p4.parquet", tmp_path / "r4.jsonl")
