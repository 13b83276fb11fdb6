"""Evol-Instruct (WizardLM / WizardMath / WizardCoder).

- prompts:      the evolution and equality-judge prompts; operations and their directions (the answer prompt
                is tasks/problems/'s).
- evolution:    one record's evolution: operation choice, rewrite, answer, elimination.
- elimination:  the elimination rules (the four published ones and evolforge's own), each in plain words.
- batch:        one batch of a round, on the batch runtime.
- dedup_round:  the dedup step after every round, against the persistent index.
- resume:       a run over its folder: the retry (reopen failed batches, roll the dedup index back), the seed
                import in the background, the rounds an earlier run finished.
- report:       the round costs and table artifacts, the markdown summary, the dataset card, the plots.
- stage:        the evolve and nightly stages: parameters, checks, what `evolforge run` prints, descriptors.
"""
