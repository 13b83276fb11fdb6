"""Verified task synthesis (OpenForge RL).

- prompts:     proposal, repair and solver prompts.
- checks:      code extraction, safe arithmetic, near-duplicate shingles, difficulty, stub solutions.
- synthesize:  one task: propose -> sandboxed tests -> repair loop -> solver pass rate, with its cost.
- batch:       one batch of tasks, on the batch runtime.
"""
