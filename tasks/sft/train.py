"""Supervised fine-tuning with TRL's SFTTrainer: the rows of data/train.parquet -> a transformers folder.

    device_plan(cfg)                   where it trains: CUDA with bf16 when a GPU is present (sft.device auto), else
                                       the CPU in fp32
    base_policy(cfg, ppo, folder)      the policy to fine-tune: sft.base_model, else the base policy (SmolLM2-135M-
                                       Instruct converted once from its GGUF into OUT/base_policy)
    sft_dataset(rows, tok)             the rows in the form the policy's chat template renders (tool calls kept)
    train(folder, base, cfg, ...)      SFTTrainer on the conversational prompt-completion rows (loss on the answer
                                       only), checkpoints every sft.save_steps in OUT/checkpoints and resumes from
                                       the last one, optional LoRA (peft; merged into OUT/model, the adapter kept in
                                       OUT/adapter); writes OUT/model with its model card and sft_meta.json, and the
                                       logged steps (loss, learning rate) to train_log.jsonl

The trainer's optimizer steps are live progress (tasks/core/progress.py: the CLI's bar, the flow's artifact).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from evolforge import __version__
from evolforge.config.sections.ppo import PPOSettings
from evolforge.config.sections.sft import SFTSettings
from evolforge.storage import sft_sets as store
from evolforge.tasks.core.progress import StepProgress, trainer_callback

log = logging.getLogger("evolforge.sft")
LOG_KEYS = ("loss", "learning_rate", "grad_norm", "epoch", "num_tokens", "mean_token_accuracy")


def device_plan(cfg: SFTSettings) -> dict[str, Any]:
    import torch

    gpu = torch.cuda.is_available() and cfg.device in ("auto", "cuda")
    if cfg.device == "cuda" and not gpu:
        raise RuntimeError("sft.device = 'cuda' but torch sees no GPU (set sft.device = 'auto' or 'cpu')")
    bf16 = gpu and torch.cuda.is_bf16_supported()
    return {"device": "cuda" if gpu else "cpu", "bf16": bf16, "dtype": "bfloat16" if bf16 else "float32"}


def base_policy(cfg: SFTSettings, ppo: PPOSettings, folder: store.SFTFolder) -> Path:
    """sft.base_model, else the base policy converted from the GGUF (ppo.policy_gguf, default SmolLM2-135M)."""
    if cfg.base_model:
        return Path(cfg.base_model)
    from evolforge.tasks.core.policy import find_policy_gguf, prepare_policy

    return prepare_policy(find_policy_gguf(ppo.policy_gguf), folder.base_policy)


def sft_dataset(rows: list[dict], tok, max_length: int | None = None, fitted: dict | None = None):
    """The rows as TRL's conversational prompt-completion dataset, in the form the policy's chat template renders:
    tool calls with parsed arguments and the tool schemas as `tools` when the template renders them; when it does
    not (SmolLM2's template, the tiny test policy's), each call as `<tool_call>{"name", "arguments"}</tool_call>`
    text in the assistant turn and the schemas as a `# Tools` block in the system message, the rendering the
    trajectories stage's token samples use (tasks/text/chat.py), so a turn that only called tools still
    has its calls to learn. Each message is one `datasets.Json` value: arrow would merge the different shapes of
    tool arguments into one struct, filling every call with the other tools' keys as nulls. With `max_length`,
    trajectory turns longer than it get their prompt shortened from the left, the completion whole
    (tasks/sft/fit.py; the counts go to `fitted`)."""
    import datasets

    from evolforge.tasks.text.chat import ChatRenderer

    renderer = ChatRenderer(tok, str(getattr(tok, "name_or_path", "") or "the policy's tokenizer"))
    out = []
    for r in rows:
        tools = json.loads(r["tools"]) if r.get("tools") else None
        prompt, tools_arg, _, _ = renderer.template_messages(store.chat_messages(r["prompt"]), tools or None)
        completion = renderer.template_messages(store.chat_messages(r["completion"]), None)[0]
        out.append({"prompt": prompt, "completion": completion,
                    "tools": json.dumps(tools_arg, ensure_ascii=False) if tools_arg else None})
    if max_length:
        from evolforge.tasks.sft.fit import fit_rows

        out = fit_rows(out, rows, lambda p, c, t: len(renderer.ids(renderer.render(p + c, t))), max_length, fitted)
    message = datasets.List(datasets.Json())
    features = datasets.Features({"prompt": message, "completion": message, "tools": datasets.Value("string")})
    return datasets.Dataset.from_list(out, features=features)


def _lora(cfg: SFTSettings):
    try:
        from peft import LoraConfig
    except ImportError as e:
        raise RuntimeError("sft.lora needs peft: pip install 'evolforge[lora]' (or pip install peft)") from e
    targets = cfg.lora_target_modules
    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, task_type="CAUSAL_LM",
                      target_modules=targets[0] if targets == ["all-linear"] else list(targets))


def _step_counter(counter: dict):
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            counter["first"] = state.global_step

        def on_step_end(self, args, state, control, **kw):
            counter["done"] = counter.get("done", 0) + 1

    return Steps()


def _max_length(cfg: SFTSettings, model, base) -> int:
    """sft.max_length, capped at the policy's positions (a longer row would index past them), with a warning
    naming both."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(positions, int) and 0 < positions < cfg.max_length:
        log.warning("sft.max_length = %d tokens is more than the %d positions of the policy %s: rows are fitted "
                    "to %d", cfg.max_length, positions, base, positions)
        return positions
    return cfg.max_length


