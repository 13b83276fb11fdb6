"""Structured outputs through the gateway, against the scripted server: the json_schema a call carries, the
fallback to json_object and then to no response_format when an endpoint rejects the field, and the memory of
the mode that worked (per endpoint and model, for the process)."""

from __future__ import annotations

import logging
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from evolforge.storage.journal import CallJournal
from evolforge.storage.ledger import LedgerWriter, read_ledger
from evolforge.tasks.core import structured
from evolforge.tasks.core.gateway import Gateway, GatewayError
from evolforge.testing.settings import make_settings

MSG = [{"role": "user", "content": "Reply with JSON"}]


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool
    why: Annotated[str, Field(min_length=1, max_length=20)]


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["x"]
    items: Annotated[list[str], Field(min_length=1, max_length=3)]
    inner: Inner
    score: int = Field(ge=0, le=10)


@pytest.fixture(autouse=True)
def fresh_memory():
    structured.forget_modes()
    yield
    structured.forget_modes()  # a remembered downgrade must not reach another test on a reused port


def make_gateway(server, tmp_path, embedded=frozenset(), **gw):
    cfg = {"max_retries": 2, "backoff_base_seconds": 0.0, "timeout_seconds": 2.0}
    cfg.update(gw)
    settings = make_settings(server.base_url, gateway=cfg)
    ledger = LedgerWriter(tmp_path / "ledger", "run-test")
    return Gateway(settings, base_url=server.base_url, run_id="run-test", ledger=ledger, api_key="sk-test-123456789",
                   embedded_models=embedded)


def formats(server):
    return [(p["response_format"] or {}).get("type") for p in server.posts()]


def test_strict_schema_is_strict_compatible_at_every_level():
    schema = structured.strict_schema(Reply)
    inner = schema["$defs"]["Inner"]
    for obj in (schema, inner):
        assert obj["additionalProperties"] is False and obj["required"] == list(obj["properties"])
    assert schema["properties"]["kind"] == {"type": "string", "enum": ["x"]}  # const -> a one-value enum
    assert schema["properties"]["items"]["maxItems"] == 3 and schema["properties"]["score"]["maximum"] == 10
    assert "title" not in schema and "title" not in inner and "minLength" not in inner["properties"]["why"]
    kept = structured.strict_schema(Reply, keep_lengths=True)["$defs"]["Inner"]["properties"]["why"]
    assert kept["minLength"] == 1 and kept["maxLength"] == 20


