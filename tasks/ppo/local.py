"""Local RL run on this machine: a few GRPO steps of the embedded-size policy with TRL's GRPOTrainer.

This is a smoke run, not a training run: SmolLM2-135M on a CPU, a handful of prompts, 2 completions per
prompt, completions of a few dozen tokens. It proves the pieces fit (verl-format data read by `datasets`,
the r = rI * rA reward inside GRPOTrainer, KL against the initial policy, a saved policy, a held-out comparison);
it does not produce a better model. The scale-out path is tasks/ppo/verl.py.

    grpo_train(...)                GRPO steps; per step: reward, reward_std, kl, loss, seconds; with a
                                   TrainingHealth, every scored completion of the first steps is watched and the
                                   health callback may end training (tasks/ppo/training_health.py)
    mean_reward(policy, rows, ...) greedy completions on held-out prompts, scored by the same reward

The algorithm is GRPO (group-relative advantages, no critic): TRL 1.x ships no PPO trainer. The stage's PPO
(with a critic, GAE) is the verl job. tasks/ppo/grpo_smoke.py runs the whole smoke run in one call.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

from evolforge.tasks.core.progress import StepProgress, trainer_callback
from evolforge.tasks.ppo.reward import PPOReward
from evolforge.tasks.ppo.training_health import TrainingHealth

log = logging.getLogger("evolforge.ppo")

STEP_KEYS = ("loss", "reward", "reward_std", "kl", "entropy", "learning_rate", "grad_norm",
             "completions/mean_length", "reward/r_i", "reward/r_a_prm", "reward/answer_correct")


def use_threads(n: int) -> None:
    """torch CPU threads for this process (see ppo.local_torch_threads: 1 is far faster on a shared machine)."""
    import torch

    torch.set_num_threads(n)


def _step_callback(records: list[dict]):
    from transformers import TrainerCallback

    class StepLog(TrainerCallback):
        """Per optimizer step: wall seconds, and the metrics the trainer logs for that step."""

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            records.append({"step": state.global_step, "step_seconds": round(time.perf_counter() - self.t0, 3)})

        def on_log(self, args, state, control, logs=None, **kw):
            if not logs or "train_runtime" in logs:
                return
            row = next((r for r in records if r["step"] == state.global_step), None)
            if row is None:
                row = {"step": state.global_step}
                records.append(row)
            row.update({k: float(logs[k]) for k in STEP_KEYS if k in logs and logs[k] is not None})
            row.update({k: float(v) for k, v in logs.items() if k.startswith("rewards/") and v is not None})

    return StepLog()


class ObservedReward(PPOReward):
    """The same reward (same scorers and settings), handing every scored batch's PPOReward.details rows to
    `on_batch`: how the health watch sees per-completion rA, which the trainer only logs as batch means."""

    def __init__(self, reward: PPOReward, on_batch):
        self.__dict__.update(reward.__dict__)
        self.on_batch = on_batch

    def details(self, *args, **kwargs) -> list[dict]:
        rows = super().details(*args, **kwargs)
        self.on_batch(rows)
        return rows


def _health_callback(health: TrainingHealth):
    from transformers import TrainerCallback

    class HealthWatch(TrainerCallback):
        """After each optimizer step: the step's completions are in; under policy 'stop' a failed check ends
        training here (the reward stage's policy, reward.health_policy)."""

        def on_step_end(self, args, state, control, **kw):
            health.end_step(state.global_step)
            if health.should_stop():
                log.warning("reward health failed at step %d, stopping training (policy stop): %s",
                            state.global_step, "; ".join(health.report()["problems"]))
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kw):
            # logged after on_step_end: the step's KL is checked here (a KL explosion stops at once under 'stop')
            health.observe_log(state.global_step, logs or {})
            if health.stopped_at is None and health.should_stop():
                log.warning("training health failed at step %d, stopping training (policy stop): %s",
                            state.global_step, "; ".join(health.report()["problems"]))
                control.should_training_stop = True

    return HealthWatch()


