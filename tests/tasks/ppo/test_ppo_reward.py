"""The PPO reward r = rI * rA: arithmetic, aggregation, answer check, batching, verl and TRL entry points."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import sys

import pytest

from evolforge.tasks.ppo import reward as ppo_reward
from evolforge.tasks.ppo.reward import PPOReward, aggregate, combine
from evolforge.tasks.text.answers import answer_correct, extract_answer
from evolforge.tasks.text.steps import split_steps
from evolforge.testing.ppo_models import (
    IRM_PROMPT,
    ForwardCounter,
    one_torch_thread,  # noqa: F401 (autouse fixture)
    shared_reward_models,
)


class FakeIRM:
    def __init__(self, scores: dict[str, float]):
        self.scores, self.calls = scores, []

    def __call__(self, instructions):
        self.calls.append(list(instructions))
        return [self.scores[i] for i in instructions]


class FakePRM:
    """Step score = the number the step starts with ("Step 1: 0.9" is the step "0.9": markers are stripped)."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, steps):
        self.calls.append((list(prompts), [list(s) for s in steps]))
        return [[float(step.split()[0]) for step in ss] for ss in steps]


def reward(aggregation="min", answer_weight=0.5):
    return PPOReward(FakeIRM({"q1": 0.8, "q2": 0.5}), FakePRM(), aggregation, answer_weight)


def test_reward_is_instruction_reward_times_answer_reward():
    r = reward("min")
    [value] = r.score(["q1"], ["Step 1: 0.9\nStep 2: 0.5\nStep 3: 0.7"])
    assert value == pytest.approx(0.8 * 0.5)
    [value] = r.score(["q2"], ["Step 1: 0.9\nStep 2: 0.6"])
    assert value == pytest.approx(0.5 * 0.6)


@pytest.mark.parametrize("how,expected", [("min", 0.5), ("product", 0.9 * 0.5 * 0.7), ("last", 0.7)])
def test_aggregation_of_step_scores(how, expected):
    assert aggregate([0.9, 0.5, 0.7], how) == pytest.approx(expected)
    [value] = reward(how).score(["q1"], ["Step 1: 0.9 Step 2: 0.5 Step 3: 0.7"])
    assert value == pytest.approx(0.8 * expected)


def test_aggregation_edge_cases():
    assert aggregate([], "min") == 0.0 and aggregate([], "product") == 0.0
    with pytest.raises(ValueError, match="aggregation"):
        aggregate([0.5], "mean")
    with pytest.raises(ValueError, match="aggregation"):
        PPOReward(FakeIRM({}), FakePRM(), "mean")
    assert reward().score(["q1"], [""]) == [0.0]  # an empty response has no steps


def test_ground_truth_check_blends_into_the_answer_reward():
    r = reward("min", answer_weight=0.5)
    right, wrong = "Step 1: 0.6 so 3 + 4 = 7.\nStep 2: 0.4 The answer is: 7", "Step 1: 0.6\nStep 2: 0.4 The answer is: 8"
    scores = r.score(["q1", "q1", "q1"], [right, wrong, right], ["7", "7", None])
    assert scores[0] == pytest.approx(0.8 * (0.5 * 0.4 + 0.5 * 1.0))
    assert scores[1] == pytest.approx(0.8 * (0.5 * 0.4 + 0.5 * 0.0))
    assert scores[2] == pytest.approx(0.8 * 0.4)  # no ground truth: PRM only
    assert combine(1.0, [0.2], True, "min", answer_weight=1.0) == 1.0
    assert combine(1.0, [0.9], False, "min", answer_weight=1.0) == 0.0


