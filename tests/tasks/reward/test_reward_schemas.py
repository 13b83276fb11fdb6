"""The schemas of the reward-data judge calls: IRM rankings and PRM step labels, sent as response_format
json_schema and met by the scripted judge's replies."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from evolforge.tasks.core import structured
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.reward.irm import rank_group
from evolforge.tasks.reward.prm import label_answer
from evolforge.tasks.reward.schemas import ranking_model, step_labels_model
from evolforge.testing.settings import make_settings


def test_ranking_schema_has_exactly_the_labels():
    model = ranking_model(("A", "B", "C"), True)
    schema = structured.strict_schema(model)
    ranking = schema["properties"]["ranking"]
    assert ranking["minItems"] == ranking["maxItems"] == 3 and ranking["items"]["enum"] == ["A", "B", "C"]
    scores = schema["$defs"][next(iter(schema["$defs"]))]
    assert scores["required"] == ["A", "B", "C"] and scores["additionalProperties"] is False
    model.model_validate({"ranking": ["B", "A", "C"], "scores": {"A": 5, "B": 9, "C": 1}})
    with pytest.raises(ValidationError):
        model.model_validate({"ranking": ["B", "A", "D"], "scores": {"A": 5, "B": 9, "C": 1}})
    assert "scores" not in structured.strict_schema(ranking_model(("A", "B"), False))["properties"]


def test_step_labels_schema_has_one_boolean_per_step():
    labels = structured.strict_schema(step_labels_model(4))["properties"]["labels"]
    assert labels["minItems"] == labels["maxItems"] == 4 and labels["items"] == {"type": "boolean"}


def _gateway(server, **reward):
    settings = make_settings(server.base_url, reward=reward, gateway={"backoff_base_seconds": 0.0})
    return Gateway(settings, base_url=server.base_url, run_id="r"), settings


def test_the_irm_ranking_call_carries_its_schema(server):
    gw, settings = _gateway(server)
    group = rank_group({"id": "i1", "instruction": "Add two numbers."}, gw, settings)
    assert group["status"] == "ranked"
    sent = [p["response_format"] for p in server.posts() if p["response_format"]]
    n = len(group["versions"])
    assert len(sent) == 1 and sent[0]["json_schema"]["name"] == f"irm_ranking_{n}"
    assert sent[0]["json_schema"]["schema"]["properties"]["ranking"]["maxItems"] == n


@pytest.mark.parametrize("method,name", [("judge", "prm_step_labels_2"), ("decorl", "JudgeScore")])
def test_the_prm_calls_carry_their_schema(server, method, name):
    gw, settings = _gateway(server, step_label_method=method)
    row = {"id": "a1", "instruction": "What is 2 plus 2?", "domain": "math",
           "answer": "Step 1: Add 2 and 2.\nStep 2: That makes 4.\nThe answer is: 4"}
    out = label_answer(row, gw, settings)
    assert out["status"] == "ok", out
    names = {p["response_format"]["json_schema"]["name"] for p in server.posts() if p["response_format"]}
    assert names == {name}
