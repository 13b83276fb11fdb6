"""Reward-model training: the IRM with TRL's RewardTrainer, the PRM with transformers' Trainer.

- IRM: sequence classification with one output (the reward), pairwise loss -log sigmoid(r_chosen - r_rejected
  - margin), trained by `trl.RewardTrainer` on the IRM pairs (storage/reward_sets.py). The pairs are tokenized here
  (`scoring.encode_irm`: prompt + instruction, truncated rather than dropped when long) and handed to
  the trainer as its documented pre-tokenized form (chosen_ids, rejected_ids, margin).
- PRM: token classification (correct / incorrect) at the step separators, every other token ignored (-100),
  trained by `transformers.Trainer`. TRL 1.x ships no PRMTrainer any more (not in trl.experimental either in
  1.16); its old PRMTrainer did exactly this (token classification with a label at each step separator), so
  the stepwise-supervision data keeps TRL's format and the training loop is transformers' own.
Device and precision follow the hardware (`device_plan`: CUDA with bf16 when a GPU supports it, else the CPU in
fp32; reward.device / reward.precision override). Length: reward.irm_max_steps / prm_max_steps optimizer steps, or
reward.epochs passes when the step count is 0. reward.lora trains a LoRA adapter (peft) plus the full reward head,
the base weights frozen, and merges it into the saved model (scoring loads a plain transformers folder).
Held-out split by instruction / answer id (pairs of one instruction never straddle the split). Metrics:
pairwise accuracy (IRM) and step accuracy with its majority-class baseline (PRM), on the held-out part.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import tempfile
import time
from pathlib import Path

from evolforge.config.settings import RewardSettings
from evolforge.storage import reward_sets as store
from evolforge.storage.fs import exists, location, read_parquet
from evolforge.tasks.core.progress import StepProgress, trainer_callback
from evolforge.tasks.reward import scoring
from evolforge.tasks.reward.health import check_health


def held_out_ids(ids: list[str], share: float, seed: int) -> set[str]:
    uniq = sorted(set(ids), key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
    if share <= 0 or len(uniq) < 2:
        return set()
    return set(uniq[: min(len(uniq) - 1, max(1, math.ceil(share * len(uniq))))])


def _setup(cfg: RewardSettings) -> str:
    import datasets
    import torch
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(cfg.threads)
    return cfg.base_model or scoring.default_base_model()


def device_plan(cfg: RewardSettings) -> dict:
    """Where and in what precision the reward models train: {device: cpu|cuda, bf16: bool, dtype: str}."""
    import torch

    gpu = torch.cuda.is_available() and cfg.device in ("auto", "cuda")
    if cfg.device == "cuda" and not gpu:
        raise RuntimeError("reward.device = 'cuda' but torch sees no GPU (set reward.device = 'auto' or 'cpu')")
    if cfg.precision == "auto":
        bf16 = gpu and torch.cuda.is_bf16_supported()
    elif cfg.precision == "bf16":
        if gpu and not torch.cuda.is_bf16_supported():
            raise RuntimeError("reward.precision = 'bf16' but this GPU does not support bf16 (set 'auto' or 'fp32')")
        bf16 = True
    else:
        bf16 = False
    return {"device": "cuda" if gpu else "cpu", "bf16": bf16, "dtype": "bfloat16" if bf16 else "float32"}


def lora_config(cfg: RewardSettings, task_type: str):
    """The peft LoraConfig of reward.lora_* for a SEQ_CLS (IRM) or TOKEN_CLS (PRM) model; its head is trained in
    full (peft's modules_to_save of these task types)."""
    try:
        from peft import LoraConfig
    except ImportError as e:
        raise RuntimeError("reward.lora needs peft: pip install 'evolforge[lora]' (or pip install peft)") from e
    targets = cfg.lora_target_modules
    # the head (BERT-like `classifier`, LM-like `score`) is trained in full, never given an adapter as well
    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, task_type=task_type,
                      target_modules=targets[0] if targets == ["all-linear"] else list(targets),
                      exclude_modules=["classifier", "score"], modules_to_save=["classifier", "score"])


