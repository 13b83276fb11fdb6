"""Text rules shared by the reward stage, the PPO reward and task synthesis (stdlib only, import-free __init__).

- steps:     the one step splitter (`steps_or_reason` for PRM training data, `split_steps` for scoring).
- answers:   the one final-answer extractor and comparison (`extract_answer`, `answers_match`, `answer_correct`).
- encoding:  the one reward-model encoding (`encode_irm`, `encode_prm`): how an instruction, and a prompt with
             its steps, become token ids, for training and for scoring.
- scores:    a judge's 0-10 score from its JSON reply (`parse_score`: PRM labels, the module-graph judge).

tasks/ppo/reward.py, which verl loads by file path, loads these three files by location where evolforge is not
installed, so none of them imports evolforge (and this __init__ imports nothing).
- checks: answer checks shared by synthesis, SFT, PPO and eval: code extraction and numeric answers (stdlib only).
- ngrams: decontamination by word n-gram overlap (open-r1's scripts/decontaminate.py: 8-grams).
- chat:   the conversation form SFT trains on and the trajectories stage writes (tool calls, TRL image parts), and
          its rendering through the policy's chat template (ChatRenderer), the same for both.
"""
