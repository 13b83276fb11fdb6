"""SFT training for real (tasks/sft/train.py): TRL's SFTTrainer on a tiny Llama, a few steps on the CPU. The loss is
on the answers only; a crash mid-run resumes from the last checkpoint; LoRA trains an adapter and merges it."""

from __future__ import annotations

import json

import pytest

from evolforge.storage.layout import RunLayout
from evolforge.storage.rounds import write_sft_view
from evolforge.storage.sft_sets import META_FILE, SFTFolder, read_rows
from evolforge.tasks.sft import job, train
from evolforge.tasks.sft.stage import SFTParams
from evolforge.testing.ppo_models import one_torch_thread, write_evolved  # noqa: F401 (autouse fixture)
from evolforge.testing.tiny_policy import build_tiny_policy


@pytest.fixture
def torch():
    """torch, imported by the tests that use it: at module level it cost every test worker ~4 s of CPU at
    collection."""
    import torch

    return torch


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "policy")


def _prepared(tmp_path, tiny, **sft):
    evolved = write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=6)
    write_sft_view(evolved, RunLayout(tmp_path / "evolve").sft)
    params = SFTParams(evolve_out=str(tmp_path / "evolve"), out=str(tmp_path / "sft"), base_model=str(tiny),
                       overrides={"sft": {"batch_size": 2, "save_steps": 2, **sft}})
    settings = params.settings()
    folder = SFTFolder(params.out).ensure()
    job.prepare(params, settings, folder)
    return settings, folder


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_trains_a_policy_folder_with_card_and_log(tmp_path, tiny, torch):
    settings, folder = _prepared(tmp_path, tiny, max_steps=4, learning_rate=1e-3)
    result = train.train(folder, tiny, settings.sft)
    assert result["steps"] == 4 and result["steps_this_run"] == 4 and result["resumed_from"] is None
    assert result["device"] == "cpu" and result["dtype"] == "float32" and result["tokens"] > 0
    meta = json.loads((folder.model / META_FILE).read_text())
    assert meta["trainer"] == "trl.SFTTrainer" and meta["rows"] == result["rows"] > 0
    card = (folder.model / "README.md").read_text()
    assert "TRL's SFTTrainer" in card and "4 optimizer steps" in card and "not measured here" in card
    log = [json.loads(x) for x in folder.train_log.read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and all("loss" in r and "learning_rate" in r for r in log)
    before, after = _weights(tiny), _weights(folder.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    # the saved folder is a plain transformers policy
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(folder.model).num_parameters() > 0


def test_loss_is_on_the_answer_tokens_only(tmp_path, tiny):
    """TRL's prompt-completion collator masks the prompt: labels are -100 exactly on the prompt's tokens."""
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    settings, folder = _prepared(tmp_path, tiny, max_steps=1)
    tok = AutoTokenizer.from_pretrained(tiny)
    rows = train.sft_dataset(read_rows(folder.train), tok)
    trainer = SFTTrainer(model=str(tiny), args=SFTConfig(output_dir=str(tmp_path / "t"), use_cpu=True, report_to="none",
                                                         max_length=512, completion_only_loss=True),
                         train_dataset=rows, processing_class=tok)
    batch = trainer.data_collator([trainer.train_dataset[0]])
    labels, ids = batch["labels"][0], batch["input_ids"][0]
    # (apply_chat_template(tokenize=True) gives a BatchEncoding here: its len is its number of keys, not tokens)
    prompt_len = len(tok.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"])
    assert prompt_len > 20  # the step-by-step answer prompt around the instruction
    assert (labels[:prompt_len] == -100).all() and (labels[prompt_len:] != -100).any()
    answer = tok.decode(ids[prompt_len:][labels[prompt_len:] != -100])
    assert "step 1" in answer.lower() and "instruction" not in answer.lower()


class _Crash(Exception):
    pass


def test_a_crashed_run_resumes_from_its_last_checkpoint(tmp_path, tiny):
    from transformers import TrainerCallback

    class CrashAtStep3(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:
                raise _Crash("killed at step 3")

    settings, folder = _prepared(tmp_path, tiny, max_steps=4)
    with pytest.raises(_Crash):
        train.train(folder, tiny, settings.sft, callbacks=[CrashAtStep3()])
    assert folder.last_checkpoint().name == "checkpoint-2" and not folder.model_ready()
    result = train.train(folder, tiny, settings.sft)
    assert result["resumed_from"] == "checkpoint-2" and result["steps_this_run"] == 2 and result["steps"] == 4
    assert folder.model_ready()


def test_lora_trains_an_adapter_and_saves_the_merged_policy(tmp_path, tiny, torch):
    pytest.importorskip("peft")
    settings, folder = _prepared(tmp_path, tiny, max_steps=3, lora=True, learning_rate=1e-2)
    result = train.train(folder, tiny, settings.sft)
    assert result["lora"] and (folder.adapter / "adapter_config.json").exists()
    merged, base = _weights(folder.model), _weights(tiny)
    assert set(merged) == set(base)  # a plain model, no adapter keys left
    assert any(not torch.equal(base[k], merged[k]) for k in base)


def test_device_plan_follows_the_hardware(torch):
    from evolforge.config.settings import Settings

    plan = train.device_plan(Settings().sft)
    assert plan == ({"device": "cuda", "bf16": torch.cuda.is_bf16_supported(),
                     "dtype": "bfloat16" if torch.cuda.is_bf16_supported() else "float32"}
                    if torch.cuda.is_available() else {"device": "cpu", "bf16": False, "dtype": "float32"})
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no GPU"):
            train.device_plan(Settings().sft.model_copy(update={"device": "cuda"}))
