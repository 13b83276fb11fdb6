"""The problems the policy is asked, in one home shared by SFT, PPO and eval.

- prompts.py     what the policy sees: the step-by-step answer prompt (math and evolved instructions) and the
                 solver prompt (code tasks); `task_messages` is the one prompt of a record at SFT, PPO and eval
- truth.py       the ground truth of a record: a kept task's verified answer or tests, a number as text
- split.py       the train / held-out split over seed lineages (a synthesized task carries its seed's id), the one
                 function SFT, PPO and eval call to know what is held out
- benchmarks.py  the evaluation sets (own held-out tasks, HumanEval, a GSM8K-format file) and the n-gram index
                 the training tables are decontaminated against

Answer checks (final answers, code extraction, arithmetic) are text functions: tasks/text/answers.py and
tasks/text/checks.py. No stage imports another stage's prompts or checks (tests/test_architecture.py).
"""
