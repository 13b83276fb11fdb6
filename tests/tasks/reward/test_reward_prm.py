"""PRM data: step splitting, re-ask, and the three labelling methods against the scripted judge."""

from __future__ import annotations

import pytest

from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.reward.prm import label_answer, parse_score, parse_step_labels
from evolforge.tasks.text.answers import answers_match, extract_answer
from evolforge.tasks.text.steps import steps_or_reason
from evolforge.testing.settings import make_settings

GOOD_WRONG_GOOD = "Step 1: Add 40 and 2.\nStep 2: This is wrong: subtract 35.\nStep 3: So 40 + 2 = 42.\nThe answer is: 42"


def gateway(server, **reward):
    settings = make_settings(server.base_url, reward=reward,
                             gateway={"backoff_base_seconds": 0.0, "timeout_seconds": 2.0})
    return Gateway(settings, base_url=server.base_url, run_id="r"), settings


def row(answer, domain="math", reference=None):
    return {"id": "a1", "instruction": "What is 40 plus 2?", "answer": answer, "domain": domain,
            "reference_answer": reference}


@pytest.mark.parametrize("answer,steps", [
    ("Step 1: Read. Step 2: Add 3 and 4.\nThe answer is: 7", ["Read.", "Add 3 and 4.\nThe answer is: 7"]),
    ("**Step 1:** read it\n**Step 2:** add them", ["read it", "add them"]),
    ("Sure!\n### Step 1\nread\n### Step 2\nadd, as in step 1. then stop", ["read", "add, as in step 1. then stop"]),
    ("step 1 - read\nSTEP 2) add\nStep 3. done", ["read", "add", "done"]),
    ("1. add the numbers\n2) divide by two", ["add the numbers", "divide by two"]),
])
def test_split_steps(answer, steps):
    assert steps_or_reason(answer) == (steps, None)


@pytest.mark.parametrize("answer,why", [
    ("The answer is 42.", "no 'Step 1"), ("", "empty"), (None, "empty"),
    ("Step 1: everything at once. The answer is 42.", "only 1 step"),  # never labelled as one step
    ("Step 1: a. Step 3: c.", "only 1 step"),  # numbering must run 1, 2, 3
    ("Step 1: a\nStep 2:\n", "empty"),
])
def test_not_step_form_is_rejected_with_a_reason(answer, why):
    steps, reason = steps_or_reason(answer)
    assert steps is None and why in reason


def test_final_answers_and_comparison():
    # the shared extractor (tasks/text/answers.py) drops the '$' and the trailing '.' ('$1,200.' before)
    assert extract_answer("Step 2: so.\nThe final answer is: $1,200.") == "1,200"
    assert extract_answer("#### 17") == "17" and extract_answer("so \\boxed{3.5}") == "3.5"
    assert answers_match("$1,200.", "1200") and answers_match("x = 3", "3") and not answers_match("7", "42")
    assert not answers_match(None, "42")


def test_parse_step_labels_and_scores():
    assert parse_step_labels({"labels": [True, "incorrect", 1]}, 3) == ([True, False, True], None)
    assert parse_step_labels({"steps": [{"step": 1, "correct": "yes"}, {"step": 2, "correct": False}]}, 2)[0] == [True, False]
    assert parse_step_labels({"labels": {"Step 1": True, "Step 2": False}}, 2)[0] == [True, False]
    assert parse_step_labels([False, True], 2)[0] == [False, True]
    assert "2 labels for 3 steps" in parse_step_labels({"labels": [True, True]}, 3)[1]
    assert "not true/false" in parse_step_labels({"labels": [True, "maybe"]}, 2)[1]
    assert parse_step_labels({"verdict": "fine"}, 2)[0] is None
    assert [parse_score(v) for v in ({"score": 7}, {"score": "8/10"}, 6.5, {"score": 11}, {"score": True}, "x")] == \
        [7.0, 8.0, 6.5, None, None, None]


def test_judge_labels_each_step(server):
    gw, settings = gateway(server, step_label_method="judge")
    out = label_answer(row(GOOD_WRONG_GOOD), gw, settings)
    assert out["status"] == "ok" and out["labels"] == [True, False, True]
    assert out["raw_scores"] == out["scores"] == [1.0, 0.0, 1.0] and out["calls"] == 1
    assert out["completions"][0] == "Add 40 and 2." and out["prompt"] == "What is 40 plus 2?"


