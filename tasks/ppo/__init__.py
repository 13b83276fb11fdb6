"""The PPO stage of RLEIF.

- data:         verl prompt rows (train / held-out test) from evolved instructions.
- reward:       r = rI * rA, importable by TRL, by verl (by path) and by the flow.
- scorers:      the IRM / PRM scorers the reward loads from trained folders.
  (The reward's step splitter, answer check and reward-model encoding are shared with the reward stage:
  tasks/text/steps.py, tasks/text/answers.py, tasks/text/encoding.py.)
- verl, verl_schema:  verl's PPO config, its documented schema, the `ray job submit` command.
- ray_jobs:     the Ray job through the Jobs API (submit, wait, logs), for the verl PPO job or the GRPO smoke run.
- local:        the local GRPO smoke run on the CPU (GRPO, not PPO: TRL ships no PPO trainer).
- grpo_smoke:   the whole smoke run in one call, in the flow or as a Ray job (`python -m ...grpo_smoke SPEC`).
- training_health: reward health while the smoke run trains (share of rA < 0.5, reward drift; warn / stop).
- preflight:    checks before PPO (reward models present, reward stage healthy).
- stage:        the stage's parameters, its fail-fast check and its registry descriptor.
- job:          what a run sets up: inputs, prompt data, initial policy (SFT or base), verl configuration, the Ray job.
- report:       what a run reports: summary, counts, artifacts, plots, the dataset card, the outcome.

This package's __init__ stays import-free: verl loads reward.py by path.
"""
