"""A judge's 0-10 score read from its (parsed) JSON reply: used by the PRM labels and the module-graph judge."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field


def parse_score(value: object) -> float | None:
    """{"score": 7}, {"rating": "8/10"}, 6.5 or "7 out of 10" -> the score; None when absent, not a number,
    a boolean, or outside 0..10."""
    raw = value.get("score", value.get("rating")) if isinstance(value, dict) else value
    if isinstance(raw, str):
        m = re.match(r"\s*(\d+(?:\.\d+)?)", raw)
        raw = float(m.group(1)) if m else None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    return float(raw) if 0.0 <= raw <= 10.0 else None


class JudgeScore(BaseModel):
    """The schema a judge's 0-10 score call asks for (response_format json_schema): {"score": an integer 0-10}.
    An integer keeps a grammar-constrained model inside the range (llama-server enforces integer bounds, not
    number bounds); `parse_score` still reads any number a prompt-only reply gives."""

    model_config = ConfigDict(extra="forbid")
    score: int = Field(ge=0, le=10)
