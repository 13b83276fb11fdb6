"""The schemas the synthesis calls ask for (response_format json_schema, tasks/core/structured.py): a code
proposal, a math proposal, a code repair and a math repair, the keys the prompts of tasks/synthesis/prompts.py name. The replies are
still checked by synthesize.py (non-empty strings, an identifier entry point, a numeric answer).

Each is built for the call's token budget (`char_budget`): its strings share the characters the budget holds,
so a grammar-constrained model closes the JSON before the cap (lengths reach the wire only where the endpoint
takes them, gateway.schema_string_lengths). `CodeProposal`, `MathProposal` and `CodeRepair` are the schemas at
the default budget (synthesis.max_new_tokens 768)."""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from evolforge.tasks.core.structured import char_budget

DEFAULT_MAX_TOKENS = 768
# patterns are bounded themselves: llama-server's grammar takes a string's pattern instead of its lengths
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,39}$"
NUMBER_OR_EXPRESSION = r"^[0-9+*/(). -]{1,40}$"  # 42, 3/4, 3*4 + 2 (what chk.eval_number evaluates)
STRICT = ConfigDict(extra="forbid")


def _text(chars: int) -> object:
    return Annotated[str, Field(min_length=1, max_length=max(16, chars))]


@lru_cache(maxsize=64)
def code_proposal_model(max_tokens: int = DEFAULT_MAX_TOKENS) -> type[BaseModel]:
    chars = char_budget(max_tokens)
    return create_model(
        "CodeProposal", __config__=STRICT,
        statement=(_text(chars * 3 // 10), ...),
        entry_point=(Annotated[str, Field(pattern=IDENTIFIER)], ...),
        solution=(_text(chars * 3 // 10), ...),
        tests=(_text(chars * 4 // 10 - 40), ...),
    )


@lru_cache(maxsize=64)
def math_proposal_model(max_tokens: int = DEFAULT_MAX_TOKENS) -> type[BaseModel]:
    chars = char_budget(max_tokens)
    steps = min(8, max(2, chars // 120))
    return create_model(
        "MathProposal", __config__=STRICT,
        problem=(_text(chars * 4 // 10), ...),
        steps=(Annotated[list[_text(chars * 5 // 10 // steps)], Field(min_length=1, max_length=steps)], ...),
        answer=(Annotated[str, Field(pattern=NUMBER_OR_EXPRESSION)], ...),
    )


@lru_cache(maxsize=64)
def code_repair_model(max_tokens: int = DEFAULT_MAX_TOKENS) -> type[BaseModel]:
    chars = char_budget(max_tokens)
    return create_model(
        "CodeRepair", __config__=STRICT,
        fixed=(Literal["solution", "tests", "both"], ...),
        solution=(_text(chars * 4 // 10), ...),
        tests=(_text(chars * 4 // 10), ...),
        explanation=(_text(max(40, chars // 10)), ...),
    )


@lru_cache(maxsize=64)
def math_repair_model(max_tokens: int = DEFAULT_MAX_TOKENS) -> type[BaseModel]:
    chars = char_budget(max_tokens)
    return create_model(
        "MathRepair", __config__=STRICT,
        fixed=(Literal["problem", "answer", "both"], ...),
        problem=(_text(chars * 6 // 10), ...),
        answer=(Annotated[str, Field(pattern=NUMBER_OR_EXPRESSION)], ...),
        explanation=(_text(max(40, chars // 10)), ...),
    )


CodeProposal = code_proposal_model()
MathProposal = math_proposal_model()
CodeRepair = code_repair_model()
MathRepair = math_repair_model()
