"""The output schema of a module: {type, content, confidence, dependencies}, `content` typed per output type.

What counts as a valid output (`validate_reply`): the reply holds one JSON object (fenced or wrapped JSON is
recovered, tasks/core/json_parse.py) with
  - type: exactly the module's output type;
  - content: steps / concepts / alternatives: a non-empty list of non-empty strings; entities: an object of
    string -> string, or a list of {"name", "what"} pairs (the form the wire schema asks for); verdict: {"ok": true|false, "issues": [strings]}; result: a non-empty string or a number;
    final: a non-empty string;
  - confidence: a number from 0 to 1 (not a boolean);
  - dependencies: a list of ids, each one of the module's own dependencies (the inputs it used).
Unknown extra keys are ignored. Anything else is invalid, with a short reason that the re-ask quotes.

`reply_model(type, deps)` is the schema a module's call asks for (response_format json_schema, tasks/core/
structured.py): strict (no extra keys, every key required), `type` fixed, `dependencies` drawn from the module's
own inputs, and lists and strings bounded by the call's token budget, so a grammar-constrained small model closes
its JSON within its token cap.
It is stricter than `validate_reply` (which also takes what a prompt-only reply may say).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError, create_model, field_validator

from evolforge.tasks.core.json_parse import JSONParseFailure, extract_json
from evolforge.tasks.core.structured import char_budget

Text = Annotated[StrictStr, Field(min_length=1)]


class Verdict(BaseModel):
    model_config = ConfigDict(extra="ignore")
    ok: StrictBool
    issues: list[StrictStr]


class _Output(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    confidence: float = Field(ge=0, le=1)
    dependencies: list[StrictStr]

    @field_validator("confidence", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("a number from 0 to 1, not a boolean")
        return v


class StepsOutput(_Output):
    type: Literal["steps"]
    content: list[Text] = Field(min_length=1)


class ConceptsOutput(_Output):
    type: Literal["concepts"]
    content: list[Text] = Field(min_length=1)


class EntitiesOutput(_Output):
    type: Literal["entities"]
    content: dict[StrictStr, StrictStr]

    @field_validator("content", mode="before")
    @classmethod
    def _pairs(cls, v: Any) -> Any:
        """[{"name": "n", "what": "w"}, ...] (the wire schema's form) -> {"n": "w", ...}."""
        if isinstance(v, list) and all(isinstance(p, dict) and set(p) == {"name", "what"} for p in v):
            return {p["name"]: p["what"] for p in v}
        return v


class VerdictOutput(_Output):
    type: Literal["verdict"]
    content: Verdict


class ResultOutput(_Output):
    type: Literal["result"]
    content: Text | float

    @field_validator("content", mode="before")
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("a string or a number, not a boolean")
        return v


class AlternativesOutput(_Output):
    type: Literal["alternatives"]
    content: list[Text] = Field(min_length=1)


class FinalOutput(_Output):
    type: Literal["final"]
    content: Text


SCHEMAS: dict[str, type[_Output]] = {
    "steps": StepsOutput, "concepts": ConceptsOutput, "entities": EntitiesOutput, "verdict": VerdictOutput,
    "result": ResultOutput, "alternatives": AlternativesOutput, "final": FinalOutput,
}

# the form of `content` per output type, as the prompts show it
CONTENT_FORM = {
    "steps": '["first step", "second step", ...]',
    "concepts": '["concept", "another concept", ...]',
    "entities": '[{"name": "entity name", "what": "what it is"}, ...]',
    "verdict": '{"ok": true or false, "issues": ["problem found", ...]}',
    "result": "the result: a number, or a short string",
    "alternatives": '["one way to put it", "another way", ...]',
    "final": '"the final answer, as a string"',
}


# ------------------------------------------------------------------------------ the schema a module call asks for
WIRE_MAX_ITEMS = 6  # list contents: at most this many entries (fewer when the token budget is small)
RESULT_MAX_CHARS = 60  # a result is a number or a short string
# a confidence in tenths: llama-server's grammar enforces an enum but not a number's range (a 135M model said 10)
CONFIDENCE_VALUES = [0, *(round(i / 10, 1) for i in range(1, 10)), 1]


def _text(max_chars: int) -> Any:
    return Annotated[str, Field(min_length=1, max_length=max(8, max_chars))]


@lru_cache(maxsize=512)
def reply_model(output_type: str, deps: tuple[str, ...], max_tokens: int = 512) -> type[BaseModel]:
    """The strict schema of one module's reply: {type, content, confidence, dependencies} (see the module doc).
    String lengths are sized to the call's token budget (`char_budget`): a list gets 2 to WIRE_MAX_ITEMS entries
    of an equal share, a final answer the whole budget, a result at most RESULT_MAX_CHARS."""
    chars = char_budget(max_tokens)
    items = min(WIRE_MAX_ITEMS, max(2, chars // 80))
    item = _text(chars // items)

    class Entity(BaseModel):
        model_config = ConfigDict(extra="forbid")
        name: _text(min(40, chars // items // 3))  # type: ignore[valid-type]
        what: _text(chars // items - min(40, chars // items // 3))  # type: ignore[valid-type]

    class VerdictContent(BaseModel):
        model_config = ConfigDict(extra="forbid")
        ok: bool
        issues: Annotated[list[item], Field(max_length=items)]  # type: ignore[valid-type]

    listed = Annotated[list[item], Field(min_length=1, max_length=items)]  # type: ignore[valid-type]
    content = {"steps": listed, "concepts": listed, "alternatives": listed,
               "entities": Annotated[list[Entity], Field(min_length=1, max_length=items)],
               "verdict": VerdictContent, "result": Union[_text(min(chars, RESULT_MAX_CHARS)), float],
               "final": _text(chars)}[output_type]
    dep = Literal[deps] if deps else str  # type: ignore[valid-type]
    return create_model(
        f"module_{output_type}_reply", __config__=ConfigDict(extra="forbid"),
        type=(Literal[output_type], ...),  # type: ignore[valid-type]
        content=(content, ...),
        confidence=(float, Field(ge=0, le=1, json_schema_extra={"enum": CONFIDENCE_VALUES})),
        dependencies=(list[dep], Field(max_length=len(deps))),  # type: ignore[valid-type]
    )


def _short_errors(err: ValidationError) -> str:
    parts = []
    for e in err.errors()[:4]:
        loc = ".".join(str(p) for p in e["loc"]) or "(object)"
        parts.append(f"{loc}: {e['msg']}")
    more = len(err.errors()) - 4
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def validate_reply(text: str | None, output_type: str, allowed_deps: list[str]) -> tuple[dict | None, str | None]:
    """(the validated output as a plain dict, None) or (None, the reason it is invalid)."""
    try:
        obj = extract_json(text, dict)
    except JSONParseFailure as e:
        return None, f"not a JSON object ({e})"[:300]
    try:
        out = SCHEMAS[output_type].model_validate(obj)
    except ValidationError as e:
        return None, _short_errors(e)[:300]
    stray = [d for d in out.dependencies if d not in allowed_deps]
    if stray:
        return None, (f"dependencies: {', '.join(map(repr, stray))} not among this module's inputs "
                      f"({', '.join(allowed_deps) or 'none'})")[:300]
    dumped = out.model_dump()
    data = {k: dumped[k] for k in ("type", "content", "confidence", "dependencies")}
    if isinstance(data["content"], float) and data["content"].is_integer():
        data["content"] = int(data["content"])
    return data, None