def grpo_train(policy_dir: Path, train_parquet: Path, reward: PPOReward, out_dir: Path, *, steps: int,
               prompts_per_step: int, num_generations: int, max_completion_length: int, learning_rate: float,
               beta: float, clip_ratio: float, temperature: float, max_prompts: int, seed: int,
               health: TrainingHealth | None = None, progress: StepProgress | None = None,
               callbacks: list | None = None, save_steps: int = 0, loss_type: str | None = None) -> dict[str, Any]:
    """`steps` GRPO steps on the first `max_prompts` training prompts; saves the policy to out_dir/policy (model and
    tokenizer: the folder `evolforge eval --policy` reads). `save_steps` > 0 also writes a resumable trainer
    checkpoint (model, optimizer, scheduler, RNG) every that many steps to out_dir/trainer/checkpoint-N, the last
    two kept. On a GPU (when torch sees one) the run uses it, in bf16 where supported.
    With `health`, result["health"] is its report and result["stopped_early"] says whether it ended training.
    With `progress`, each optimizer step and its logged reward reach it (the live progress views); `callbacks`:
    further transformers TrainerCallbacks."""
    from datasets import load_dataset
    from trl import GRPOConfig, GRPOTrainer

    dataset = load_dataset("parquet", data_files=str(train_parquet), split="train")
    dataset = dataset.select(range(min(max_prompts, len(dataset))))
    import torch

    work = Path(out_dir)
    gpu = torch.cuda.is_available()
    bf16 = gpu and torch.cuda.is_bf16_supported()
    extra_args = {"loss_type": loss_type} if loss_type else {}
    args = GRPOConfig(**extra_args,
        output_dir=str(work / "trainer"), max_steps=steps, per_device_train_batch_size=prompts_per_step * num_generations,
        num_generations=num_generations, max_completion_length=max_completion_length, learning_rate=learning_rate,
        beta=beta, epsilon=clip_ratio, temperature=temperature, logging_steps=1, report_to=[],
        save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500, save_total_limit=2,
        use_cpu=not gpu, bf16=bf16, fp16=False, gradient_checkpointing=False, seed=seed, dataloader_num_workers=0,
        disable_tqdm=True, log_completions=False, lr_scheduler_type="constant",
    )
    records: list[dict] = []
    extra, callbacks = list(callbacks or []), [_step_callback(records)]
    if progress is not None:
        callbacks.append(trainer_callback(progress))
    if health is not None:
        reward = ObservedReward(reward, health.observe)
        callbacks.append(_health_callback(health))
    callbacks += extra
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=str(policy_dir), reward_funcs=reward, args=args, train_dataset=dataset,
                          callbacks=callbacks)
    t_setup = time.perf_counter() - t0
    result = trainer.train()
    policy_out = work / "policy"
    trainer.save_model(str(policy_out))
    trainer.processing_class.save_pretrained(str(policy_out))
    steps_logged = sorted(records, key=lambda r: r["step"])
    return {"algorithm": "GRPO", "steps": steps_logged, "setup_seconds": round(t_setup, 2),
            "train_seconds": round(float(result.metrics.get("train_runtime", 0.0)), 2),
            "train_loss": float(result.training_loss), "policy_dir": str(policy_out),
            "checkpoints": sorted(str(p) for p in (work / "trainer").glob("checkpoint-*")),
            "prompts": len(dataset), "completions_per_step": prompts_per_step * num_generations,
            "health": health.report() if health is not None else None,
            "stopped_early": health is not None and health.stopped_at is not None}


def generate(policy_dir: Path, prompts: list[list[dict]], max_new_tokens: int, batch_size: int = 8) -> list[str]:
    """Greedy completions of chat prompts (deterministic: the same policy gives the same text)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy_dir)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        texts = [tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts[i:i + batch_size]]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        out += tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return out


def mean_reward(policy_dir: Path, rows: list[dict], reward: PPOReward, max_new_tokens: int) -> dict[str, Any]:
    """Mean r = rI * rA of the policy's greedy completions on verl rows (the held-out comparison)."""
    completions = generate(policy_dir, [r["prompt"] for r in rows], max_new_tokens)
    gts = [r["reward_model"]["ground_truth"] if r["reward_model"]["style"] == "rule" else None for r in rows]
    details = reward.details([r["extra_info"]["question"] for r in rows], completions, gts)
    scores = [d["reward"] for d in details]
    mean = sum(scores) / len(scores) if scores else math.nan
    return {"mean_reward": mean, "n": len(scores), "rewards": scores,
            "mean_r_i": sum(d["r_i"] for d in details) / max(1, len(details)),
            "mean_r_a_prm": sum(d["r_a_prm"] for d in details) / max(1, len(details)),
            "completions": completions}


def compare_policies(initial_dir: Path, trained_dir: Path, rows: list[dict], reward: PPOReward,
                     max_new_tokens: int, on_policy=None, initial_kind: str = "base") -> dict[str, Any]:
    """Initial (`initial_kind`: sft or base) vs trained mean reward r = rI * rA on the same prompts. A change in mean
    reward, not in accuracy: RLEIF's +3 points are pass@1 on a benchmark, which `evolforge eval` measures.
    `on_policy()` is called after each policy is scored (live progress)."""
    initial = mean_reward(initial_dir, rows, reward, max_new_tokens)
    if on_policy:
        on_policy()
    trained = mean_reward(trained_dir, rows, reward, max_new_tokens)
    if on_policy:
        on_policy()
    return {"n_prompts": len(rows), "initial_policy": initial_kind, "initial": initial, "trained": trained,
            "delta": trained["mean_reward"] - initial["mean_reward"],
            "identical_completions": sum(a == b for a, b in zip(initial["completions"], trained["completions"]))}