def test_decorl_counterfactual_contribution(server):
    gw, settings = gateway(server, step_label_method="decorl")
    out = label_answer(row(GOOD_WRONG_GOOD), gw, settings)
    # scripted judge: 2 + 2 per good step - 3 per wrong step -> full 3; without each step: 1, 6, 1
    assert out["raw_scores"] == [2.0, -3.0, 2.0] and out["labels"] == [True, False, True]
    assert out["scores"] == [0.6, 0.35, 0.6] and out["calls"] == 4 and len(server.posts()) == 4
    gw2, settings2 = gateway(server, step_label_method="decorl", contribution_threshold=2.0)
    assert label_answer(row(GOOD_WRONG_GOOD), gw2, settings2)["labels"] == [False, False, False]


def test_math_shepherd_rollouts(server):
    gw, settings = gateway(server, step_label_method="math_shepherd", rollouts_per_step=2)
    out = label_answer(row(GOOD_WRONG_GOOD, reference="42"), gw, settings)
    # prefix 1 -> rollouts reach 42; prefix 1-2 holds the wrong step -> 7; step 3 is the answer itself (42)
    assert out["raw_scores"] == [1.0, 0.0, 1.0] and out["labels"] == [True, False, True]
    assert out["calls"] == 4 and len(server.posts()) == 4
    assert label_answer(row(GOOD_WRONG_GOOD, reference="41"), gw, settings)["labels"] == [False, False, False]
    no_ref = label_answer(row(GOOD_WRONG_GOOD), gw, settings)
    assert no_ref["status"] == "rejected" and "no known final answer" in no_ref["reason"]
    assert "math" in label_answer(row(GOOD_WRONG_GOOD, domain="code", reference="42"), gw, settings)["reason"]
    gw3, own = gateway(server, step_label_method="math_shepherd", rollouts_per_step=1, shepherd_reference="own_answer")
    assert label_answer(row(GOOD_WRONG_GOOD), gw3, own)["status"] == "ok"


def test_unstepped_answer_is_reasked_once(server):
    gw, settings = gateway(server)
    out = label_answer(row("It is 42."), gw, settings)
    assert out["status"] == "ok" and out["reasked"] and len(out["completions"]) == 2  # scripted reply has 2 steps
    assert out["calls"] == 2 and len(server.posts()) == 2

    server.script("text:It is just 42, trust me.")
    again = label_answer(row("Forty-two."), gw, settings)
    assert again["status"] == "rejected" and "after one re-ask" in again["reason"] and again["labels"] is None

    gw2, strict = gateway(server, reask_unstepped=False)
    before = len(server.posts())
    no = label_answer(row("Step 1: all of it, 42."), gw2, strict)
    assert no["status"] == "rejected" and "only 1 step" in no["reason"] and len(server.posts()) == before


@pytest.mark.parametrize("reply,why", [
    ('text:{"labels": [true]}', "1 labels for 3 steps"),
    ("text:All steps look fine to me.", "no JSON"),
    ('text:{"labels": ["perhaps", true, true]}', "not true/false"),
])
def test_bad_step_labels_are_counted_failures(server, reply, why):
    gw, settings = gateway(server)
    server.script(reply)
    out = label_answer(row(GOOD_WRONG_GOOD), gw, settings)
    assert out["status"] == "label_failed" and why in out["reason"] and out["labels"] is None


def test_decorl_unparseable_score_is_a_failure(server):
    gw, settings = gateway(server, step_label_method="decorl")
    server.script("ok", 'text:{"score": "excellent"}')
    out = label_answer(row(GOOD_WRONG_GOOD), gw, settings)
    assert out["status"] == "label_failed" and "prm-score-without-1" in out["reason"]


def test_too_many_steps_and_no_answer(server):
    gw, settings = gateway(server, max_steps=3)
    long = "\n".join(f"Step {i}: do part {i}." for i in range(1, 6))
    assert "5 steps" in label_answer(row(long), gw, settings)["reason"]
    assert label_answer(row(None), gw, settings)["reason"] == "no answer"
    assert not server.posts()
