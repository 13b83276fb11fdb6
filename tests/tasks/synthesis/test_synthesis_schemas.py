"""The synthesis proposal calls ask for their schema (response_format json_schema)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from evolforge.tasks.core import structured
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.synthesis import synthesize as synth
from evolforge.tasks.synthesis.schemas import CodeProposal, CodeRepair, MathProposal
from evolforge.testing.scripted_server import synthesis_reply
from evolforge.testing.settings import make_settings


@pytest.mark.parametrize("model", [CodeProposal, MathProposal, CodeRepair])
def test_schemas_are_strict(model):
    schema = structured.strict_schema(model)
    assert schema["additionalProperties"] is False and schema["required"] == list(schema["properties"])


def test_the_scripted_replies_meet_the_schemas_and_a_bad_entry_point_does_not():
    from evolforge.tasks.synthesis import prompts as P

    CodeProposal.model_validate(json.loads(synthesis_reply(P.PROPOSE_CODE.format(instruction="x"))))
    MathProposal.model_validate(json.loads(synthesis_reply(P.PROPOSE_MATH.format(instruction="x"))))
    with pytest.raises(ValidationError):
        CodeProposal.model_validate({"statement": "s", "entry_point": "not an identifier", "solution": "x",
                                     "tests": "y"})


def test_the_math_proposal_call_carries_its_schema(server):
    model = make_settings().models.default
    settings = make_settings(server.base_url, synthesis={"solver_attempts": 1})
    gw = Gateway(settings, base_url=server.base_url, run_id="t", embedded_models={model})
    task = synth.synthesize_task({"id": "m", "instruction": "Apples in boxes."}, "math", gw, settings)
    assert task.status == "kept", task.reject_reason
    sent = [p["response_format"] for p in server.posts()]
    assert sent[0]["json_schema"]["name"] == "MathProposal" and sent[1:] == [None]  # the solver's call is text
