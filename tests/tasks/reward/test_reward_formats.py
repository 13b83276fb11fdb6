"""The written reward sets, read back with `datasets` and polars, field by field against the trainers' forms.

- IRM pairs (data/train-00000-of-00001.parquet): TRL RewardTrainer (explicit prompt): prompt, chosen, rejected (str), margin (float).
- prm_steps.parquet: TRL stepwise supervision: prompt (str), completions (list[str]), labels (list[bool]),
  plus raw_scores / scores (list[float]) beside the labels.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from evolforge.storage import reward_sets as store
from evolforge.tasks.reward.irm import pairs_from_group
from evolforge.tasks.reward.scoring import default_base_model, prm_features, separator_id
from evolforge.testing.lazy import lazy_module
from evolforge.testing.settings import make_settings

datasets = lazy_module("datasets")  # imported by the tests that load a dataset, not at collection

SETTINGS = make_settings()
PROMPT = SETTINGS.reward.irm_prompt


def groups() -> list[dict]:
    base = {"status": "ranked", "reason": None, "judge_scores": None, "judge_model": "j", "calls": 4}
    return [
        {**base, "id": "g1", "versions": ["Add 2 and 3.", "Add 2 and 3 and show each step.", "Add 2, 3 and 9 in a table."],
         "sources": ["original", "m:add_constraints", "m:complicate_input"], "ranking": [1, 2, 0]},
        {**base, "id": "g2", "versions": ["Name a colour.", "Name a warm colour and say why it feels warm."],
         "sources": ["original", "m:deepening"], "ranking": [1, 0], "judge_scores": [4.0, 8.0]},
        {**base, "id": "g3", "status": "ranking_invalid", "reason": "not a permutation", "versions": ["x"],
         "sources": ["original"], "ranking": None},
    ]


def step_rows() -> list[dict]:
    ok = {"status": "ok", "reason": None, "method": "judge", "reasked": False, "calls": 1}
    return [
        {**ok, "id": "a1", "prompt": "What is 2+3?", "completions": ["Add 2 and 3.", "The answer is: 5"],
         "labels": [True, True], "raw_scores": [1.0, 1.0], "scores": [1.0, 1.0]},
        {**ok, "id": "a2", "prompt": "What is 4*5?", "completions": ["4*5 = 9.", "So 9.", "The answer is: 9"],
         "labels": [False, False, False], "raw_scores": [-2.0, 0.0, -1.0], "scores": [0.4, 0.5, 0.45],
         "method": "decorl", "reasked": True},
        {**ok, "id": "a3", "status": "rejected", "reason": "not in step form", "prompt": "Hi", "completions": None,
         "labels": None, "raw_scores": None, "scores": None},
    ]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    layout = store.RewardLayout(tmp_path_factory.mktemp("sets")).ensure()
    pairs = [p for g in groups() for p in pairs_from_group(g, PROMPT)]
    store.write_irm_sets(pa.Table.from_pylist(groups(), schema=store.GROUP_SCHEMA), pairs, layout)
    store.write_prm_sets(pa.Table.from_pylist(step_rows(), schema=store.STEP_ROW_SCHEMA), layout)
    return layout


def test_irm_pairs_in_reward_trainer_form(written):
    ds = datasets.load_dataset("parquet", data_files=str(written.irm_pairs), split="train")
    assert ds.features["prompt"] == datasets.Value("string") and ds.features["chosen"] == datasets.Value("string")
    assert ds.features["rejected"] == datasets.Value("string") and ds.features["margin"] == datasets.Value("float64")
    assert len(ds) == 3 + 1  # 3 versions -> 3 pairs, 2 versions -> 1 pair, the invalid ranking -> none
    for r in ds:
        assert r["prompt"] == PROMPT and r["chosen"] != r["rejected"] and 0 < r["margin"] <= 1
        assert r["chosen_rank"] < r["rejected_rank"] <= r["group_size"]
    df = pl.read_parquet(written.irm_pairs)
    assert df.schema["prompt"] == pl.String and df.schema["margin"] == pl.Float64
    assert df.filter(pl.col("instruction_id") == "g1")["chosen"].to_list() == [
        "Add 2 and 3 and show each step.", "Add 2 and 3 and show each step.", "Add 2, 3 and 9 in a table."]
    assert df.null_count().sum_horizontal().item() == 0


def test_prm_steps_in_stepwise_supervision_form(written):
    ds = datasets.load_dataset("parquet", data_files=str(written.prm_steps), split="train")
    assert ds.features["prompt"] == datasets.Value("string")
    assert ds.features["completions"] == datasets.List(datasets.Value("string")) and ds.features["labels"] == datasets.List(datasets.Value("bool"))
    assert ds.features["raw_scores"] == datasets.List(datasets.Value("float64")) and ds.features["scores"] == datasets.List(datasets.Value("float64"))
    assert ds["id"] == ["a1", "a2"]  # the rejected answer is not in the training set
    for r in ds:
        assert len(r["completions"]) == len(r["labels"]) == len(r["scores"]) == len(r["raw_scores"]) >= 2
        assert all(isinstance(v, bool) for v in r["labels"]) and all(0 <= s <= 1 for s in r["scores"])
    df = pl.read_parquet(written.prm_steps)
    assert df.schema["completions"] == pl.List(pl.String) and df.schema["labels"] == pl.List(pl.Boolean)
    assert df["raw_scores"].to_list()[1] == [-2.0, 0.0, -1.0]
    rejected = pl.read_parquet(written.prm_rejected)
    assert rejected["id"].to_list() == ["a3"] and rejected["reason"].to_list() == ["not in step form"]


def test_trl_reward_trainer_reads_the_pairs_as_written(written, tmp_path):
    """TRL tokenizes the raw text file itself (prompt + chosen / rejected) and takes an optimizer step."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    base = default_base_model()
    tok = AutoTokenizer.from_pretrained(base)
    ds = datasets.load_dataset("parquet", data_files=str(written.irm_pairs), split="train")
    args = RewardConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, use_cpu=True,
                        bf16=False, activation_checkpointing=False, report_to="none", save_strategy="no",
                        eos_token=tok.sep_token, max_length=128, disable_tqdm=True)
    trainer = RewardTrainer(model=AutoModelForSequenceClassification.from_pretrained(base, num_labels=1),
                            args=args, train_dataset=ds, processing_class=tok)
    assert len(trainer.train_dataset) == len(ds)  # nothing filtered out
    first = trainer.train_dataset[0]
    assert tok.decode(first["chosen_ids"]).startswith("[CLS] rate this instruction")
    result = trainer.train()
    assert result.global_step == 1 and result.training_loss > 0


def test_prm_features_label_exactly_the_step_separators(written):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_base_model())
    row = pl.read_parquet(written.prm_steps).row(1, named=True)
    feats = prm_features(tok, row["prompt"], row["completions"], row["labels"], max_length=64)
    assert len(feats) == 1
    ids, labels = feats[0]["input_ids"], feats[0]["labels"]
    marked = [i for i, v in enumerate(labels) if v != -100]
    assert len(marked) == 3 and all(ids[i] == separator_id(tok) for i in marked)
    assert [labels[i] for i in marked] == [0, 0, 0]
    # too long for one chunk: split, the prompt repeated, every step still labelled once
    chunks = prm_features(tok, row["prompt"], [s * 6 for s in row["completions"]], row["labels"], max_length=32)
    assert len(chunks) > 1 and sum(sum(1 for v in c["labels"] if v != -100) for c in chunks) == 3
    assert all(len(c["input_ids"]) <= 32 for c in chunks)
