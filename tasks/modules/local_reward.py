"""Module-local rewards (DeCoRL, issue 39): a module's own output checked on its own terms, beside its contribution.

    local_reward(record, answer_correct=None, weight=0.5) -> dict
        parts: schema (1.0 when the output passed the module's output schema, else 0.0 with the status's reason);
               own (the module kind's own check, or None with a reason when it does not apply):
                 steps / result: every "a op b = c" it states re-done with the safe evaluator
                 (tasks/text/checks.eval_number: no names, no calls, never eval of model text); 1.0 all right,
                 0.0 any wrong, None when it states no arithmetic;
                 verdict: its ok flag against the final answer's correctness when the ground truth is known;
                 other kinds (factcheck against named sources is not built yet): None with a reason.
        reward = 0 when schema is 0; else schema when own is None; else (1 - w) * schema + w * own,
        w = modules.local_reward_weight. `recompute(parts, weight)` gives it back from the stored parts.
"""
from __future__ import annotations

import json
import re

from evolforge.tasks.text.checks import eval_number

_EQ = re.compile(r"([0-9][0-9.,\s+\-*/()^]*[+\-*/^][0-9.,\s+\-*/()^]*[0-9)])\s*=\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def _texts(content) -> list[str]:
    if isinstance(content, (int, float)) and not isinstance(content, bool):
        return [str(content)]
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [t for c in content for t in _texts(c)]
    if isinstance(content, dict):
        return [t for c in content.values() for t in _texts(c)]
    return []


def arithmetic_check(content) -> tuple[float | None, str]:
    """Re-do every 'expression = number' the content states; (1.0 | 0.0 | None, reason)."""
    stated = [(e.strip(), v) for t in _texts(content) for e, v in _EQ.findall(t)]
    if not stated:
        return None, "no arithmetic stated"
    for expr, value in stated:
        got, want = eval_number(expr), eval_number(value)
        if got is None or want is None:
            return 0.0, f"not re-doable: {expr} = {value}"
        if abs(got - want) > 1e-6 * max(1.0, abs(got)):
            return 0.0, f"wrong arithmetic: {expr} = {value} (is {got:g})"
    return 1.0, f"{len(stated)} equation(s) re-done"


def recompute(parts: dict, weight: float) -> float:
    """The combined local reward from stored parts (schema, own) and the weight of the own check."""
    schema, own = parts["schema"], parts["own"]
    if not schema:
        return 0.0
    if own is None:
        return round(float(schema), 6)
    return round((1.0 - weight) * float(schema) + weight * float(own), 6)


def local_reward(record: dict, answer_correct: bool | None = None, weight: float = 0.5) -> dict:
    """The local reward of one module record (tasks/modules/run._module_record's row)."""
    raw = record.get("output")
    output = json.loads(raw) if isinstance(raw, str) else raw
    kind = record.get("output_type")
    if record.get("status") != "ok" or not isinstance(output, dict):
        parts = {"schema": 0.0, "schema_reason": record.get("reason") or f"no valid output ({record.get('status')})",
                 "own": None, "own_reason": "no valid output to check"}
    else:
        parts = {"schema": 1.0, "schema_reason": "output passed its schema"}
        content = output.get("content")
        if kind in ("steps", "result"):
            parts["own"], parts["own_reason"] = arithmetic_check(content)
        elif kind == "verdict":
            ok = content.get("ok") if isinstance(content, dict) else None
            if answer_correct is None:
                parts["own"], parts["own_reason"] = None, "ground truth unknown"
            elif not isinstance(ok, bool):
                parts["own"], parts["own_reason"] = 0.0, "verdict has no ok flag"
            else:
                parts["own"] = 1.0 if ok == answer_correct else 0.0
                parts["own_reason"] = f"verdict ok={ok}, final answer correct={answer_correct}"
        else:
            parts["own"], parts["own_reason"] = None, f"no own check for output type {kind}"
    return {"local_reward": recompute(parts, weight), "local_parts": {**parts, "weight": weight}}
