"""Reward models loaded from folders with transformers, scoring a whole batch in one forward pass.

Conventions (what a model folder must hold):
  IRM: AutoModelForSequenceClassification over the instruction text; num_labels 1 -> sigmoid(logit),
       num_labels >= 2 -> softmax probability of the last label (label 1 of a +/- pair is "good").
  PRM: AutoModelForTokenClassification over  [CLS/BOS] prompt  step_1+sep  step_2+sep ... (TRL stepwise
       supervision layout, sep = "\\n"); a step's score is read at the last token of that step.
Self-contained (torch and transformers only): verl loads tasks/ppo_reward.py by path, which imports this file.
"""

from __future__ import annotations

from typing import Sequence


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _positive_probs(logits):
    import torch

    if logits.shape[-1] == 1:
        return torch.sigmoid(logits[..., 0])
    return torch.softmax(logits, dim=-1)[..., -1]  # label index num_labels-1 (1 for +/-) is "good"


class HFInstructionScorer:
    """IRM from a folder (AutoModelForSequenceClassification). Duplicate instructions are scored once;
    a batch up to `max_batch_size` distinct instructions is one forward pass."""

    def __init__(self, model_dir: str, max_length: int = 512, max_batch_size: int = 256, device: str = "cpu"):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir).to(device).eval()
        self.max_length, self.max_batch_size, self.device, self._torch = max_length, max_batch_size, device, torch

    def __call__(self, instructions: Sequence[str]) -> list[float]:
        unique = list(dict.fromkeys(instructions))
        scores: dict[str, float] = {}
        for chunk in _chunks(unique, self.max_batch_size):
            enc = self.tokenizer(chunk, padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt").to(self.device)
            with self._torch.inference_mode():
                probs = _positive_probs(self.model(**enc).logits.float())
            scores.update(zip(chunk, probs.tolist()))
        return [scores[t] for t in instructions]


class HFStepScorer:
    """PRM from a folder (AutoModelForTokenClassification); all responses of a batch in one forward pass."""

    def __init__(self, model_dir: str, max_length: int = 512, max_batch_size: int = 256, device: str = "cpu",
                 step_separator: str = "\n"):
        import torch
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForTokenClassification.from_pretrained(model_dir).to(device).eval()
        self.max_length, self.max_batch_size, self.device = max_length, max_batch_size, device
        self.step_separator, self._torch = step_separator, torch

    def _encode(self, prompt: str, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        tok = self.tokenizer
        head = [i for i in (tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id,) if i is not None]
        ids = head + tok(prompt, add_special_tokens=False)["input_ids"][: self.max_length // 2]
        positions = []
        for step in steps:
            step_ids = tok(step + self.step_separator, add_special_tokens=False)["input_ids"]
            if not step_ids or len(ids) + len(step_ids) > self.max_length:
                break  # steps that do not fit are left unscored
            ids += step_ids
            positions.append(len(ids) - 1)
        return ids, positions

    def __call__(self, prompts: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]:
        torch = self._torch
        encoded = [self._encode(p, s) for p, s in zip(prompts, steps)]
        results: list[list[float]] = [[] for _ in encoded]
        todo = [i for i, (_, pos) in enumerate(encoded) if pos]
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for chunk in _chunks(todo, self.max_batch_size):
            width = max(len(encoded[i][0]) for i in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                seq = encoded[i][0]
                ids[row, :len(seq)] = torch.tensor(seq)
                mask[row, :len(seq)] = 1
            with torch.inference_mode():
                probs = _positive_probs(self.model(input_ids=ids.to(self.device),
                                                   attention_mask=mask.to(self.device)).logits.float())
            for row, i in enumerate(chunk):
                results[i] = probs[row, encoded[i][1]].tolist()
        return results
