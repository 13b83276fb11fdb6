"""The policy under evaluation: a local transformers folder (batched generation in this process,
tasks/core/policy.py LocalPolicy, re-exported here) or a model behind the project's gateway (any OpenAI-compatible
endpoint, or the embedded model).

    LocalPolicy(folder, cfg).generate(prompts, n)     n completions per prompt: greedy when n == 1, else sampled
                                                      (eval.temperature, eval.top_p), eval.batch_size prompts per call
    EndpointPolicy(gateway, model, cfg).generate(...)  the same through Gateway.chat (retries, ledger, journal), at
                                                      most eval.concurrency calls in flight

A prompt is {"raw": text} or {"chat": messages} with "stop" (tasks/eval/prompts.py); completions come back cut
at the stop sequences.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from evolforge.config.sections.eval import EvalSettings
from evolforge.tasks.core.policy import LocalPolicy as LocalPolicy
from evolforge.tasks.core.policy import cut


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
