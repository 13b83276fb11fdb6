"""Verified task synthesis (OpenForge RL).

- prompts:     proposal, repair and solver prompts.
- checks:      proposal pruning, difficulty, the stub solutions tests must fail against (the answer checks are
               tasks/text/'s).
- synthesize:  one task: propose -> sandboxed tests -> repair loop -> solver pass rate, with its cost.
- batch:       one batch of tasks, on the batch runtime.
- report:  what a synthesis run reports: cost per task, the summary figures, the plots, the dataset card and the
           markdown summary.
- schemas: the schemas the synthesis calls ask for (response_format json_schema, tasks/core/structured.py): a code
           proposal, a math proposal and a repair, the keys the prompts of tasks/synthesis/prompts.py name.
- stage:   the synthesis stage: its parameters (the Prefect UI form and the CLI flags), its input check and its
           descriptor (tasks/core/stages.py).
"""