def _common_args(cfg: RewardSettings, output_dir: str, max_steps: int, plan: dict) -> dict:
    length = dict(max_steps=max_steps) if max_steps > 0 else dict(num_train_epochs=cfg.epochs)
    return dict(output_dir=output_dir, **length, per_device_train_batch_size=cfg.train_batch_size,
                learning_rate=cfg.learning_rate, logging_steps=max(1, max_steps // 5) if max_steps > 0 else 1,
                save_strategy="no", report_to="none", use_cpu=plan["device"] == "cpu", bf16=plan["bf16"],
                seed=cfg.seed, dataloader_num_workers=0, disable_tqdm=True, activation_checkpointing=False)


def _save_trained(trainer, model_dir: str | Path, lora: bool) -> None:
    """The trained model as a plain transformers folder: a LoRA adapter is merged into its base weights."""
    if not lora:
        trainer.save_model(str(model_dir))
        return
    trainer.model.merge_and_unload().save_pretrained(str(model_dir))


def _training_facts(trainer, cfg: RewardSettings, plan: dict, max_steps: int) -> dict:
    model = trainer.model
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"max_steps": max_steps, "epochs": None if max_steps > 0 else cfg.epochs,
            "steps": trainer.state.global_step, "device": plan["device"], "dtype": plan["dtype"], "lora": cfg.lora,
            "trainable_params": trainable, "total_params": sum(p.numel() for p in model.parameters())}


def train_irm(pairs_path: str | Path, model_dir: str | Path, cfg: RewardSettings,
              progress: StepProgress | None = None) -> dict:
    import datasets
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    base = _setup(cfg)
    plan = device_plan(cfg)
    ds = datasets.Dataset(read_parquet(location(pairs_path)))  # local path or URL
    if len(ds) == 0:
        raise ValueError(f"{pairs_path} holds no IRM pairs: nothing to train on (see the reward-data summary)")
    held = held_out_ids(ds["instruction_id"], cfg.eval_share, cfg.seed)
    train_ds = ds.filter(lambda r: r["instruction_id"] not in held)
    eval_ds = ds.filter(lambda r: r["instruction_id"] in held)
    prompt = ds[0]["prompt"]
    tok = AutoTokenizer.from_pretrained(base)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token

    def tokenize(r):
        return {"chosen_ids": scoring.encode_irm(tok, r["prompt"], r["chosen"], cfg.max_length),
                "rejected_ids": scoring.encode_irm(tok, r["prompt"], r["rejected"], cfg.max_length),
                "margin": float(r["margin"])}

    train_tok = train_ds.map(tokenize, remove_columns=train_ds.column_names)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="irm-trainer-") as tmp:
        args = RewardConfig(**_common_args(cfg, tmp, cfg.irm_max_steps, plan), max_length=cfg.max_length)
        trainer = RewardTrainer(model=model, args=args, train_dataset=train_tok, processing_class=tok,
                                callbacks=[trainer_callback(progress)] if progress else None,
                                peft_config=lora_config(cfg, "SEQ_CLS") if cfg.lora else None)
        result = trainer.train()
        facts = _training_facts(trainer, cfg, plan, cfg.irm_max_steps)
        _save_trained(trainer, model_dir, cfg.lora)
    train_seconds = time.perf_counter() - t0
    tok.save_pretrained(str(model_dir))
    scoring.write_meta(Path(model_dir), {"kind": "irm", "prompt": prompt, "max_length": cfg.max_length,
                                         "base_model": base, "trainer": "trl.RewardTrainer", "lora": cfg.lora,
                                         "device": plan["device"], "dtype": plan["dtype"]})
    metrics = {"train_pairs": len(train_ds), "eval_pairs": len(eval_ds), "eval_instructions": len(held),
               "train_loss": round(result.training_loss, 4), **facts,
               "train_seconds": round(train_seconds, 1), "pairwise_accuracy": None}
    if len(eval_ds):
        chosen = scoring.score_instructions(model_dir, eval_ds["chosen"])
        rejected = scoring.score_instructions(model_dir, eval_ds["rejected"])
        metrics["pairwise_accuracy"] = round(sum(c > r for c, r in zip(chosen, rejected)) / len(eval_ds), 4)
    return metrics


