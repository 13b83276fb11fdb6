"""The PPO stage of RLEIF.

- data:         verl prompt rows (train / held-out test) from evolved instructions.
- reward:       r = rI * rA, importable by TRL, by verl (by path) and by the flow.
- scorers:      the IRM / PRM scorers the reward loads from trained folders.
  (The reward's step splitter, answer check and reward-model encoding are shared with the reward stage:
  tasks/text/steps.py, tasks/text/answers.py, tasks/text/encoding.py.)
- verl, verl_schema:  verl's PPO config, its documented schema, the Ray job submission.
- local:        the local GRPO smoke run on the CPU.
- preflight:    checks before PPO (reward models present, reward stage healthy).

This package's __init__ stays import-free: verl loads reward.py by path.
"""
