"""The Equal judge asks for {"verdict": "Equal" | "Not Equal"} (response_format json_schema); its reply is read
as that JSON, or as text when an endpoint gives text."""

from __future__ import annotations

import pytest

from evolforge.tasks.core import structured
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.evolve import elimination as rules
from evolforge.tasks.evolve.evolution import evolve_record
from evolforge.testing.settings import make_settings


@pytest.mark.parametrize("text,verdict", [
    ('{"verdict": "Equal"}', "equal"), ('{"verdict": "Not Equal"}', "not_equal"),
    ("Not Equal", "not_equal"), ("Equal.", "equal"), ('{"verdict": "maybe"}', None), ("", None),
])
def test_parse_equal_reply(text, verdict):
    assert rules.parse_equal_reply(text) == verdict


def test_the_schema_is_the_two_published_answers():
    schema = structured.strict_schema(rules.EqualVerdict)
    assert schema["properties"]["verdict"]["enum"] == ["Equal", "Not Equal"] and schema["additionalProperties"] is False


@pytest.mark.parametrize("verdict,status", [("Equal", "eliminated"), ("Not Equal", "accepted")])
def test_the_judge_call_carries_the_schema_and_its_json_decides(server, verdict, status):
    server.judge_verdict = verdict
    settings = make_settings(server.base_url, evol_instruct={"answer": False})
    gw = Gateway(settings, base_url=server.base_url, run_id="r")
    evo = evolve_record({"id": "r1", "instruction": "Add two numbers.", "seed_id": "r1"}, 1, gw,
                        settings.evol_instruct)
    names = [p["response_format"]["json_schema"]["name"] for p in server.posts() if p["response_format"]]
    assert names == ["Rewrite", "EqualVerdict"]  # the rewrite's schema, then the judge's
    assert evo.status == status and evo.judge_verdict == ("equal" if verdict == "Equal" else "not_equal")


def test_a_text_only_endpoint_still_gets_a_verdict(server):
    structured.forget_modes()
    server.reject_formats = {"json_schema", "json_object"}
    settings = make_settings(server.base_url, evol_instruct={"answer": False})
    gw = Gateway(settings, base_url=server.base_url, run_id="r")
    try:
        evo = evolve_record({"id": "r1", "instruction": "Add two numbers.", "seed_id": "r1"}, 1, gw,
                            settings.evol_instruct)
        assert evo.judge_verdict == "not_equal"  # the scripted text reply "Not Equal"
    finally:
        structured.forget_modes()
