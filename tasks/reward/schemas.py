"""The schemas the reward-data judge's JSON calls ask for (response_format json_schema, tasks/core/structured.py).

- `ranking_model(labels, ask_scores)`: the IRM ranking of one group, {"ranking": [each label once, best first],
  "scores": {label: 0-10 each}} (scores only when `reward.ask_scores`). The array has exactly n entries drawn
  from the labels; that each appears once is checked by `parse_ranking` (a JSON schema cannot say it).
- `step_labels_model(n)`: the PRM step labels, {"labels": [exactly n booleans]}.
- DeCoRL scores use the shared `JudgeScore` ({"score": an integer 0-10}, tasks/text/scores.py).
The replies are still read by the tolerant parsers (irm.parse_ranking, prm.parse_step_labels), which also take
what a prompt-only reply may say.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from evolforge.tasks.text.scores import JudgeScore  # noqa: F401 - re-exported: the DeCoRL score's schema

Score = Annotated[int, Field(ge=0, le=10)]


@lru_cache(maxsize=64)
def ranking_model(labels: tuple[str, ...], ask_scores: bool = True) -> type[BaseModel]:
    label = Literal[labels]  # type: ignore[valid-type]
    n = len(labels)
    fields: dict = {"ranking": (Annotated[list[label], Field(min_length=n, max_length=n)], ...)}
    if ask_scores:
        scores = create_model(f"scores_{n}", __config__=ConfigDict(extra="forbid"),
                              **{lab: (Score, ...) for lab in labels})
        fields["scores"] = (scores, ...)
    return create_model(f"irm_ranking_{n}", __config__=ConfigDict(extra="forbid"), **fields)


@lru_cache(maxsize=64)
def step_labels_model(n: int) -> type[BaseModel]:
    return create_model(f"prm_step_labels_{n}", __config__=ConfigDict(extra="forbid"),
                        labels=(Annotated[list[bool], Field(min_length=n, max_length=n)], ...))
