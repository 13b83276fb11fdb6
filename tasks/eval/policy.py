"""The policy under evaluation: a local transformers folder (batched generation in this process) or a model behind
the project's gateway (any OpenAI-compatible endpoint, or the embedded model).

    LocalPolicy(folder, cfg).generate(prompts, n)     n completions per prompt: greedy when n == 1, else sampled
                                                      (eval.temperature, eval.top_p), eval.batch_size prompts per call
    EndpointPolicy(gateway, model, cfg).generate(...)  the same through Gateway.chat (retries, ledger, journal), at
                                                      most eval.concurrency calls in flight

A prompt is {"raw": text} or {"chat": messages} with "stop" (tasks/eval/prompts.py); completions come back cut
at the stop sequences.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from evolforge.config.sections.eval import EvalSettings
from evolforge.tasks.eval.prompts import cut


class LocalPolicy:
    chat_only = False

    def __init__(self, folder: str | Path, cfg: EvalSettings):
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
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(self.device).eval()

    def _text(self, prompt: dict) -> str:
        if "raw" in prompt:
            return prompt["raw"]
        return self.tok.apply_chat_template(prompt["chat"], tokenize=False, add_generation_prompt=True)

    def generate(self, prompts: list[dict], n: int, on_batch=None) -> list[list[str]]:
        import torch

        cfg, out = self.cfg, []
        torch.manual_seed(cfg.seed)
        for i in range(0, len(prompts), cfg.batch_size):
            batch = prompts[i:i + cfg.batch_size]
            enc = self.tok([self._text(p) for p in batch], return_tensors="pt", padding=True,
                           add_special_tokens="raw" in batch[0]).to(self.device)
            sample = n > 1
            with torch.inference_mode():
                gen = self.model.generate(**enc, max_new_tokens=cfg.max_new_tokens, do_sample=sample,
                                          temperature=cfg.temperature if sample else None,
                                          top_p=cfg.top_p if sample else None, num_return_sequences=n,
                                          pad_token_id=self.tok.pad_token_id)
            texts = self.tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            for j, p in enumerate(batch):
                out.append([cut(t, p.get("stop") or []) for t in texts[j * n:(j + 1) * n]])
            if on_batch:
                on_batch(len(batch))
        return out


class EndpointPolicy:
    chat_only = True

    def __init__(self, gateway, model: str, cfg: EvalSettings, journal=None):
        self.gw, self.model, self.cfg, self.journal, self.name = gateway, model, cfg, journal, model

    def generate(self, prompts: list[dict], n: int, on_batch=None, ids: list[str] | None = None) -> list[list[str]]:
        cfg = self.cfg

        def one(i: int) -> list[str]:
            p = prompts[i]
            messages = p["chat"] if "chat" in p else [{"role": "user", "content": p["raw"]}]
            outs = []
            for s in range(n):
                res = self.gw.chat("eval", messages, task_id=(ids[i] if ids else str(i)), purpose=f"sample-{s}",
                                   temperature=cfg.temperature if n > 1 else 0.0, top_p=cfg.top_p if n > 1 else None,
                                   max_tokens=cfg.max_new_tokens, journal=self.journal, model=self.model)
                outs.append(cut(res.text, p.get("stop") or []))
            if on_batch:
                on_batch(1)
            return outs

        with ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="eval") as pool:
            return list(pool.map(one, range(len(prompts))))
