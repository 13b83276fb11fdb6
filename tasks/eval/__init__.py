"""Evaluation of a policy: pass@1 / pass@k on held-out verified tasks, HumanEval and a math set; the evaluation sets
that training tables are decontaminated against.

- stage:       parameters, input check, descriptor.
- prompts:     a problem's request and its check, from the shared problems package (tasks/problems/).
- policy:      a local transformers folder (batched generation) or a model behind the gateway.
- run:         problems -> completions -> verdicts (the sandbox for code) -> the table.
- scoring:     pass@k (unbiased estimator), Wilson intervals, the table per benchmark and domain.
- report:      summary, plot, dataset card, artifacts.
- compare:         the A/B of policies evaluated on the same problems (the RLEIF comparison: base vs SFT vs RL).
- compare_command: `evolforge compare`: the A/B of policies evaluated on the same problems (base vs SFT vs RL).
- contamination:   which training tables overlap the evaluation sets: each training folder given to the eval
                   (`--training`) is read by its stage (its stage.json kind), and every table it holds is checked by
                   word n-gram overlap (tasks/text/ngrams.py) against the problems this evaluation ran.
"""
