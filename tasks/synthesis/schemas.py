"""The schemas the synthesis calls ask for (response_format json_schema, tasks/core/structured.py): a code
proposal, a math proposal and a repair, the keys the prompts of tasks/synthesis/prompts.py name. The replies are
still checked by synthesize.py (non-empty strings, an identifier entry point, a numeric answer)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Code = Annotated[str, Field(min_length=1)]
Text = Annotated[str, Field(min_length=1)]


class CodeProposal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    statement: Text
    entry_point: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
    solution: Code
    tests: Code


class MathProposal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    problem: Text
    steps: Annotated[list[Text], Field(min_length=1, max_length=12)]
    answer: Annotated[str, Field(min_length=1, max_length=40)]


class CodeRepair(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fixed: Literal["solution", "tests", "both"]
    solution: Code
    tests: Code
    explanation: Text
