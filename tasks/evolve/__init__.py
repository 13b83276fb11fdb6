"""Evol-Instruct (WizardLM / WizardMath / WizardCoder).

- prompts:      the evolution, answer and equality-judge prompts; operations and their directions.
- evolution:    one record's evolution: operation choice, rewrite, answer, elimination.
- elimination:  the four elimination rules.
- batch:        one batch of a round, on the batch runtime.
- dedup_round:  the dedup step after every round, against the persistent index.
"""
