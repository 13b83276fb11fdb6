"""The SFT rows (tasks/sft/data.py): step form only, held-out lineages and evaluation overlaps left out (with the
reason), verified code solutions and successful trajectories in, TRL's prompt-completion form."""

from __future__ import annotations

from evolforge.config.settings import Settings
from evolforge.storage.sft_sets import chat_messages
from evolforge.tasks.problems.benchmarks import eval_index, humaneval_problems
from evolforge.tasks.sft.data import build
from evolforge.tasks.text.ngrams import NgramIndex, check_table, ngrams

STEPS = "Step 1: 3 + 4 = 7.\nStep 2: 7 - 1 = 6.\nThe answer is: 6"


def _view(i, answer, seed=None, instruction=None):
    return {"id": f"r{i}", "seed_id": seed or f"s{i}", "round": 1, "domain": "math",
            "messages": [{"role": "user", "content": instruction or f"Question number {i}: how many apples?"},
                         {"role": "assistant", "content": answer}]}


def _cfg(**kw):
    return Settings().sft.model_copy(update=kw)


def test_only_step_form_answers_are_kept_and_the_prompt_asks_for_steps():
    view = [_view(0, STEPS), _view(1, "Six."), _view(2, "Step 1: only one step")]
    built = build(view, [], [], set(), _cfg(decontaminate="off"), None)
    assert [r["id"] for r in built.rows] == ["r0"]
    row = built.rows[0]
    assert "Step 1: ..." in row["prompt"][0]["content"] and "Question number 0" in row["prompt"][0]["content"]
    assert row["completion"][0]["content"] == STEPS and row["completion"][0]["role"] == "assistant"
    reasons = {s["id"]: s["reason"] for s in built.skipped}
    assert reasons["r1"].startswith("not step form") and reasons["r2"].startswith("not step form: only 1 step")
    # without the requirement, every answer is kept
    assert len(build(view, [], [], set(), _cfg(require_steps=False, decontaminate="off"), None).rows) == 3


def test_held_out_lineages_are_never_trained_on():
    view = [_view(0, STEPS, seed="keep"), _view(1, STEPS, seed="held")]
    tasks = [{"task_id": "t1", "seed_id": "held", "kind": "code", "statement": "Write f.", "entry_point": "f",
              "solution": "def f():\n    return 1", "tests": "from solution import f\ndef test_f():\n    assert f() == 1"}]
    built = build(view, tasks, [], {"held"}, _cfg(decontaminate="off"), None)
    assert [r["seed_id"] for r in built.rows] == ["keep"]
    assert sorted(s["id"] for s in built.skipped if s["reason"].startswith("held-out")) == ["r1", "t1"]


def test_code_solutions_and_successful_trajectories_are_kept_math_tasks_are_not_made_up():
    tasks = [{"task_id": "c1", "seed_id": "s1", "kind": "code", "statement": "Write add(a, b).", "entry_point": "add",
              "solution": "def add(a, b):\n    return a + b", "tests": "x"},
             {"task_id": "m1", "seed_id": "s2", "kind": "math", "statement": "2+2?", "answer": "4"}]
    convs = [{"conversation_id": "ok#0", "reward": 1.0, "messages": [
                 {"role": "system", "content": "You are helpful."}, {"role": "user", "content": "list files"},
                 {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "type": "function", "function": {
                     "name": "ls", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "1", "content": "a.txt"},
                 {"role": "assistant", "content": "There is a.txt."}]},
             {"conversation_id": "img#0", "reward": 1.0, "messages": [  # TRL multimodal parts (a Messages API turn)
                 {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                              {"type": "image", "image": "data:image/png;base64,AAAA"}]},
                 {"role": "assistant", "content": "A pixel."}]},
             {"conversation_id": "bad#0", "reward": 0.0, "messages": [{"role": "user", "content": "x"},
                                                                    {"role": "assistant", "content": "y"}]},
             {"conversation_id": "none#0", "reward": None, "messages": [{"role": "user", "content": "x"},
                                                                       {"role": "assistant", "content": "z"}]}]
    built = build([], tasks, convs, set(), _cfg(decontaminate="off"), None)
    by_id = {r["id"]: r for r in built.rows}
    assert set(by_id) == {"c1", "ok#0/2", "ok#0/4", "img#0/1"}  # a trajectory row per assistant turn
    assert by_id["img#0/1"]["prompt"][0]["content"] == "what is this?"  # a text policy: the image is left out
    assert by_id["c1"]["completion"][0]["content"] == "```python\ndef add(a, b):\n    return a + b\n```"
    traj = by_id["ok#0/4"]
    assert traj["completion"][0]["content"] == "There is a.txt." and len(traj["prompt"]) == 4
    decoded = chat_messages(traj["prompt"])
    assert decoded[2]["tool_calls"][0]["function"]["name"] == "ls" and decoded[3]["tool_call_id"] == "1"
    assert chat_messages(by_id["ok#0/2"]["completion"])[0]["tool_calls"][0]["function"]["name"] == "ls"
    reasons = {s["id"]: s["reason"] for s in built.skipped}
    assert reasons["m1"].startswith("no stored worked solution")
    assert reasons["bad#0"].startswith("not successful") and reasons["none#0"] == "not successful: no reward"


def test_rows_overlapping_an_evaluation_set_are_dropped_and_reported_per_table():
    he = humaneval_problems()[0]  # has_close_elements
    leaked = _view(1, STEPS, instruction="Solve this: " + he.text)
    view = [_view(0, STEPS), leaked]
    index = eval_index(Settings().eval)
    built = build(view, [], [], set(), _cfg(), index)
    assert [r["id"] for r in built.rows] == ["r0"]
    rep = built.decontamination["evolved"]
    assert rep["checked"] == 2 and rep["overlapping"] == 1 and rep["dropped"] == 1
    assert rep["by_eval_set"] == {"humaneval": 1} and rep["examples"][0]["eval_item"] == he.id
    # report only: counted, kept
    kept = build(view, [], [], set(), _cfg(decontaminate="report"), index)
    assert len(kept.rows) == 2 and kept.decontamination["evolved"]["overlapping"] == 1
    assert kept.decontamination["evolved"]["dropped"] == 0


def test_ngram_overlap_is_word_level_and_needs_n_words():
    index = NgramIndex(n=4)
    index.add("set", "a", "The quick brown fox jumps over the lazy dog")
    assert index.matches("see: THE quick, brown -- fox!! ran") == {("set", "a")}  # case and punctuation do not hide it
    assert index.matches("quick brown fox") == set()  # 3 words: no 4-gram
    assert index.matches("the quick brown cat jumps over") == set()
    assert ngrams("one two three", 4) == set()
    flags, report = check_table("t", [{"id": 1, "t": "over the lazy dog"}, {"id": 2, "t": "nothing here at all"}],
                                lambda r: r["t"], index)
    assert flags == [True, False] and report["overlapping"] == 1