def train(folder: store.SFTFolder, base: Path, cfg: SFTSettings, progress: StepProgress | None = None,
          callbacks: list | None = None) -> dict[str, Any]:
    """Fine-tune `base` on folder.train (see the module docstring); returns the run's figures."""
    import datasets
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(cfg.threads)
    plan = device_plan(cfg)
    rows = store.read_rows(folder.train)
    if not rows:
        raise ValueError(f"{folder.train} holds no rows: nothing to fine-tune on (see data/skipped.parquet)")
    tok = AutoTokenizer.from_pretrained(base)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, plan["dtype"]))
    max_length = _max_length(cfg, model, base)
    args = SFTConfig(
        output_dir=str(folder.checkpoints), num_train_epochs=cfg.epochs, max_steps=cfg.max_steps or -1,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate, warmup_steps=cfg.warmup_ratio, lr_scheduler_type=cfg.lr_scheduler,
        logging_steps=cfg.logging_steps, save_strategy="steps", save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit, report_to="none", use_cpu=plan["device"] == "cpu", bf16=plan["bf16"],
        seed=cfg.seed, data_seed=cfg.seed, max_length=max_length, completion_only_loss=cfg.completion_only_loss,
        dataloader_num_workers=0, disable_tqdm=True, activation_checkpointing=False)
    counter: dict = {}
    fitted: dict = {}
    extra = [_step_counter(counter)] + ([trainer_callback(progress)] if progress else []) + list(callbacks or [])
    trainer = SFTTrainer(model=model, args=args, train_dataset=sft_dataset(rows, tok, max_length, fitted),
                         processing_class=tok,
                         peft_config=_lora(cfg) if cfg.lora else None, callbacks=extra)
    resume = folder.last_checkpoint()
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    seconds = time.perf_counter() - t0
    log = [{"step": h["step"], **{k: h[k] for k in LOG_KEYS if k in h}} for h in trainer.state.log_history
           if "loss" in h and "step" in h]
    store.write_jsonl(folder.train_log, log)
    tokens = next((int(h["num_tokens"]) for h in reversed(trainer.state.log_history) if "num_tokens" in h), None)
    # TRL drops a row max_length left without a completion token (a prompt that fills it): counted, not hidden
    meta = {"base_model": str(base), "trainer": "trl.SFTTrainer", "rows": len(rows),
            "rows_cut_by_max_length": len(rows) - len(trainer.train_dataset), "steps": trainer.state.global_step,
            "epochs": round(float(trainer.state.epoch or 0), 3), "train_loss": round(float(result.training_loss), 4),
            "learning_rate": cfg.learning_rate, "lora": cfg.lora, "device": plan["device"], "dtype": plan["dtype"],
            "completion_only_loss": cfg.completion_only_loss, "data": str(folder.train),
            "evolforge_version": __version__, **fitted}
    with tempfile.TemporaryDirectory(prefix=".model-", dir=folder.root) as staged:
        if cfg.lora:
            trainer.model.save_pretrained(str(folder.adapter))
            trainer.model.merge_and_unload().save_pretrained(staged)
        else:
            trainer.save_model(staged)
        tok.save_pretrained(staged)
        store.write_json(Path(staged) / store.META_FILE, meta)
        (Path(staged) / "README.md").write_text(model_card(meta, cfg), encoding="utf-8")
        store.publish_model(Path(staged), folder.model)
    return {**meta, "resumed_from": resume.name if resume else None, "steps_this_run": counter.get("done", 0),
            "train_seconds": round(seconds, 2), "tokens": tokens, "model": str(folder.model),
            "adapter": str(folder.adapter) if cfg.lora else None}


def model_card(meta: dict, cfg: SFTSettings) -> str:
    """The model card (README.md) of OUT/model: what it was fine-tuned from, on what, how."""
    import yaml

    header = {"library_name": "transformers", "tags": ["evolforge", "sft", "trl"], "base_model": meta["base_model"],
              "evolforge": meta}
    lines = ["---", yaml.safe_dump(header, sort_keys=False, width=1000).strip(), "---", "",
             "# evolforge SFT policy", "",
             f"Fine-tuned from `{meta['base_model']}` with TRL's SFTTrainer on {meta['rows']} rows "
             f"(`{meta['data']}`, its dataset card beside it): {meta['steps']} optimizer steps, "
             f"{meta['epochs']} epochs, final training loss {meta['train_loss']}, on {meta['device']} in "
             f"{meta['dtype']}" + (", LoRA merged into the weights" if meta["lora"] else "") + ".", "",
             "Answers are in the step form the process reward model scores ('Step 1: ... Step 2: ...', ending in "
             "'The answer is: X'); the loss covers the answers only" if meta["completion_only_loss"] else
             "The loss covers prompts and answers", "",
             "## Settings", "", "```yaml",
             yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=True, width=1000).strip(), "```", "",
             "## Use", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
             'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
             'tok = AutoTokenizer.from_pretrained("<this folder>")', "```", "",
             "Its accuracy is not measured here: run `evolforge eval --policy <this folder>`."]
    return "\n".join(lines) + "\n"
