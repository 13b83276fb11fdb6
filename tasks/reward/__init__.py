"""RLEIF reward models: data, health checks, training and scoring.

- prompts:   ranking, step-labelling and continuation prompts.
- irm:       instruction reward data: evolved versions ranked by a judge -> preference pairs.
- prm:       process reward data: answers split into steps and labelled (judge, decorl, math_shepherd).
- batch:     one batch of IRM or PRM data on the batch runtime, and the assembly of the sets.
- health:    the published data and model health checks, with a warn / stop policy.
- scoring:   the reward models' encoding and scoring API (shared by training and the PPO reward).
- training:  IRM with TRL's RewardTrainer, PRM as token classification at the step separators.
- report:    what the two reward stages report.
- schemas:   the schemas the reward-data judge's JSON calls ask for (response_format json_schema,
             tasks/core/structured.py).
- selection: the RLEIF loop's IRM filter: the trained IRM scores the evolved pool and a share or a threshold picks
             what PPO (tasks/ppo/job.py prompt_data) and SFT (tasks/sft/job.py prepare, with --irm-dir) train on.
- stage:     the two reward stages: their parameters (the Prefect UI forms and the CLI flags), their input checks and
             their descriptors (tasks/core/stages.py).
"""
