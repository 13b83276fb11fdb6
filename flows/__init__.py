"""One Prefect flow per stage, reading top to bottom like the DAG, each with its thin @task wrappers.

- evolve:        seeds -> Evol-Instruct rounds (elimination, dedup every round) -> datasets + cost ledger.
- nightly:       each night evolves the survivors of the last night one round further.
- dedup:         dedup of any jsonl / parquet / csv file.
- synthesize:    verified Python tasks and math problems, cost per task.
- reward_data:   IRM preference pairs and PRM step labels, with health checks.
- train_reward:  the IRM and the PRM.
- ppo:           verl data + config (Ray job) and a local GRPO smoke run with r = rI * rA.
- pipeline:      the stages in order, each given what the registry's feeds say (SFT, PPO and eval off by
                 default).
- trajectories:  the recording proxy's finished sessions -> SFT conversations, transitions, token samples.
- modules:       questions -> the module graph (DeCoRL) -> answers, per-module contribution rewards, PRM rows.

Shared by the flows:
- _params:   StageParams / EndpointParams (the UI form's common fields) -> settings; the model endpoint.
- _fanout:   the batch tasks' retry and cache options, and run_batches (one task per batch, progress,
             one clear error naming the failed batches).
- _runners:  the Prefect task runner from [runner] (threads, Dask, Ray).
- _report: what a stage shows when it ends: its plots (PNG files in OUT/plots/ and one markdown artifact on the
           Prefect run) and, for a stage that makes datasets, the dataset card beside them.
- _stage:  the preamble and epilogue every stage flow shares, so a flow body is its DAG and nothing else.
- eval:    evaluation flow: a policy -> completions on each benchmark -> verdicts (code in the sandbox, math by its
           final answer) -> pass@k with Wilson 95% intervals per benchmark and domain.
- sft:     sFT flow: forged data -> the rows (step-form evolved answers, verified code solutions, successful
           trajectories; held-out lineages and evaluation overlaps left out) -> TRL SFTTrainer -> a transformers
           folder with its model card.
"""