def test_answer_parsing():
    assert extract_answer("Step 1: 2+2=4.\nThe answer is: 4.") == "4"
    assert extract_answer("so \\boxed{12} is it") == "12"
    assert extract_answer("no marker, last number 3 then 5", fallback_last_number=True) == "5"
    assert extract_answer("no marker at all") is None
    assert answer_correct("The answer is: $1,200.00", "1200") is True
    assert answer_correct("The answer is: 1199", "1200") is False
    assert answer_correct("The answer is: 3/4", "0.75") is True
    assert answer_correct("The answer is: Paris.", "paris") is True
    assert answer_correct("anything", "") is None
    # the last marker wins; a '#### Step N' heading is not an answer
    assert extract_answer("The answer is 3.\nOn second thought \\boxed{4}") == "4"
    assert extract_answer("#### Step 1\nadd\n#### Step 2\nso 7", fallback_last_number=True) == "7"
    assert extract_answer("Final answer: **12**.") == "12" and extract_answer("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    # the PRM's training splitter (tasks/text/steps.py): markers and a preamble are not part of any step.
    # (This test used to pin the PPO-only splitter, which kept "Step 1:" and scored the preamble as a step.)
    assert split_steps("Step 1: a\nStep 2: b Step 3: c") == ["a", "b", "c"]
    assert split_steps("First we think.\nStep 1: a") == ["a"]
    assert split_steps("line one\n\nline two") == ["line one", "line two"]  # no markers at all: one per line


def test_batch_shapes_and_one_call_per_scorer():
    r = reward()
    qs = ["q1", "q2", "q1", "q2", "q1"]
    responses = [f"Step 1: 0.{i + 1}\nStep 2: 0.9" for i in range(5)]
    out = r.score(qs, responses, [None] * 5)
    assert len(out) == 5 and all(isinstance(x, float) for x in out)
    assert len(r.irm.calls) == 1 and r.irm.calls[0] == qs
    assert len(r.prm.calls) == 1 and len(r.prm.calls[0][1]) == 5
    with pytest.raises(ValueError, match="questions"):
        r.score(["q1"], responses)


def test_trl_reward_function_signature_and_dataset_columns():
    r = reward()
    assert r.__name__ == "ppo_reward"
    params = inspect.signature(r.__call__).parameters
    assert list(params)[:2] == ["prompts", "completions"] and any(p.kind is p.VAR_KEYWORD for p in params.values())
    prompts = [[{"role": "user", "content": "Answer in steps.\n\nq1"}]] * 2
    completions = [[{"role": "assistant", "content": "Step 1: 0.5\nThe answer is: 7"}],
                   [{"role": "assistant", "content": "Step 1: 0.5\nThe answer is: 9"}]]
    metrics = {}
    out = r(prompts, completions, reward_model=[{"style": "rule", "ground_truth": "7"}] * 2,
            extra_info=[{"question": "q1"}] * 2, log_metric=lambda k, v: metrics.__setitem__(k, v), trainer_state=None)
    assert out == pytest.approx([0.8 * 0.75, 0.8 * 0.25])
    assert r.irm.calls[-1] == ["q1", "q1"]  # the raw question, not the templated prompt
    assert metrics["reward/answer_correct"] == 0.5 and metrics["reward/r_i"] == pytest.approx(0.8)
    # style "model" rows are not answer-checked
    out = r(prompts, completions, reward_model=[{"style": "model", "ground_truth": ""}] * 2, extra_info=[{"question": "q1"}] * 2)
    assert out == pytest.approx([0.8 * 0.5, 0.8 * 0.5])


# ------------------------------------------------------------------ real (tiny) reward models from folders

@pytest.fixture(scope="module")
def models():
    root = shared_reward_models()
    return str(root / "models" / "irm"), str(root / "models" / "prm")


def _samples(n):
    questions = [f"Tom has {i} apples and buys {i + 2} more. How many apples?" for i in range(n // 2)] * 2
    responses = [f"Step 1: {i} + {i + 2} = {2 * i + 2}.\n" + "Step 2: check the sum again. " * (i % 3)
                 + f"\nThe answer is: {2 * i + 2}" for i in range(n)]
    return questions[:n], responses, [str(2 * (i % (n // 2)) + 2) for i in range(n)]


def test_one_forward_pass_per_model_per_batch(models):
    r = ppo_reward.load_reward(*models, aggregation="min")
    irm, prm = ForwardCounter(r.irm.model), ForwardCounter(r.prm.model)
    try:
        qs, responses, gts = _samples(8)
        details = r.details(qs, responses, gts)
        assert len(details) == 8 and (irm.calls, prm.calls) == (1, 1)
        assert all(0.0 <= d["reward"] <= 1.0 and 0.0 < d["r_i"] < 1.0 for d in details)
        assert [len(d["step_scores"]) for d in details] == [len(split_steps(x)) for x in responses]
        # verl batched entry point: also one pass per model
        irm.reset(), prm.reset()
        extra = [{"question": q} for q in qs]
        batch = ppo_reward.compute_score_batch(["evolforge/math"] * 8, responses, gts, extra,
                                               irm_dir=models[0], prm_dir=models[1], aggregation="min")
        assert (irm.calls, prm.calls) == (1, 1)
        assert batch == pytest.approx([d["reward"] for d in details], abs=1e-5)
        # verl per-sample entry point: one pass per call, same numbers (padding does not change a score)
        irm.reset(), prm.reset()
        single = [ppo_reward.compute_score("evolforge/math", s, g, e, irm_dir=models[0], prm_dir=models[1],
                                           aggregation="min") for s, g, e in zip(responses, gts, extra)]
        assert (irm.calls, prm.calls) == (8, 8)
        assert single == pytest.approx(batch, abs=1e-5)
    finally:
        irm.handle.remove(), prm.handle.remove()


def test_async_verl_reward_coalesces_concurrent_calls(models):
    r = ppo_reward.load_reward(*models, aggregation="min")
    irm, prm = ForwardCounter(r.irm.model), ForwardCounter(r.prm.model)
    qs, responses, gts = _samples(8)
    kw = dict(irm_dir=models[0], prm_dir=models[1], aggregation="min")

    async def rollout_batch():  # verl's reward loop: one task per sample, gathered
        return await asyncio.gather(*(ppo_reward.compute_score_async("evolforge/math", s, g, {"question": q}, **kw)
                                      for q, s, g in zip(qs, responses, gts)))
    try:
        scores = asyncio.run(rollout_batch())
        assert (irm.calls, prm.calls) == (1, 1)
        assert scores == pytest.approx(r.score(qs, responses, gts), abs=1e-5)
    finally:
        irm.handle.remove(), prm.handle.remove()


def test_verl_loads_the_file_by_path_without_evolforge(models, monkeypatch):
    """verl's load_extern_object imports tasks/ppo/reward.py from its path; evolforge may be absent there."""
    for name in [n for n in sys.modules if n == "evolforge" or n.startswith("evolforge.")]:
        monkeypatch.setitem(sys.modules, name, None)  # any import of evolforge now raises ImportError
    for name in ("evolforge_text_steps", "evolforge_text_answers", "evolforge_text_encoding", "evolforge_ppo_scorers"):
        monkeypatch.setitem(sys.modules, name, None)  # the by-location modules are removed again afterwards
    monkeypatch.setenv("EVOLFORGE_PPO_IRM_DIR", models[0])
    monkeypatch.setenv("EVOLFORGE_PPO_PRM_DIR", models[1])
    spec = importlib.util.spec_from_file_location("custom_module", ppo_reward.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # the fallback loaded the shared files by location: tasks/text/steps.py, answers.py, encoding.py
    assert module.split_steps.__module__ == "evolforge_text_steps"
    assert module.answer_correct.__module__ == "evolforge_text_answers"
    assert module.HFStepScorer.encode.__globals__["encode_prm"].__module__ == "evolforge_text_encoding"
    params = list(inspect.signature(module.compute_score).parameters)
    assert params[:4] == ["data_source", "solution_str", "ground_truth", "extra_info"]
    value = module.compute_score("evolforge/math", "Step 1: 2 + 2 = 4\nThe answer is: 4", "4", {"question": "What is 2 + 2?"})
    assert 0.0 < value <= 1.0
    with pytest.raises(ValueError, match="question"):
        module.compute_score("evolforge/math", "Step 1: x", "4", {})


def test_scores_match_the_reward_stage_encoding(models):
    """The same numbers as the reward stage's own scoring API (tasks/reward/scoring.py), when it is present:
    the IRM reads reward_meta.json's prompt + the instruction, the PRM a separator token after each step."""
    scoring = pytest.importorskip("evolforge.tasks.reward.scoring")
    r = ppo_reward.load_reward(*models, aggregation="min")
    assert r.irm.prompt == IRM_PROMPT
    qs, responses, _ = _samples(6)
    steps = [split_steps(x) for x in responses]
    assert r.irm(qs) == pytest.approx(scoring.score_instructions(models[0], qs), abs=1e-5)
    ours = r.prm(qs, steps)
    theirs = scoring.score_step_lists(models[1], qs, steps)
    assert [len(x) for x in ours] == [len(x) for x in steps]
    assert [v for x in ours for v in x] == pytest.approx([v for x in theirs for v in x], abs=1e-5)


def test_long_answers_continue_in_chunks_within_the_same_forward_pass(models):
    r = ppo_reward.load_reward(*models, aggregation="min")
    counter = ForwardCounter(r.prm.model)
    try:
        long_answer = [f"Step {i}: " + "we add the numbers carefully and write them down " * 6 for i in range(1, 13)]
        assert len(r.prm.encode("How many apples?", long_answer)) > 1  # longer than max_length: several chunks
        scores = r.prm(["How many apples?", "Short one?"], [long_answer, ["Step 1: 1 + 1 = 2"]])
        assert counter.calls == 1 and [len(s) for s in scores] == [12, 1]
        assert all(0.0 < v < 1.0 for v in scores[0])  # every step scored, none left at the 0.0 default
    finally:
        counter.handle.remove()
