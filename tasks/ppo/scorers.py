"""Reward models loaded from folders with transformers, scoring a whole batch in one forward pass.

The encoding is the one the reward stage trains with (tasks/reward/scoring.py), re-implemented here so this
file stays self-contained (verl loads tasks/ppo/reward.py by path, which imports this file as a sibling):
  IRM: AutoModelForSequenceClassification, one logit; input = `prompt` + instruction (the instruction-rating
       prompt the IRM pairs carried, from reward_meta.json), truncated to `max_length`; score = sigmoid(logit).
       (A model with 2+ labels scores the softmax probability of its last label.)
  PRM: AutoModelForTokenClassification, 2 classes; input = tokenizer(prompt) ending in the separator token
       (SEP for BERT-like encoders, else EOS), then each step's tokens followed by the separator; a step's score
       is the class-1 probability at its separator. An answer longer than `max_length` continues in further
       chunks that start with the prompt again; every chunk of a batch goes into the same forward pass.
reward_meta.json ({"kind", "prompt", "max_length"}) is written by the reward stage; without it the prompt is
empty and max_length 512.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

META_FILE = "reward_meta.json"


def read_meta(model_dir: str) -> dict:
    path = Path(model_dir) / META_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _positive_probs(logits):
    import torch

    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[..., 0])
    return torch.softmax(logits, dim=-1)[..., -1]  # label 1 of a correct/incorrect pair is "good"


def _pad(rows: list[list[int]], pad_id: int):
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask


class _FolderModel:
    def __init__(self, model_dir: str, model_cls: str, max_batch_size: int, device: str):
        import torch
        import transformers

        self.meta = read_meta(model_dir)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = getattr(transformers, model_cls).from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
        self.max_length = int(self.meta.get("max_length") or 512)
        self.max_batch_size, self.device, self._torch = max_batch_size, device, torch
        self.pad_id = self.tokenizer.pad_token_id or 0

    def _probs(self, rows: list[list[int]]):
        ids, mask = _pad(rows, self.pad_id)
        with self._torch.inference_mode():
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
        return _positive_probs(logits.float()).cpu()


class HFInstructionScorer(_FolderModel):
    """IRM from a folder. Duplicate instructions are scored once; up to `max_batch_size` distinct instructions
    are one forward pass."""

    def __init__(self, model_dir: str, max_batch_size: int = 256, device: str = "cpu"):
        super().__init__(model_dir, "AutoModelForSequenceClassification", max_batch_size, device)
        self.prompt = self.meta.get("prompt") or ""

    def __call__(self, instructions: Sequence[str]) -> list[float]:
        unique = list(dict.fromkeys(instructions))
        scores: dict[str, float] = {}
        for chunk in _chunks(unique, self.max_batch_size):
            rows = [self.tokenizer(self.prompt + t, truncation=True, max_length=self.max_length)["input_ids"]
                    for t in chunk]
            scores.update(zip(chunk, self._probs(rows).tolist()))
        return [scores[t] for t in instructions]


class HFStepScorer(_FolderModel):
    """PRM from a folder; every chunk of every response of a batch goes into one forward pass."""

    def __init__(self, model_dir: str, max_batch_size: int = 256, device: str = "cpu"):
        super().__init__(model_dir, "AutoModelForTokenClassification", max_batch_size, device)
        tok = self.tokenizer
        self.sep = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
        if self.sep is None:
            raise ValueError(f"{model_dir}: the tokenizer has neither a SEP nor an EOS token to end a step")

    def encode(self, prompt: str, steps: Sequence[str]) -> list[tuple[list[int], list[int], list[int]]]:
        """Chunks of (input_ids, separator positions, step indexes)."""
        tok, sep, max_length = self.tokenizer, self.sep, self.max_length
        head = tok(prompt, truncation=True, max_length=max(4, max_length // 2))["input_ids"]
        if head[-1] != sep:
            head = head + [sep]
        budget = max(2, max_length - len(head) - 1)
        chunks, cur = [], (list(head), [], [])
        for i, step in enumerate(steps):
            ids = tok(step, add_special_tokens=False, truncation=True, max_length=budget)["input_ids"] + [sep]
            if cur[1] and len(cur[0]) + len(ids) > max_length:
                chunks.append(cur)
                cur = (list(head), [], [])
            cur[0].extend(ids)
            cur[1].append(len(cur[0]) - 1)
            cur[2].append(i)
        if cur[1]:
            chunks.append(cur)
        return chunks

    def __call__(self, prompts: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]:
        results = [[0.0] * len(s) for s in steps]
        work = [(a, ch) for a, (p, s) in enumerate(zip(prompts, steps)) for ch in self.encode(p, s)]
        for part in _chunks(work, self.max_batch_size):
            probs = self._probs([ch[0] for _, ch in part])
            for row, (a, (_, positions, idx)) in enumerate(part):
                for pos, i in zip(positions, idx):
                    results[a][i] = float(probs[row, pos])
        return results
