"""Reward models loaded from folders with transformers, scoring a whole batch in one forward pass.

The inputs are built by the one reward-model encoding, tasks/text/encoding.py, that training and the reward
stage's scoring API (tasks/reward/scoring.py) use too:
  IRM: AutoModelForSequenceClassification, one logit; input = `encode_irm(prompt + instruction)` with the
       instruction-rating prompt the IRM pairs carried (from reward_meta.json); score = sigmoid(logit).
       (A model with 2+ labels scores the softmax probability of its last label.)
  PRM: AutoModelForTokenClassification, 2 classes; input = `encode_prm(prompt, steps)` (a separator token after
       the prompt and after each step, long answers in chunks that start with the prompt again); a step's
       score is the class-1 probability at its separator. Every chunk of a batch goes into the same forward pass.
reward_meta.json ({"kind", "prompt", "max_length"}) is written by the reward stage; without it the prompt is
empty and max_length 512.

Imports nothing that needs evolforge installed: verl loads tasks/ppo/reward.py by file path, and where evolforge
cannot be imported reward.py loads tasks/text/encoding.py by its location (as module `evolforge_text_encoding`)
before it loads this file the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

try:
    from evolforge.tasks.text.encoding import PrmChunk, encode_irm, encode_prm, pad_id, pad_rows, separator_id
except ImportError:  # loaded by file location from tasks/ppo/reward.py, which loaded the encoding file first
    from evolforge_text_encoding import PrmChunk, encode_irm, encode_prm, pad_id, pad_rows, separator_id

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


class _FolderModel:
    def __init__(self, model_dir: str, model_cls: str, max_batch_size: int, device: str):
        import torch
        import transformers

        self.meta = read_meta(model_dir)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = getattr(transformers, model_cls).from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
        self.max_length = int(self.meta.get("max_length") or 512)
        self.max_batch_size, self.device, self._torch = max_batch_size, device, torch
        self.pad_id = pad_id(self.tokenizer)

    def _probs(self, rows: list[list[int]]):
        ids, mask = pad_rows(rows, self.pad_id)
        with self._torch.inference_mode():
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
        return _positive_probs(logits.float()).cpu()


class HFInstructionScorer(_FolderModel):
    """IRM from a folder. Duplicate instructions are scored once; up to `max_batch_size` distinct instructions
    are one forward pass."""

    def __init__(self, model_dir: str, max_batch_size: int = 256, device: str = "cpu"):
        super().__init__(model_dir, "AutoModelForSequenceClassification", max_batch_size, device)
        self.prompt = self.meta.get("prompt") or ""

    def encode(self, instruction: str) -> list[int]:
        """The input ids of one instruction (tasks/text/encoding.py)."""
        return encode_irm(self.tokenizer, self.prompt, instruction, self.max_length)

    def __call__(self, instructions: Sequence[str]) -> list[float]:
        unique = list(dict.fromkeys(instructions))
        scores: dict[str, float] = {}
        for chunk in _chunks(unique, self.max_batch_size):
            scores.update(zip(chunk, self._probs([self.encode(t) for t in chunk]).tolist()))
        return [scores[t] for t in instructions]


class HFStepScorer(_FolderModel):
    """PRM from a folder; every chunk of every response of a batch goes into one forward pass."""

    def __init__(self, model_dir: str, max_batch_size: int = 256, device: str = "cpu"):
        super().__init__(model_dir, "AutoModelForTokenClassification", max_batch_size, device)
        try:
            separator_id(self.tokenizer)
        except ValueError as e:
            raise ValueError(f"{model_dir}: {e}") from None

    def encode(self, prompt: str, steps: Sequence[str]) -> list[PrmChunk]:
        """Chunks of (input_ids, separator positions, step indexes) (tasks/text/encoding.py)."""
        return encode_prm(self.tokenizer, prompt, list(steps), self.max_length)

    def __call__(self, prompts: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]:
        results = [[0.0] * len(s) for s in steps]
        work = [(a, ch) for a, (p, s) in enumerate(zip(prompts, steps)) for ch in self.encode(p, s)]
        for part in _chunks(work, self.max_batch_size):
            probs = self._probs([ch.input_ids for _, ch in part])
            for row, (a, ch) in enumerate(part):
                for pos, i in zip(ch.positions, ch.steps):
                    results[a][i] = float(probs[row, pos])
        return results