def train_prm(steps_path: str | Path, model_dir: str | Path, cfg: RewardSettings,
              progress: StepProgress | None = None) -> dict:
    import datasets
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
        TrainingArguments,
    )

    base = _setup(cfg)
    plan = device_plan(cfg)
    ds = datasets.Dataset(read_parquet(location(steps_path)))
    if len(ds) == 0:
        raise ValueError(f"{steps_path} holds no labelled answers: nothing to train on (see the reward-data summary)")
    held = held_out_ids(ds["id"], cfg.eval_share, cfg.seed)
    train_rows = [r for r in ds if r["id"] not in held]
    eval_rows = [r for r in ds if r["id"] in held]
    tok = AutoTokenizer.from_pretrained(base)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    feats = [f for r in train_rows
             for f in scoring.prm_features(tok, r["prompt"], r["completions"], r["labels"], cfg.max_length)]
    model = AutoModelForTokenClassification.from_pretrained(
        base, num_labels=2, id2label={0: "incorrect", 1: "correct"}, label2id={"incorrect": 0, "correct": 1})
    if cfg.lora:
        lora = lora_config(cfg, "TOKEN_CLS")  # first: a clear error without peft
        from peft import get_peft_model

        model = get_peft_model(model, lora)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="prm-trainer-") as tmp:
        trainer = Trainer(model=model, args=TrainingArguments(**_common_args(cfg, tmp, cfg.prm_max_steps, plan)),
                          train_dataset=datasets.Dataset.from_list(feats), processing_class=tok,
                          data_collator=DataCollatorForTokenClassification(tok),
                          callbacks=[trainer_callback(progress)] if progress else None)
        result = trainer.train()
        facts = _training_facts(trainer, cfg, plan, cfg.prm_max_steps)
        _save_trained(trainer, model_dir, cfg.lora)
    train_seconds = time.perf_counter() - t0
    tok.save_pretrained(str(model_dir))
    scoring.write_meta(Path(model_dir), {"kind": "prm", "max_length": cfg.max_length, "base_model": base,
                                         "separator": tok.convert_ids_to_tokens(scoring.separator_id(tok)),
                                         "trainer": "transformers.Trainer (token classification)", "lora": cfg.lora,
                                         "device": plan["device"], "dtype": plan["dtype"]})
    train_labels = [v for r in train_rows for v in r["labels"]]
    metrics = {"train_answers": len(train_rows), "train_steps": len(train_labels), "train_chunks": len(feats),
               "eval_answers": len(eval_rows), "train_loss": round(result.training_loss, 4),
               **facts, "train_seconds": round(train_seconds, 1),
               "train_correct_share": round(sum(train_labels) / len(train_labels), 4) if train_labels else None,
               "step_accuracy": None, "majority_baseline": None}
    if eval_rows:
        scores = scoring.score_step_lists(model_dir, [r["prompt"] for r in eval_rows], [r["completions"] for r in eval_rows])
        pairs = [(s >= 0.5, bool(v)) for r, sc in zip(eval_rows, scores) for s, v in zip(sc, r["labels"])]
        share_true = sum(v for _, v in pairs) / len(pairs)
        metrics.update(eval_steps=len(pairs), step_accuracy=round(sum(p == v for p, v in pairs) / len(pairs), 4),
                       majority_baseline=round(max(share_true, 1 - share_true), 4))
    return metrics


def model_health(data_dir: str | Path, out_dir: str | Path, cfg: RewardSettings) -> dict:
    """The health checks on the trained models' scores: instructions and steps sampled from the data."""
    data, layout = store.RewardLayout(data_dir), store.RewardLayout(out_dir)
    rng = random.Random(cfg.seed)
    irm_scores, prm_scores = [], []
    if layout.model_ready("irm") and exists(data.irm_groups):
        texts = sorted({v for vs in store.read_groups(data)["versions"].to_list() for v in vs})
        texts = rng.sample(texts, min(len(texts), cfg.health_sample))
        irm_scores = scoring.score_instructions(layout.local_model("irm"), texts)
    if layout.model_ready("prm") and exists(data.prm_steps):
        rows = store.read_prm_steps(data.prm_steps).select("prompt", "completions").to_dicts()
        rng.shuffle(rows)
        picked, n = [], 0
        for r in rows:
            if n >= cfg.health_sample:
                break
            picked.append(r)
            n += len(r["completions"])
        scores = scoring.score_step_lists(layout.local_model("prm"), [r["prompt"] for r in picked],
                                          [r["completions"] for r in picked])
        prm_scores = [s for sc in scores for s in sc]
    return check_health(irm_scores, prm_scores, cfg, stage="model")


def train_reward_model(kind: str, data_dir: str, out_dir: str, cfg: RewardSettings) -> dict:
    """Train the IRM or the PRM from the data in `data_dir` into `out_dir` (published there when remote)."""
    data, layout = store.RewardLayout(data_dir), store.RewardLayout(out_dir)
    dest = layout.fresh_training_dir(kind)  # empty, reached without a link: the trainer's writes stay inside
    # live progress: the optimizer steps (tasks/core/progress.py; the CLI's bar, the flow's progress artifact)
    steps = cfg.irm_max_steps if kind == "irm" else cfg.prm_max_steps
    progress = StepProgress(f"train {kind}", steps or None, "steps")  # epochs: the trainer reports its step count
    train = train_irm if kind == "irm" else train_prm
    result = train(data.irm_pairs if kind == "irm" else data.prm_steps, dest, cfg, progress)
    progress.finish(f"train loss {result['train_loss']:.4g}")
    layout.publish_model(kind)
    return result
