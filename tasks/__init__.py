"""The work: plain, testable functions over typed records, with thin Prefect task wrappers.

Gateway and cost
- gateway:          the one door to every model (retries, concurrency, ledger, JSON mode).
- pricing:          USD per call from genai-prices, with config overrides.
- json_parse:       tolerant recovery of JSON from model output.
- embedded_model:   the local llama.cpp server (SmolLM2-135M) for the out-of-the-box run.
- runners:          the Prefect task runner from config (threads, Dask, Ray).
- reporting:        summary.json content, cost tables and the markdown artifacts.

Evol-Instruct
- prompts, evolution, elimination, evolve_batch:  operations, rewriting, the four rules, one batch.
- dedup/ (normalize, minhash, embedding, index, pipeline), dedup_round:  dedup in every round and on its own.

Verified task synthesis
- sandbox, sandbox_limits:  bubblewrap sandbox for generated code.
- synthesis, synthesis_prompts, synthesis_checks, synthesize_batch:  propose -> test -> repair -> solver check.

Reward models (RLEIF)
- irm_data, prm_data, reward_data, reward_prompts:  IRM rankings -> pairs; PRM step labels.
- reward_health, reward_training, reward_scoring:   health checks, training, scoring API.

PPO
- ppo_data, ppo_reward, ppo_scorers, ppo_answers, ppo_verl, ppo_verl_schema, ppo_local, ppo_preflight.
"""
