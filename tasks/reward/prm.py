"""PRM data (RLEIF / DeCoRL / Math-Shepherd): step-by-step answers labelled step by step.

For one answer (`label_answer`, a plain function a test calls with any gateway):
  1. split it into steps with the one step splitter, tasks/text/steps.py (`steps_or_reason`: 'Step 1: ... Step 2:
     ...' markers, inline or one per line, in markdown bold or headings; else a numbered list '1. ... 2. ...';
     markers and any preamble dropped). The PPO reward (tasks/ppo/reward.py) splits responses with the same
     rules, so the PRM is scored on steps cut exactly as its training steps were. An answer that is not in step
     form is re-asked once with a stricter prompt (`reward.reask_unstepped`) or rejected with its reason: a PRM
     fed one step learns to always say 1, so nothing is ever labelled as one step;
  2. label the steps by `reward.step_label_method`:
     - judge: one JSON call, {"labels": [true, false, ...]}, one per step;
     - decorl: the judge scores the whole answer and the answer with step i removed (0-10, JSON);
       contribution_i = full - ablated_i, label = contribution_i > contribution_threshold;
     - modules: not a split of the answer: the instruction runs through the module graph of [modules]
       (tasks/modules/run.py), each non-exit module is a step, labelled contribution > modules.margin;
     - math_shepherd (math with a known final answer): `rollouts_per_step` completions sampled from each
       step prefix; a step's score is the share that reaches the known answer, label = share > threshold
       (final answers extracted and compared by tasks/text/answers.py: `extract_answer`, `answers_match`).
  3. the row keeps `raw_scores` (1/0, the contribution, or the share) and `scores` mapped to 0..1
     (judge: 1/0; decorl: (contribution + 10) / 20; math_shepherd: the share).
Unparseable or invalid judge replies are counted failures (status `label_failed`), never a crash.
"""

from __future__ import annotations

import re

from evolforge.config.settings import Settings
from evolforge.storage.journal import CallJournal
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.modules.run import label_with_modules
from evolforge.tasks.reward.prompts import continue_messages, score_messages, step_label_messages, strict_steps_messages
from evolforge.tasks.reward.schemas import JudgeScore, step_labels_model
from evolforge.tasks.text.answers import answers_match, extract_answer
from evolforge.tasks.text.scores import parse_score
from evolforge.tasks.text.steps import steps_or_reason

_TRUE = {"true", "correct", "yes", "y", "1", "+", "right", "valid", "good"}
_FALSE = {"false", "incorrect", "no", "n", "0", "-", "wrong", "invalid", "bad"}


def _as_bool(v: object) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str):
        s = v.strip().lower().strip(".!")
        return True if s in _TRUE else False if s in _FALSE else None
    if isinstance(v, dict):
        for k in ("correct", "is_correct", "label", "verdict", "valid", "value"):
            if k in v:
                return _as_bool(v[k])
    return None


def parse_step_labels(value: object, n: int) -> tuple[list[bool] | None, str | None]:
    raw = value
    if isinstance(value, dict):
        raw = next((value[k] for k in ("labels", "steps", "correct", "judgements", "verdicts", "results")
                    if k in value), value)
        if isinstance(raw, dict):  # {"1": true, "Step 2": false}
            keyed = {int(m.group(0)): v for k, v in raw.items() if (m := re.search(r"\d+", str(k)))}
            raw = [keyed.get(i) for i in range(1, n + 1)] if keyed else None
    if not isinstance(raw, list):
        return None, "no list of labels in the reply"
    if len(raw) != n:
        return None, f"{len(raw)} labels for {n} steps"
    labels = [_as_bool(v) for v in raw]
    if any(v is None for v in labels):
        return None, f"labels that are not true/false: {raw!r}"[:300]
    return labels, None


class LabelFailure(Exception):
    """The judge's reply could not be used; the answer is a counted failure."""


def _judge_labels(problem, steps, gw, settings, task_id, journal):
    parsed, _ = gw.chat_json("judge", step_label_messages(problem, steps), expect=(dict, list), task_id=task_id,
                             schema=step_labels_model(len(steps)),
                             purpose="prm-labels", temperature=settings.reward.judge_temperature,
                             max_tokens=settings.reward.judge_max_tokens, journal=journal)
    if parsed is None:
        raise LabelFailure("the judge's step labels hold no JSON")
    labels, reason = parse_step_labels(parsed, len(steps))
    if labels is None:
        raise LabelFailure(reason)
    raw = [1.0 if v else 0.0 for v in labels]
    return labels, raw, raw, 1


