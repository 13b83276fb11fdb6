"""The SFT view of an evolved dataset trains with TRL's SFTTrainer as it is: loaded through the dataset card, the
`messages` rendered by the tokenizer's chat template, two optimizer steps of a tiny random model (offline)."""

from __future__ import annotations

import pytest

from evolforge.storage.cards import write_dataset_card
from evolforge.storage.layout import RunLayout
from evolforge.storage.rounds import write_sft_view
from evolforge.testing.evolved_runs import evolve_folder


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the 2 shared cores: more threads only stall
    yield
    torch.set_num_threads(before)


def test_sft_view_trains_with_trl(tmp_path):
    from datasets import load_dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    from evolforge.testing.ppo_models import minilm_dir

    lay = RunLayout(evolve_folder(tmp_path))
    assert write_sft_view(lay.evolved, lay.sft) == 6  # the 6 evolutions with answers; seeds have none
    write_dataset_card(lay.dataset_dir, {"sft": lay.sft}, title="t", description="d", sections={}, facts={})
    ds = load_dataset(str(lay.dataset_dir), "sft", split="train")

    tok = AutoTokenizer.from_pretrained(minilm_dir())
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    tok.eos_token = tok.sep_token
    model = LlamaForCausalLM(LlamaConfig(vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=256, pad_token_id=tok.pad_token_id,
                                         eos_token_id=tok.sep_token_id))
    trainer = SFTTrainer(model=model, processing_class=tok, train_dataset=ds, args=SFTConfig(
        output_dir=str(tmp_path / "sft"), max_steps=2, per_device_train_batch_size=3, max_length=128,
        report_to=[], save_strategy="no", use_cpu=True, dataloader_num_workers=0))
    result = trainer.train()
    assert result.global_step == 2 and result.training_loss > 0
    first = trainer.train_dataset[0]
    text = tok.decode(first["input_ids"])
    row = ds[0]
    # the chat template rendered both turns: the instruction and the answer reach the model
    assert "user :" in text and "assistant :" in text
    assert tok.decode(tok(row["messages"][1]["content"], add_special_tokens=False)["input_ids"]) in text
