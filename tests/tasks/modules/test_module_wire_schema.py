"""The schema a module's call asks for (response_format json_schema) and what validate_reply takes."""

from __future__ import annotations

import pytest

from evolforge.tasks.core import structured
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.modules.run import solve_item
from evolforge.tasks.modules.schema import SCHEMAS, reply_model, validate_reply
from evolforge.testing.scripted_server import MODULE_CONTENT
from evolforge.testing.settings import make_settings


@pytest.mark.parametrize("output_type", sorted(SCHEMAS))
def test_the_wire_schema_is_strict_and_the_scripted_reply_meets_both(output_type):
    model = reply_model(output_type, ("parse", "semantic"))
    schema = structured.strict_schema(model)
    assert schema["additionalProperties"] is False and schema["required"] == list(schema["properties"])
    assert schema["properties"]["type"]["enum"] == [output_type]
    assert schema["properties"]["dependencies"]["items"]["enum"] == ["parse", "semantic"]
    assert schema["properties"]["dependencies"]["maxItems"] == 2
    content = MODULE_CONTENT[output_type]
    if output_type == "entities":  # the wire form: name/what pairs
        content = [{"name": k, "what": v} for k, v in content.items()]
    reply = {"type": output_type, "content": content, "confidence": 0.5, "dependencies": ["parse"]}
    model.model_validate(reply)
    out, error = validate_reply(__import__("json").dumps(reply), output_type, ["parse", "semantic"])
    assert error is None and out["type"] == output_type


def test_entities_in_the_wire_form_become_an_object():
    reply = '{"type": "entities", "content": [{"name": "cow", "what": "an animal"}], "confidence": 1, "dependencies": []}'
    out, error = validate_reply(reply, "entities", [])
    assert error is None and out["content"] == {"cow": "an animal"}


def test_the_wire_schema_refuses_what_the_validator_refuses():
    model = reply_model("steps", ())
    from pydantic import ValidationError

    for bad in ({"type": "final", "content": ["x"], "confidence": 0.5, "dependencies": []},
                {"type": "steps", "content": [], "confidence": 0.5, "dependencies": []},
                {"type": "steps", "content": ["x"], "confidence": 2, "dependencies": []},
                {"type": "steps", "content": ["x"], "confidence": 0.5, "dependencies": ["parse"]},
                {"type": "steps", "content": ["x"], "confidence": 0.5, "dependencies": [], "extra": 1}):
        with pytest.raises(ValidationError):
            model.model_validate(bad)


def test_every_module_call_and_judge_call_carries_its_schema(server):
    settings = make_settings(server.base_url, gateway={"backoff_base_seconds": 0.0, "timeout_seconds": 5.0})
    gw = Gateway(settings, base_url=server.base_url, run_id="r")
    item = solve_item({"id": "q1", "question": "What is 40 plus 2?"}, gw, settings)
    assert item["status"] == "ok"
    names = [p["response_format"]["json_schema"]["name"] for p in server.posts()]
    graph = {m.id: m for m in settings.modules.graph}
    module_names = {f"module_{m.output}_reply" for m in graph.values()}
    assert module_names <= set(names) and names.count("JudgeScore") == item["judge_calls"]
    assert all(p["response_format"]["type"] == "json_schema" for p in server.posts())
    # a module's dependencies in its schema are its own inputs
    verify = next(m for m in graph.values() if m.dependencies)
    sent = [p["response_format"]["json_schema"]["schema"] for p in server.posts()
            if p["response_format"]["json_schema"]["name"] == f"module_{verify.output}_reply"]
    assert any(s["properties"]["dependencies"]["items"].get("enum") == list(verify.dependencies) for s in sent)
