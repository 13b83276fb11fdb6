"""Evaluation of a policy: pass@1 / pass@k on held-out verified tasks, HumanEval and a math set; the evaluation sets
that training tables are decontaminated against.

- stage:       parameters, input check, descriptor.
- benchmarks:  the problems of each benchmark, the held-out split, the n-gram index of every evaluation text.
- prompts:     every prompt template (WizardMath CoT, HumanEval completion / instruct, the solver prompt), the checks.
- policy:      a local transformers folder (batched generation) or a model behind the gateway.
- run:         problems -> completions -> verdicts (the sandbox for code) -> the table.
- scoring:     pass@k (unbiased estimator), Wilson intervals, the table per benchmark and domain.
- report:      summary, plot, dataset card, artifacts.
"""
