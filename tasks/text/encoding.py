"""The one reward-model encoding: how an instruction, and a prompt with its list of steps, become model inputs.

Tokenizer in, token ids out. Training (tasks/reward/training.py through tasks/reward/scoring.py), the reward
stage's scoring API (tasks/reward/scoring.py) and the PPO reward's scorers (tasks/ppo/scorers.py) all call
these functions, so a model is scored on exactly the inputs it was trained on.

Stdlib only (torch is imported inside `pad_rows`): verl loads tasks/ppo/reward.py by file path, possibly where
evolforge is not installed, and reward.py then loads this file by its location.

- IRM (sequence classification, one logit): input = `prompt` + instruction (the instruction-rating prompt the
  IRM pairs carried, as TRL's RewardTrainer concatenates an explicit prompt with chosen / rejected), truncated
  to `max_length` tokens.
- PRM (token classification, 2 classes, labels only at step separators): input = the prompt's tokens ending in
  the separator token (the tokenizer's [SEP] for BERT-like encoders, else its EOS), then each step's tokens
  followed by the separator; a step's label / score sits at its separator. An answer too long for `max_length`
  continues in further chunks, each starting with the prompt again (later chunks do not see earlier steps).
"""

from __future__ import annotations

from dataclasses import dataclass


def separator_id(tok) -> int:
    """The token that ends a step: SEP, else EOS."""
    sep = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    if sep is None:
        raise ValueError("the tokenizer has neither a SEP nor an EOS token to mark the end of a step")
    return sep


def encode_irm(tok, prompt: str, text: str, max_length: int) -> list[int]:
    """IRM input ids of one instruction."""
    return tok(prompt + text, truncation=True, max_length=max_length)["input_ids"]


@dataclass
class PrmChunk:
    input_ids: list[int]
    positions: list[int]  # index of each step's separator in input_ids
    steps: list[int]  # which step of the answer each position belongs to


def encode_prm(tok, prompt: str, steps: list[str], max_length: int) -> list[PrmChunk]:
    """PRM input chunks of one answer: ids, the separator position of each step, and the step index."""
    sep = separator_id(tok)
    head = tok(prompt, truncation=True, max_length=max(4, max_length // 2))["input_ids"]
    if head[-1] != sep:
        head = head + [sep]
    step_budget = max(2, max_length - len(head) - 1)
    chunks: list[PrmChunk] = []
    cur = PrmChunk(list(head), [], [])
    for i, step in enumerate(steps):
        ids = tok(step, add_special_tokens=False, truncation=True, max_length=step_budget)["input_ids"] + [sep]
        if cur.positions and len(cur.input_ids) + len(ids) > max_length:
            chunks.append(cur)
            cur = PrmChunk(list(head), [], [])
        cur.input_ids += ids
        cur.positions.append(len(cur.input_ids) - 1)
        cur.steps.append(i)
    if cur.positions:
        chunks.append(cur)
    return chunks


def pad_id(tok) -> int:
    """The padding token of a batch (0 when the tokenizer has none; padding is masked out)."""
    return tok.pad_token_id or 0


def pad_rows(rows: list[list[int]], pad_id: int):
    """(input_ids, attention_mask) tensors of a batch, right-padded with `pad_id`."""
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask
