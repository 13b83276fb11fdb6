"""The work: plain, Prefect-free functions over typed records, one sub-package per stage.

- core/       the shared machinery: gateway (the one door to every model), pricing, json_parse,
              embedded_model (the local llama.cpp server), batch (the one batch runtime), reporting.
- text/       the one step splitter, the one answer extractor (reward, ppo, synthesis) and the one
              reward-model encoding (training and PPO scoring), stdlib only: verl loads them by path.
- evolve/     Evol-Instruct: prompts, evolution, elimination, one batch, the dedup step of a round.
- dedup/      exact, MinHash + LSH and embedding dedup, with a persistent index.
- synthesis/  verified tasks: propose -> sandboxed tests -> repair -> solver check, one batch.
- sandbox/    the bubblewrap sandbox that runs generated code, and its limits.
- reward/     RLEIF reward models: IRM pairs, PRM step labels, health checks, training, scoring.
- sft/        supervised fine-tuning of the policy (TRL SFTTrainer) on the forged step-form data.
- ppo/        PPO data, the r = rI * rA reward, verl config and job, the local GRPO run.
- eval/       evaluation of a policy: pass@k on held-out verified tasks, HumanEval (sandboxed) and a math set.
- proxy/      the recording proxy between an agent and its model endpoint.
- trajectories/  recorded agent sessions -> SFT conversations, transitions, token-level samples.
- modules/    module-DAG reasoning (DeCoRL): the graph, schema-checked module outputs, contribution rewards.

- pipeline/    the composition of the stages above into one run (its parameters and descriptor).

Each stage package has a `stage` module holding its parameter model and its descriptor (tasks/core/stages.py);
STAGE_PACKAGES below is the registry's one line per stage, in pipeline order.
The Prefect tasks that wrap these functions live beside their flows in flows/; nothing here imports
flows/, and storage/ is the only place that knows paths and file formats.
A new stage is one sub-package here (with its `stage` module), one flow file, one storage module, one config
section and one line in STAGE_PACKAGES.
"""

STAGE_PACKAGES = (
    "evolve",
    "dedup",
    "synthesis",
    "reward",
    "modules",
    "trajectories",
    "sft",
    "ppo",
    "eval",
    "pipeline",
)
