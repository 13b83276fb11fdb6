"""PPO prompt data: verl's parquet fields, the held-out split, ground truth, and loading by datasets / TRL."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from evolforge.storage.ppo import PPOLayout, read_evolved, write_prompt_parquet
from evolforge.tasks.ppo.data import build_prompt_rows
from evolforge.tasks.problems.split import split_lineages
from evolforge.tasks.problems.truth import ground_truth_of
from evolforge.testing.ppo_models import (
    minilm_dir,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    write_evolved,
)

VERL_FIELDS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


@pytest.fixture
def data(tmp_path):
    records = read_evolved(write_evolved(tmp_path / "run" / "dataset" / "evolved.parquet", n_seeds=6))
    train, test, counts = build_prompt_rows(records, test_fraction=0.3, split_seed=7,
                                            unverified_ground_truth="own_answer")  # the evolve answers as ground truth
    lay = PPOLayout(tmp_path / "ppo").ensure()
    write_prompt_parquet(train, lay.train)
    write_prompt_parquet(test, lay.test)
    return train, test, counts, lay


def test_verl_fields_and_values(data):
    train, test, counts, lay = data
    assert counts["train"] + counts["test"] == 6 * 2 + 1  # seeds + evolutions + the general one
    assert counts["dropped"] == {"status": 1, "empty": 0, "duplicate": 1}
    table = pq.read_table(lay.train)
    assert table.column_names == VERL_FIELDS
    for row in train + test:
        assert row["data_source"] == f"evolforge/{row['ability']}" and row["ability"] in ("math", "general")
        assert [m["role"] for m in row["prompt"]] == ["user"]
        info = row["extra_info"]
        assert info["question"] in row["prompt"][0]["content"] and "Step 1:" in row["prompt"][0]["content"]
        assert set(info) >= {"split", "index", "question", "answer", "lineage"}
        assert set(info["lineage"]) == {"id", "parent_id", "seed_id", "round", "operation", "direction",
                                        "irm_score", "irm_rank", "irm_selected"}  # IRM fields: null, no selection
        assert info["lineage"]["irm_score"] is None
        assert "Eliminated" not in info["question"]
    for split, rows in (("train", train), ("test", test)):
        assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
        assert {r["extra_info"]["split"] for r in rows} == {split}
    evolved = [r for r in train + test if r["extra_info"]["lineage"]["operation"] == "add_constraints"]
    assert evolved and all(r["reward_model"]["style"] == "rule" for r in evolved)
    for r in evolved:  # "Tom has a apples, buys b more and gives away 1" -> a + b - 1
        nums = [int(w.strip(",")) for w in r["extra_info"]["question"].split() if w.strip(",").isdigit()]
        assert r["reward_model"]["ground_truth"] == str(nums[0] + nums[1] - 1)
    seeds_and_general = [r for r in train + test if r["extra_info"]["lineage"]["operation"] != "add_constraints"]
    assert all(r["reward_model"] == {"style": "model", "ground_truth": ""} for r in seeds_and_general)


def test_held_out_split_keeps_lineages_apart(data):
    train, test, counts, _ = data
    train_seeds = {r["extra_info"]["lineage"]["seed_id"] for r in train}
    test_seeds = {r["extra_info"]["lineage"]["seed_id"] for r in test}
    assert test_seeds and train_seeds and not (train_seeds & test_seeds)
    assert counts["test_lineages"] == len(test_seeds)
    # deterministic, and never empty on either side
    assert split_lineages([f"s{i}" for i in range(6)], 0.3, 7) == test_seeds
    assert len(split_lineages(["a", "b"], 0.0001, 1)) == 1
    assert len(split_lineages(["a", "b"], 0.9999, 1)) == 1
    assert split_lineages(["only"], 0.5, 1) <= {"only"}


def test_ground_truth_only_from_math_answers():
    assert ground_truth_of("Step 1: 6 * 7 = 42.\nThe answer is: 42", "math") == "42"
    assert ground_truth_of("The answer is: $1,234.", "math") == "1,234"
    assert ground_truth_of("Step 1: no final line", "math") == ""
    assert ground_truth_of("The answer is: 42", "general") == ""
    assert ground_truth_of(None, "math") == ""


def test_loadable_by_datasets_and_usable_by_grpo_trainer(data):
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from trl.data_utils import apply_chat_template, is_conversational

    _, test, _, lay = data
    ds = load_dataset("parquet", data_files={"train": str(lay.train), "test": str(lay.test)})
    assert ds["train"].num_rows > 0 and ds["test"].num_rows == len(test)
    assert ds["train"].column_names == VERL_FIELDS
    row = ds["train"][0]
    assert is_conversational(row)  # GRPOTrainer treats the prompt column as chat messages
    assert isinstance(row["reward_model"], dict) and isinstance(row["extra_info"]["lineage"], dict)
    tok = AutoTokenizer.from_pretrained(minilm_dir())
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"
    rendered = apply_chat_template({"prompt": row["prompt"]}, tok)
    assert rendered["prompt"].startswith("<user>Answer the following instruction") and row["extra_info"]["question"] in rendered["prompt"]


def test_training_prompts_overlapping_an_evaluation_set_are_dropped_and_reported(tmp_path):
    """ppo.decontaminate: a training prompt sharing an 8-gram with HumanEval (or a held-out task) is dropped by
    default and counted per table; 'report' counts it and keeps it."""
    from evolforge.config.settings import Settings
    from evolforge.storage.ppo import read_json, read_prompt_rows
    from evolforge.tasks.ppo import job
    from evolforge.tasks.problems.benchmarks import humaneval_problems

    path = write_evolved(tmp_path / "evolved.parquet", n_seeds=8)
    table = pq.read_table(path).to_pylist()
    train0, _, _ = build_prompt_rows(table, Settings().ppo.test_fraction, Settings().ppo.split_seed)
    seed = train0[0]["extra_info"]["lineage"]["seed_id"]  # a training lineage: the leak is in the train split
    leak = dict(next(r for r in table if r["seed_id"] == seed and r["status"] == "accepted"), id="leak",
                instruction="Please solve: " + humaneval_problems()[2].text)
    pq.write_table(pq.read_table(path).from_pylist(table + [leak], schema=pq.read_table(path).schema), path)
    settings = Settings()
    lay = PPOLayout(tmp_path / "ppo").ensure()
    counts = job.prompt_data(path, lay, settings.ppo, None, settings.eval)
    rep = counts["decontamination"]["evolved"]
    rows = read_prompt_rows(lay.train)
    assert rep["overlapping"] == 1 == rep["dropped"] and counts["decontamination"]["synthesis"]["checked"] == 0
    assert all("leak" != r["extra_info"]["lineage"]["id"] for r in rows)
    assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
    assert read_json(lay.decontamination) == counts["decontamination"] and counts["train"] == len(rows)
    assert rep["examples"][0] == {"row": "leak", "eval_set": "humaneval", "eval_item": "HumanEval/2"}
    kept = job.prompt_data(path, PPOLayout(tmp_path / "ppo2").ensure(),
                           settings.ppo.model_copy(update={"decontaminate": "report"}), None, settings.eval)
    assert kept["train"] == counts["train"] + 1 and kept["decontamination"]["evolved"]["dropped"] == 0
