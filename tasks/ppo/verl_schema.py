"""The offline schema of the verl PPO configuration evolforge generates (verl 0.9 key names).

A pydantic mirror of the part of verl's `ppo_trainer.yaml` that evolforge sets, `extra="forbid"` at every
level, so a misspelt or misplaced key fails here where verl is not installed (verl pins packages older than
evolforge's, so it usually is not). The choices are values verl 0.9 knows (tests/tasks/ppo/test_verl_real.py compares
them with verl's own enums); the constraints are verl's batch arithmetic, evolforge's own stricter ones (micro
batches divide the per-GPU mini-batch, one response per prompt with a critic) and the published RLEIF bounds
(rollout batch >= 64). The real check is `tasks/ppo/verl.check_with_verl`: verl's own Hydra composition and
`validate_config`, run in a python where verl is importable; the test suite runs both.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Optim(_Strict):
    lr: float = Field(gt=0, description="Learning rate (published actor lr 1e-6).")


class KLCtrl(_Strict):
    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = Field(ge=0, description="KL penalty coefficient (published 0.05).")


class Algorithm(_Strict):
    adv_estimator: Literal["gae", "grpo", "reinforce_plus_plus", "rloo"]
    gamma: float = Field(ge=0, le=1)
    lam: float = Field(ge=0, le=1)
    use_kl_in_reward: bool
    kl_penalty: Literal["kl", "abs", "mse", "low_var_kl", "full"]
    kl_ctrl: KLCtrl


class Data(_Strict):
    train_files: str
    val_files: str
    prompt_key: Literal["prompt"] = "prompt"
    reward_fn_key: Literal["data_source"] = "data_source"
    train_batch_size: int = Field(ge=64, description="Rollout batch: prompts per PPO iteration (published lower bound 64).")
    max_prompt_length: int = Field(ge=1)
    max_response_length: int = Field(ge=1)
    filter_overlong_prompts: bool
    truncation: Literal["error", "left", "right", "middle"]


class Model(_Strict):
    path: str = Field(min_length=1)


class Checkpoint(_Strict):
    save_contents: list[Literal["model", "optimizer", "extra", "hf_model"]]

    @model_validator(mode="after")
    def _ends_with_a_policy(self) -> "Checkpoint":
        if not {"model", "hf_model"} <= set(self.save_contents):
            raise ValueError("the actor checkpoint must save 'model' (to resume) and 'hf_model' (the Hugging Face "
                             f"folder evolforge eval reads), got {self.save_contents}")
        return self


class Actor(_Strict):
    optim: Optim
    checkpoint: Checkpoint
    ppo_mini_batch_size: int = Field(ge=1)
    ppo_micro_batch_size_per_gpu: int = Field(ge=1)
    ppo_epochs: int = Field(ge=1)
    clip_ratio: float = Field(gt=0, le=1)
    use_kl_loss: bool


class Rollout(_Strict):
    name: Literal["vllm", "sglang", "trtllm"]  # verl 0.9's rollout registry (no "hf" rollout any more)
    n: int = Field(ge=1)
    tensor_model_parallel_size: int = Field(ge=1)
    log_prob_micro_batch_size_per_gpu: int = Field(ge=1)


class Ref(_Strict):
    log_prob_micro_batch_size_per_gpu: int = Field(ge=1)


class ActorRolloutRef(_Strict):
    model: Model
    actor: Actor
    rollout: Rollout
    ref: Ref


class Critic(_Strict):
    model: Model
    optim: Optim
    ppo_micro_batch_size_per_gpu: int = Field(ge=1)


class RewardKwargs(_Strict):
    irm_dir: str = Field(min_length=1)
    prm_dir: str = Field(min_length=1)
    aggregation: Literal["min", "product", "last"]
    answer_weight: float = Field(ge=0, le=1)
    batch_window_s: float | None = Field(None, gt=0)
    device: str = "cpu"


class CustomRewardFunction(_Strict):
    path: str
    name: str
    reward_kwargs: RewardKwargs

    @model_validator(mode="after")
    def _function_exists(self) -> "CustomRewardFunction":
        src = Path(self.path.removeprefix("file://"))  # verl's loader takes a path, file://path or pkg://module
        if self.path.startswith("pkg://"):  # verl imports pkg://a.b.c as the module a.b.c
            spec = importlib.util.find_spec(self.path[len("pkg://"):].replace("/", "."))
            if spec is None or not spec.origin:
                raise ValueError(f"custom reward function module not importable here: {self.path}")
            src = Path(spec.origin)
        if not src.is_file():
            raise ValueError(f"custom reward function file not found: {src}")
        tree = ast.parse(src.read_text(encoding="utf-8"))
        names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if self.name not in names:
            raise ValueError(f"{src} defines no function {self.name!r} (has: {sorted(names)})")
        return self


class Reward(_Strict):
    custom_reward_function: CustomRewardFunction


class Trainer(_Strict):
    project_name: str
    experiment_name: str
    nnodes: int = Field(ge=1)
    n_gpus_per_node: int = Field(ge=1)
    total_epochs: int = Field(ge=1)
    logger: list[str]
    val_before_train: bool
    test_freq: int
    save_freq: int = Field(ge=1, description="Steps between checkpoints (verl also saves at the last step); verl's "
                           "default -1 saves none, and the job would end with no policy.")
    default_local_dir: str = Field(min_length=1)
    resume_mode: Literal["auto", "disable", "resume_path"]
    max_actor_ckpt_to_keep: int | None = Field(None, ge=1)
    max_critic_ckpt_to_keep: int | None = Field(None, ge=1)


class VerlPPOConfig(_Strict):
    """What `python3 -m verl.trainer.main_ppo` receives from evolforge, as a nested document."""

    algorithm: Algorithm
    data: Data
    actor_rollout_ref: ActorRolloutRef
    critic: Critic
    reward: Reward
    trainer: Trainer

    @model_validator(mode="after")
    def _batches_divide(self) -> "VerlPPOConfig":
        mini = self.actor_rollout_ref.actor.ppo_mini_batch_size
        if self.data.train_batch_size % mini:
            raise ValueError(f"data.train_batch_size ({self.data.train_batch_size}) must be a multiple of "
                             f"actor ppo_mini_batch_size ({mini})")
        gpus = self.trainer.nnodes * self.trainer.n_gpus_per_node
        per_update = mini * self.actor_rollout_ref.rollout.n  # verl scales the mini-batch by rollout.n ...
        if per_update % gpus:  # ... and splits it over the data-parallel GPUs
            raise ValueError(f"ppo_mini_batch_size x rollout.n ({per_update}) must divide evenly over {gpus} GPUs")
        for who, micro in (("actor", self.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu),
                           ("critic", self.critic.ppo_micro_batch_size_per_gpu)):
            if (per_update // gpus) % micro:
                raise ValueError(f"{who} ppo_micro_batch_size_per_gpu ({micro}) must divide the per-GPU mini-batch "
                                 f"({per_update} / {gpus} GPUs = {per_update // gpus})")
        if self.algorithm.adv_estimator == "gae" and self.actor_rollout_ref.rollout.n != 1:
            raise ValueError("PPO with a critic (adv_estimator gae) samples one response per prompt (rollout.n 1)")
        return self
