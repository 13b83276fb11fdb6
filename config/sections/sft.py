"""The SFT stage: supervised fine-tuning of the policy with TRL's SFTTrainer on the forged data."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evolforge.config.sections._base import Section


class SFTSettings(Section):
    """Supervised fine-tuning (WizardMath: SFT on step-by-step answers before PPO). What is trained on: the evolve
    run's SFT view (answers in 'Step 1: ... Step 2: ...' form only), verified synthesis solutions, the assistant turns
    of successful proxy trajectories; never a seed lineage held out for evaluation (ppo.test_fraction /
    ppo.split_seed: the one split SFT, PPO and eval share) and, by default, never a row that shares an 8-gram with
    an evaluation set."""

    # --- data
    base_model: str = Field("", description="transformers folder of the policy to fine-tune; empty: the base policy, "
                            "SmolLM2-135M-Instruct converted from its GGUF file (ppo.policy_gguf) once per output folder.")
    require_steps: bool = Field(True, description="Keep only evolved answers in 'Step 1: ... Step 2: ...' form (the form "
                                "the PRM was trained on, tasks/text/steps.py); others are skipped with the reason.")
    min_steps: int = Field(2, ge=1, description="Fewest steps an evolved answer needs to count as step form.")
    trajectory_min_reward: float = Field(1.0, description="A proxy trajectory counts as successful at a reward of at "
                                         "least this (a trajectory without a reward never does).")
    trajectory_min_turns: int = Field(1, ge=1, description="A proxy trajectory (one conversation of a session) is "
                                      "trained on only with at least this many assistant turns (a turn with text or "
                                      "tool calls); each of its assistant turns is then one row, the conversation "
                                      "before it the prompt, the loss on that turn only.")
    max_rows: int = Field(0, ge=0, description="Train on at most this many rows (0: all), taken in a seeded order.")
    decontaminate: Literal["drop", "report", "off"] = Field(
        "drop", description="Rows sharing an n-gram (eval.ngram words) with an evaluation set (HumanEval, eval.math_file) "
        "are dropped (drop), only counted (report), or not checked (off). Counted per table in summary.json.")
    # --- rejection sampling (RFT / STaR): the policy's own verified answers to the training tasks
    rejection_samples: int = Field(0, ge=0, le=64, description="Answers sampled from the policy being fine-tuned for "
                                   "each kept synthesis task outside the held-out lineages (k of rejection sampling); "
                                   "a sample is kept only when verified (math: its final answer equals the task's "
                                   "majority-verified answer and it is in step form; code: it passes the task's tests "
                                   "in the sandbox). 0: off, and kept math tasks give no rows (no worked solution).")
    rejection_keep: int = Field(1, ge=1, le=64, description="Most distinct verified samples kept per task (the "
                                "shortest first).")
    rejection_temperature: float = Field(0.7, gt=0, le=2, description="Sampling temperature of rejection sampling.")
    rejection_top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling of rejection sampling.")
    rejection_max_new_tokens: int = Field(256, ge=8, description="Completion token cap of a rejection sample.")
    rejection_batch_size: int = Field(16, ge=1, description="Tasks per batched generate call of rejection sampling "
                                      "(each with rejection_samples sequences).")
    # --- training (WizardMath's published SFT: 3 epochs, lr 2e-5, warmup 0.03)
    epochs: float = Field(3.0, gt=0, description="Passes over the training rows (num_train_epochs).")
    max_steps: int = Field(0, ge=0, description="Optimizer steps; overrides epochs when > 0.")
    learning_rate: float = Field(2e-5, gt=0, description="Peak AdamW learning rate.")
    warmup_ratio: float = Field(0.03, ge=0, lt=1, description="Share of the steps the learning rate warms up over.")
    lr_scheduler: str = Field("cosine", description="transformers learning-rate schedule (cosine, linear, constant, ...).")
    batch_size: int = Field(4, ge=1, description="Rows per device per forward pass.")
    gradient_accumulation_steps: int = Field(1, ge=1, description="Forward passes per optimizer step.")
    max_length: int = Field(1024, ge=16, description="Tokens per row (prompt + answer); longer rows are truncated.")
    completion_only_loss: bool = Field(True, description="Loss on the answer tokens only (TRL prompt-completion form), "
                                       "not on the prompt.")
    seed: int = Field(42, description="Seed of the row order and of training.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA with bf16 when a GPU is present "
                                                   "(fp32 if it lacks bf16), else the CPU in fp32.")
    threads: int = Field(1, ge=1, description="torch CPU threads (1 on a shared machine: OpenMP threads stall when a "
                         "neighbour takes a core).")
    # --- checkpoints
    save_steps: int = Field(50, ge=1, description="A checkpoint every this many optimizer steps (OUT/checkpoints); a "
                            "run over the same folder resumes from the last one.")
    save_total_limit: int = Field(2, ge=1, description="Checkpoints kept (the oldest are removed).")
    logging_steps: int = Field(1, ge=1, description="Log loss and learning rate every this many steps (the plots).")
    # --- LoRA (peft; pip install evolforge[lora])
    lora: bool = Field(False, description="Train a LoRA adapter instead of every weight (needs peft). OUT/adapter keeps "
                       "the adapter; OUT/model the merged policy, so every later stage loads a plain folder.")
    lora_r: int = Field(16, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha (scaling = alpha / r).")
    lora_dropout: float = Field(0.05, ge=0, lt=1, description="LoRA dropout.")
    lora_target_modules: list[str] = Field(default_factory=lambda: ["all-linear"],
                                           description="Modules that get an adapter (peft target_modules).")
    # --- cost
    compute_usd_per_hour: float = Field(0.0, ge=0, description="Price of this machine's time: the training run's "
                                        "ledger row costs wall hours x this (0: local compute, priced at $0).")