def test_a_schema_call_carries_the_stage_schema_strict(server, tmp_path):
    gw = make_gateway(server, tmp_path)
    parsed, _ = gw.chat_json("judge", MSG, task_id="t", schema=Reply)
    assert parsed is not None
    fmt = server.posts()[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "Reply"
    assert fmt["json_schema"]["strict"] is True and fmt["json_schema"]["schema"] == structured.strict_schema(Reply)
    gw.chat_json("judge", MSG, task_id="t2")  # no schema: json_object, as before
    assert formats(server) == ["json_schema", "json_object"]
    gw.chat("judge", MSG, task_id="t3")  # a text call: no response_format
    assert formats(server)[-1] is None


def test_string_lengths_are_kept_for_the_embedded_model_only(server, tmp_path):
    model = make_settings(server.base_url).models.default
    make_gateway(server, tmp_path, embedded={model}).chat("judge", MSG, task_id="t", schema=Reply)
    make_gateway(server, tmp_path).chat("judge", MSG, task_id="t", schema=Reply)
    make_gateway(server, tmp_path, schema_string_lengths="keep").chat("judge", MSG, task_id="t", schema=Reply)
    whys = [p["response_format"]["json_schema"]["schema"]["$defs"]["Inner"]["properties"]["why"]
            for p in server.posts()]
    assert ["maxLength" in w for w in whys] == [True, False, True]


def test_json_schema_rejected_falls_back_to_json_object_and_is_remembered(server, tmp_path, caplog):
    server.reject_formats = {"json_schema"}
    gw = make_gateway(server, tmp_path)
    with caplog.at_level(logging.WARNING, logger="evolforge.gateway"):
        parsed, res = gw.chat_json("judge", MSG, task_id="t1", schema=Reply)
        assert parsed is not None and res.attempts == 2
        assert formats(server) == ["json_schema", "json_object"]
        # the next calls go out as json_object at once, from this gateway and from another one in the process
        gw.chat_json("judge", MSG, task_id="t2", schema=Reply)
        other = make_gateway(server, tmp_path)
        other.chat_json("judge", MSG, task_id="t3", schema=Reply)
        assert formats(server) == ["json_schema", "json_object", "json_object", "json_object"]
        assert gw.structured_mode() == "json_object" and gw.stats.format_downgrades == 1
    warnings = [r for r in caplog.records if "rejected response_format json_schema" in r.getMessage()]
    assert len(warnings) == 1 and "json_object" in warnings[0].getMessage()
    # another model at the same endpoint has its own memory: it is asked with json_schema first
    gw.chat_json("judge", MSG, task_id="t4", schema=Reply, model="other-model")
    assert formats(server)[-2:] == ["json_schema", "json_object"]
    rows = read_ledger(tmp_path).sort("ts")
    assert rows["outcome"].to_list()[:2] == ["http_400", "ok"]  # the refused request is in the ledger


def test_both_formats_rejected_fall_back_to_the_prompt_and_tolerant_parsing(server, tmp_path, caplog):
    server.reject_formats = {"json_schema", "json_object"}
    server.reject_format_status = 422
    server.script(*['text:Sure! Here it is: {"kind": "x", "items": ["a"]} Hope it helps.'] * 3)  # prose around JSON
    gw = make_gateway(server, tmp_path)
    with caplog.at_level(logging.WARNING, logger="evolforge.gateway"):
        for i in range(3):
            parsed, _ = gw.chat_json("judge", MSG, task_id=f"t{i}", schema=Reply)
            assert parsed == {"kind": "x", "items": ["a"]}  # recovered by the tolerant parser
    assert formats(server) == ["json_schema", "json_object", None, None, None]
    assert gw.structured_mode() == "prompt"
    assert sum("rejected response_format" in r.getMessage() for r in caplog.records) == 1


def test_a_remembered_json_object_goes_down_to_the_prompt_when_it_is_refused_too(server, tmp_path):
    gw = make_gateway(server, tmp_path)
    server.reject_formats = {"json_schema"}
    gw.chat_json("judge", MSG, task_id="t1", schema=Reply)
    server.reject_formats = {"json_schema", "json_object"}
    gw.chat_json("judge", MSG, task_id="t2", schema=Reply)
    assert formats(server) == ["json_schema", "json_object", "json_object", None]
    assert gw.structured_mode() == "prompt"


def test_a_plain_400_is_no_format_problem_and_fails_at_once(server, tmp_path):
    server.script("400")  # "scripted 400": nothing about response_format
    gw = make_gateway(server, tmp_path)
    with pytest.raises(GatewayError) as ei:
        gw.chat_json("judge", MSG, task_id="t", schema=Reply)
    assert ei.value.status == 400 and len(server.posts()) == 1
    assert gw.structured_mode() == "json_schema"


def test_a_request_every_mode_refuses_raises_and_remembers_nothing(server, tmp_path):
    server.script("400rf", "400rf", "400rf")  # a 400 naming the schema whatever the request carries
    gw = make_gateway(server, tmp_path)
    with pytest.raises(GatewayError) as ei:
        gw.chat_json("judge", MSG, task_id="t", schema=Reply)
    assert ei.value.status == 400 and formats(server) == ["json_schema", "json_object", None]
    assert structured.remembered_mode(server.base_url, gw.model_for("judge")) is None


def test_the_journal_key_is_the_asked_format_so_a_downgraded_call_replays(server, tmp_path):
    server.reject_formats = {"json_schema"}
    journal = CallJournal(str(tmp_path / "journal.jsonl"))
    gw = make_gateway(server, tmp_path)
    first, _ = gw.chat_json("judge", MSG, task_id="t", schema=Reply, journal=journal)
    structured.forget_modes()  # a new process: nothing remembered
    again, res = make_gateway(server, tmp_path).chat_json("judge", MSG, task_id="t", schema=Reply, journal=journal)
    assert res.replayed and again == first and len(server.posts()) == 2
    journal.close()


@pytest.mark.parametrize("setting,expected", [("json_object", ["json_object", "json_object"]),
                                              ("prompt", [None, None])])
def test_the_setting_caps_what_a_call_asks_for(server, tmp_path, setting, expected):
    gw = make_gateway(server, tmp_path, structured_outputs=setting)
    gw.chat_json("judge", MSG, task_id="t1", schema=Reply)
    gw.chat_json("judge", MSG, task_id="t2")
    assert formats(server) == expected


# ------------------------------------------------------------------------------ the real embedded model
@pytest.mark.slow
@pytest.mark.embedded
def test_the_embedded_model_returns_schema_valid_json_for_every_call_kind(tmp_path):
    """llama-server turns the json_schema into a grammar: the 135M model's replies meet the stages' schemas."""
    from evolforge.tasks.core.embedded_model import embedded_server
    from evolforge.tasks.core.llama_server import chosen_server
    from evolforge.tasks.evolve import prompts as evolve_prompts
    from evolforge.tasks.evolve.elimination import EQUAL_JUDGE_MAX_TOKENS, EqualVerdict
    from evolforge.tasks.modules.prompts import judge_messages, module_messages
    from evolforge.tasks.modules.schema import reply_model, validate_reply
    from evolforge.tasks.reward.prompts import step_label_messages
    from evolforge.tasks.reward.schemas import step_labels_model
    from evolforge.tasks.synthesis import prompts as synthesis_prompts
    from evolforge.tasks.synthesis.schemas import math_proposal_model
    from evolforge.tasks.text.scores import JudgeScore

    settings = make_settings()
    if chosen_server(settings.embedded) != "llama-server":
        pytest.skip("llama-server is not built (evolforge serve-model --build)")
    question = "A farmer has 12 cows and buys 5 more. How many cows does he have?"
    calls = [
        (EqualVerdict, evolve_prompts.equal_messages(question, question + " Explain why."),
         EQUAL_JUDGE_MAX_TOKENS),
        (JudgeScore, judge_messages(question, "17 cows.", "integrate"), 64),
        (step_labels_model(2), step_label_messages(question, ["12 + 5 = 17.", "So he has 17 cows."]), 64),
        (math_proposal_model(128),
         [{"role": "user", "content": synthesis_prompts.PROPOSE_MATH.format(instruction=question)}], 128),
    ]
    modules = [("parse", "steps", []), ("compute", "result", ["parse"]), ("verify", "verdict", ["compute"])]
    with embedded_server(settings.embedded, tmp_path) as url:
        gw = Gateway(settings, base_url=url, run_id="slow", embedded_models={settings.embedded.alias})
        for model, messages, max_tokens in calls:
            res = gw.chat("judge", messages, task_id=model.__name__, max_tokens=max_tokens, temperature=0.0,
                          schema=model)
            model.model_validate_json(res.text)  # raises when the reply is not of the schema
        for module_id, output, deps in modules:
            inputs = {d: f"[{d}] (steps) [\"12 + 5\"]" for d in deps}
            res = gw.chat("judge", module_messages(module_id, f"The {module_id} module.", output, question, deps,
                                                   inputs), task_id=module_id, max_tokens=128, temperature=0.0,
                          schema=reply_model(output, tuple(deps), 128))
            out, error = validate_reply(res.text, output, deps)
            assert error is None, (module_id, res.text, res.finish_reason)
        assert gw.stats.format_downgrades == 0 and gw.structured_mode() == "json_schema"
