"""Supervised fine-tuning of the policy (TRL SFTTrainer) on the forged data.

- stage:   parameters, input check, descriptor.
- data:    the rows: step-form evolved answers, verified code solutions, successful trajectories; what is left out.
- job:     the rows once per output folder (held-out lineages, decontamination), the ledger row.
- train:   SFTTrainer, checkpoints and resume, LoRA, the model folder and its card.
- fit:     per-turn rows of long agent sessions fitted to sft.max_length: the prompt shortened from the left (old
           turns dropped, then old texts cut), the completion whole; counts of what was shortened or left out.
- report:  summary, plots, dataset card, artifact.
- rejection: rejection sampling (RFT, STaR): the policy's own answers to verified training tasks, kept only when
             verified.
"""
