"""Train/serve contract: the PRM is scored on the steps it was trained on, encoded the way it was trained.

- Steps: what the PRM-data stage stores as the training steps of a labelled answer (tasks/reward/prm.py
  `label_answer` -> "completions") and what the PPO reward hands to its step scorer (tasks/ppo/reward.py, in
  process and loaded by file path as verl does) are the same list, for every format the PRM-data stage accepts.
- Encoding: the training encoder (tasks/reward/scoring.py) and the PPO scorers (tasks/ppo/scorers.py) are one
  definition (tasks/text/encoding.py) and give the same input ids and separator positions.
"""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from evolforge.tasks.ppo import reward as ppo_reward
from evolforge.tasks.ppo import scorers
from evolforge.tasks.reward import scoring
from evolforge.tasks.reward.prm import label_answer
from evolforge.tasks.text.steps import split_steps, steps_or_reason
from evolforge.testing.ppo_models import (
    IRM_PROMPT,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    shared_reward_models,
)
from evolforge.testing.settings import make_settings

# (answer, the steps both paths must produce)
ANSWERS = [
    ("Step 1: Read the question. Step 2: Add 3 and 4 to get 7.\nThe answer is: 7",
     ["Read the question.", "Add 3 and 4 to get 7.\nThe answer is: 7"]),
    ("Step 1: Read the question.\nStep 2: Add 3 and 4.\nStep 3: So the total is 7.\nThe answer is: 7",
     ["Read the question.", "Add 3 and 4.", "So the total is 7.\nThe answer is: 7"]),
    ("**Step 1:** read it\n**Step 2:** add them\nThe answer is: 7", ["read it", "add them\nThe answer is: 7"]),
    ("### Step 1\nRead the numbers.\n### Step 2\nAdd them.\n### Step 3\nThe answer is: 7",
     ["Read the numbers.", "Add them.", "The answer is: 7"]),
    ("1. Add the numbers: 3 + 4 = 7.\n2. Divide by two: 3.5.\nThe answer is: 3.5",
     ["Add the numbers: 3 + 4 = 7.", "Divide by two: 3.5.\nThe answer is: 3.5"]),
    ("2) note\n1) Add.\n2) Halve.", ["Add.", "Halve."]),
    ("Sure! Let me work it out.\nStep 1: 3 + 4 = 7.\nStep 2: Check: 7 - 4 = 3.\nThe answer is: 7",
     ["3 + 4 = 7.", "Check: 7 - 4 = 3.\nThe answer is: 7"]),
    ("Step 1: 3 + 4 = 7.\nStep 2: Check it as in step 1. 7 - 4 = 3, as step 1: said.\nThe answer is: 7",
     ["3 + 4 = 7.", "Check it as in step 1. 7 - 4 = 3, as step 1: said.\nThe answer is: 7"]),
    ("step 1 - read\nSTEP 2) add\n__Step 3__ done", ["read", "add", "done"]),
]


class FakeJudge:
    """A gateway whose judge marks every step correct (one label per step, as many as the prompt says)."""

    def chat_json(self, role, messages, **kw):
        n = int(re.search(r"The solution has (\d+) steps", messages[-1]["content"]).group(1))
        return {"labels": [True] * n}, None


class RecordingPRM:
    """A StepScorer that records the steps the PPO reward hands it."""

    def __init__(self):
        self.steps = []

    def __call__(self, prompts, steps):
        self.steps += [list(s) for s in steps]
        return [[0.5] * len(s) for s in steps]


def prm_training_steps(answer: str) -> list[str]:
    settings = make_settings(reward={"step_label_method": "judge", "reask_unstepped": False})
    row = {"id": "a1", "instruction": "What is 3 + 4?", "answer": answer, "domain": "math", "reference_answer": None}
    out = label_answer(row, FakeJudge(), settings)
    assert out["status"] == "ok", out["reason"]
    return out["completions"]


def ppo_scored_steps(answer: str, reward_module=ppo_reward) -> list[str]:
    prm = RecordingPRM()
    reward_module.PPOReward(lambda qs: [1.0] * len(qs), prm).details(["What is 3 + 4?"], [answer], ["7"])
    [steps] = prm.steps
    return steps


@pytest.mark.parametrize("answer,steps", ANSWERS)
def test_ppo_scores_the_steps_the_prm_was_trained_on(answer, steps):
    trained = prm_training_steps(answer)
    assert trained == steps
    assert ppo_scored_steps(answer) == trained


def test_the_verl_file_path_load_splits_the_same_way(monkeypatch):
    """verl loads tasks/ppo/reward.py by path, where evolforge may be absent: same steps from the same files."""
    for name in [n for n in sys.modules if n == "evolforge" or n.startswith("evolforge.")]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in ("evolforge_text_steps", "evolforge_text_answers", "evolforge_text_encoding", "evolforge_ppo_scorers"):
        monkeypatch.setitem(sys.modules, name, None)
    spec = importlib.util.spec_from_file_location("custom_module", ppo_reward.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.split_steps.__module__ == "evolforge_text_steps"
    for answer, steps in ANSWERS:
        assert ppo_scored_steps(answer, module) == steps


def test_marker_less_text_is_one_step_per_line_for_scoring_only():
    text = "We add 3 and 4.\n\nThat makes 7.\nThe answer is: 7"
    assert steps_or_reason(text)[0] is None  # never PRM training data
    assert split_steps(text) == ["We add 3 and 4.", "That makes 7.", "The answer is: 7"]
    assert ppo_scored_steps(text) == split_steps(text)
    # with any marker the line rule is off: a single 'Step 1' answer is one step, not one per line
    assert split_steps("Step 1: add.\nThe answer is: 7") == ["add.\nThe answer is: 7"]


# ------------------------------------------------------------------ one encoding


@pytest.fixture(scope="module")
def models():
    root = shared_reward_models()
    return str(root / "models" / "irm"), str(root / "models" / "prm")


def test_the_ppo_scorers_use_the_training_encoding():
    assert scorers.encode_prm is scoring.encode_prm and scorers.encode_irm is scoring.encode_irm
    assert scoring.encode_prm.__module__ == scorers.encode_prm.__module__ == "evolforge.tasks.text.encoding"


def test_training_and_ppo_encodings_give_the_same_inputs(models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(scoring.default_base_model())  # what training tokenizes with
    irm, prm = scorers.HFInstructionScorer(models[0]), scorers.HFStepScorer(models[1])
    question = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    assert scoring.encode_irm(tok, IRM_PROMPT, question, irm.max_length) == irm.encode(question)

    long_answer = "\n".join(f"Step {i}: " + "we add the numbers carefully and write them down " * 6
                            for i in range(1, 13))
    for answer in [a for a, _ in ANSWERS] + [long_answer]:
        steps, _ = steps_or_reason(answer)
        rows = scoring.prm_features(tok, question, steps, [True] * len(steps), prm.max_length)
        chunks = prm.encode(question, split_steps(answer))
        assert [r["input_ids"] for r in rows] == [c.input_ids for c in chunks]
        assert [[i for i, lab in enumerate(r["labels"]) if lab != -100] for r in rows] == [c.positions for c in chunks]
    assert len(chunks) > 1  # the long answer continues in further chunks, cut the same way
