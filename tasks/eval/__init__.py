"""Evaluation of a policy: pass@1 / pass@k on held-out verified tasks, HumanEval and a math set; the evaluation sets
that training tables are decontaminated against.

- benchmarks:  the problems of each benchmark, the held-out split, the n-gram index of every evaluation text.
"""