def _decorl_labels(problem, steps, gw, settings, task_id, journal):
    def score(subset: list[str], purpose: str) -> float:
        parsed, _ = gw.chat_json("judge", score_messages(problem, subset), expect=(dict, int, float, str),
                                 schema=JudgeScore, task_id=task_id, purpose=purpose, temperature=settings.reward.judge_temperature,
                                 max_tokens=settings.reward.judge_max_tokens, journal=journal)
        s = parse_score(parsed)
        if s is None:
            raise LabelFailure(f"{purpose}: no score from 0 to 10 in the judge's reply")
        return s

    full = score(steps, "prm-score-full")
    contributions = [full - score(steps[:i] + steps[i + 1:], f"prm-score-without-{i + 1}") for i in range(len(steps))]
    labels = [c > settings.reward.contribution_threshold for c in contributions]
    return labels, contributions, [min(1.0, max(0.0, (c + 10.0) / 20.0)) for c in contributions], len(steps) + 1


def _shepherd_labels(problem, steps, gw, settings, task_id, journal, reference):
    cfg, evo = settings.reward, settings.evol_instruct
    shares, calls = [], 0
    for i in range(1, len(steps)):
        hits = 0
        for j in range(cfg.rollouts_per_step):
            res = gw.chat("answer", continue_messages(problem, steps[:i]), task_id=task_id,
                          purpose=f"prm-rollout-{i}-{j}", temperature=evo.temperature, top_p=evo.top_p,
                          max_tokens=evo.max_new_tokens, journal=journal)
            calls += 1
            hits += answers_match(extract_answer(res.text), reference)
        shares.append(hits / cfg.rollouts_per_step)
    shares.append(1.0 if answers_match(extract_answer(steps[-1]), reference) else 0.0)  # the full answer itself
    return [s > cfg.shepherd_threshold for s in shares], shares, shares, calls


def label_answer(row: dict, gw: Gateway, settings: Settings, journal: CallJournal | None = None) -> dict:
    cfg, method = settings.reward, settings.reward.step_label_method
    if method == "modules":  # the module graph reasons on the instruction: one step per module (tasks/modules)
        return label_with_modules(row, gw, settings, journal)
    task_id, problem = f"prm-{row['id']}", row["instruction"]
    out = {"id": row["id"], "status": "ok", "reason": None, "method": method, "prompt": problem,
           "completions": None, "labels": None, "raw_scores": None, "scores": None, "reasked": False, "calls": 0}

    def reject(status: str, reason: str) -> dict:
        return {**out, "status": status, "reason": reason[:300]}

    reference = None
    if method == "math_shepherd":
        if (row.get("domain") or "general") != "math":
            return reject("rejected", "math_shepherd labels math answers only")
        reference = row.get("reference_answer") or (extract_answer(row.get("answer"))
                                                    if cfg.shepherd_reference == "own_answer" else None)
        if not reference:
            return reject("rejected", "no known final answer")
    if not (row.get("answer") or "").strip():
        return reject("rejected", "no answer")
    steps, why = steps_or_reason(row["answer"], cfg.min_steps)
    if steps is None:
        if not cfg.reask_unstepped:
            return reject("rejected", f"not in step form: {why}")
        res = gw.chat("answer", strict_steps_messages(problem), task_id=task_id, purpose="prm-reask",
                      temperature=0.0, max_tokens=settings.evol_instruct.max_new_tokens, journal=journal)
        out["reasked"], out["calls"] = True, 1
        steps, why = steps_or_reason(res.text, cfg.min_steps)
        if steps is None:
            return reject("rejected", f"not in step form after one re-ask: {why}")
    if len(steps) > cfg.max_steps:
        return reject("rejected", f"{len(steps)} steps (max_steps {cfg.max_steps})")
    out["completions"] = steps
    try:
        if method == "judge":
            labels, raw, scores, calls = _judge_labels(problem, steps, gw, settings, task_id, journal)
        elif method == "decorl":
            labels, raw, scores, calls = _decorl_labels(problem, steps, gw, settings, task_id, journal)
        else:
            labels, raw, scores, calls = _shepherd_labels(problem, steps, gw, settings, task_id, journal, reference)
    except LabelFailure as e:
        return reject("label_failed", str(e))
    return {**out, "labels": labels, "raw_scores": raw, "scores": scores, "calls": out["calls"] + calls}


def error_row(row: dict, err: Exception) -> dict:
    return {"id": row["id"], "status": "error", "reason": str(err)[:500], "method": None, "prompt": row["instruction"],
            "completions": None, "labels": None, "raw_scores": None, "scores": None, "reasked": False, "calls": 0}
