"""Reward-model training for real use: device and precision from the hardware, epochs, a LoRA adapter (peft) for
the IRM (TRL RewardTrainer) and the PRM (token classification). Real TRL / transformers / peft on the MiniLM encoder."""

from __future__ import annotations

import importlib.util
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evolforge.config.settings import RewardSettings
from evolforge.tasks.reward.training import device_plan, train_irm, train_prm
from evolforge.testing.ppo_models import minilm_dir, one_torch_thread  # noqa: F401  (fixture: one torch thread)

# found, not imported: importing torch and peft here cost every test worker ~8 s of CPU at collection
pytestmark = pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("torch", "peft")),
                                reason="torch and peft (the train extra) are not installed")


@pytest.fixture
def torch():
    import torch

    return torch

EMB = "bert.embeddings.word_embeddings.weight"
NORM = "bert.encoder.layer.0.output.LayerNorm.weight"
QUERY = "bert.encoder.layer.0.attention.self.query.weight"


def settings(**kw) -> RewardSettings:
    base = dict(base_model=str(minilm_dir()), max_length=48, train_batch_size=4, eval_share=0.25,
                learning_rate=1e-3, irm_max_steps=3, prm_max_steps=3, threads=1)
    return RewardSettings(**{**base, **kw})


def pairs_file(tmp_path, n=8):
    rows = [{"instruction_id": f"i{i}", "prompt": "Rate this instruction: ",
             "chosen": f"Compute {i} plus {i + 3} and explain each step of the sum clearly.",
             "rejected": f"do {i}", "margin": 1.0} for i in range(n)]
    path = tmp_path / "irm_pairs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def steps_file(tmp_path, n=8):
    rows = [{"id": f"a{i}", "prompt": f"What is {i} + 2?",
             "completions": [f"Step 1: take {i}.", f"Step 2: add 2 to get {i + 2 + (i % 2)}."],
             "labels": [True, i % 2 == 0]} for i in range(n)]
    path = tmp_path / "prm_steps.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def weights(folder, kind):
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    cls = AutoModelForSequenceClassification if kind == "irm" else AutoModelForTokenClassification
    model = cls.from_pretrained(folder, num_labels=1) if kind == "irm" else cls.from_pretrained(folder)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, next(model.parameters()).dtype


def base_weights():
    from transformers import AutoModel

    return {f"bert.{k}": v for k, v in AutoModel.from_pretrained(minilm_dir()).state_dict().items()}


def test_device_and_precision_follow_the_hardware(torch):
    plan = device_plan(settings())
    if torch.cuda.is_available():
        assert plan["device"] == "cuda" and plan["bf16"] == torch.cuda.is_bf16_supported()
        return
    assert plan == {"device": "cpu", "bf16": False, "dtype": "float32"}  # this machine: no GPU
    with pytest.raises(RuntimeError, match="reward.device = 'cuda' but torch sees no GPU"):
        device_plan(settings(device="cuda"))
    assert device_plan(settings(precision="bf16"))["bf16"] is True  # an explicit override is honoured
    assert device_plan(settings(device="cpu", precision="fp32"))["dtype"] == "float32"


def test_config_fields_are_validated():
    with pytest.raises(ValueError):
        RewardSettings(device="tpu")
    with pytest.raises(ValueError):
        RewardSettings(precision="fp16")
    with pytest.raises(ValueError):
        RewardSettings(epochs=0)


@pytest.mark.parametrize("lora", [False, True])
def test_irm_trains_on_cpu_fp32_full_or_lora(tmp_path, lora, torch):
    out = tmp_path / "irm"
    m = train_irm(pairs_file(tmp_path), out, settings(lora=lora))
    assert m["device"] == "cpu" and m["dtype"] == "float32" and m["steps"] == 3 and m["lora"] is lora
    got, dtype = weights(out, "irm")
    assert dtype == torch.float32
    base = base_weights()
    assert not torch.equal(got[QUERY], base[QUERY])  # trained (LoRA: merged delta) either way
    if lora:
        assert m["trainable_params"] < m["total_params"] / 10
        assert torch.equal(got[EMB], base[EMB]) and torch.equal(got[NORM], base[NORM])  # base frozen
        assert not any(".lora_" in k for k in got)  # merged: a plain transformers folder
    else:
        assert m["trainable_params"] == m["total_params"]
        assert not torch.equal(got[NORM], base[NORM])  # full fine-tuning moves every weight


def test_prm_lora_trains_the_adapter_and_head_only(tmp_path, torch):
    out = tmp_path / "prm"
    m = train_prm(steps_file(tmp_path), out, settings(lora=True))
    assert m["device"] == "cpu" and m["dtype"] == "float32" and m["lora"] and m["steps"] == 3
    got, dtype = weights(out, "prm")
    base = base_weights()
    assert dtype == torch.float32
    assert not torch.equal(got[QUERY], base[QUERY])
    assert torch.equal(got[EMB], base[EMB]) and torch.equal(got[NORM], base[NORM])
    assert m["trainable_params"] < m["total_params"] / 10 and 0.0 <= m["step_accuracy"] <= 1.0


def test_epochs_set_the_length_when_steps_are_zero(tmp_path):
    m = train_irm(pairs_file(tmp_path), tmp_path / "irm", settings(irm_max_steps=0, epochs=2))
    train_pairs = m["train_pairs"]
    assert m["epochs"] == 2 and m["max_steps"] == 0
    assert m["steps"] == 2 * math.ceil(train_pairs / 4)
