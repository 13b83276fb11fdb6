"""IRM data (RLEIF): evolved versions of each instruction, ranked by a judge, turned into preference pairs.

For one instruction (`rank_group`, a plain function a test calls with any gateway):
  1. each variant model (`reward.variant_models`, at most two; empty: the `evolve` stage model) writes
     `variants_per_model` versions with the Evol-Instruct prompts; the operations are drawn by
     `choose_operation` (distinct per model where possible) with keys derived from (record id, model), so a
     resumed run draws the same operations and replays its calls from the batch journal;
  2. empty versions and exact duplicates are dropped (duplicates would make contradictory pairs);
  3. the judge ranks the versions plus the original on definition, precision and integrity in one JSON-mode
     call; the versions are shown in a seeded shuffled order under labels A, B, C... (no position bias);
  4. the reply is parsed tolerantly (`parse_ranking`); an unparseable reply or a ranking that is not a
     permutation of the labels is a counted failure (status `ranking_unparseable` / `ranking_invalid`,
     `failed_attempts`), never a crash. With `ranking_attempts` > 1 the judge is asked again, the versions
     in a new shuffled order, until a ranking is valid.
`pairs_from_group` turns a ranking of n versions into n(n-1)/2 pairs (prompt, chosen, rejected, margin):
`prompt` is the fixed rating prompt `reward.irm_prompt`, chosen/rejected are instruction texts, and
`margin` = rank gap / (n - 1), in (0, 1] (TRL subtracts it inside the pairwise loss).
"""

from __future__ import annotations

import re

from evolforge.config.settings import Settings
from evolforge.storage.journal import CallJournal
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.core.rng import seeded_rng
from evolforge.tasks.evolve.elimination import is_empty
from evolforge.tasks.evolve.evolution import choose_operation, clean_evolved
from evolforge.tasks.evolve.prompts import evolve_messages
from evolforge.tasks.reward.prompts import labels_for, rank_messages
from evolforge.tasks.reward.schemas import ranking_model

RANKING_KEYS = ("ranking", "rank", "ranked", "order", "best_to_worst", "rankings", "result")
SCORE_KEYS = ("scores", "score", "ratings", "quality")


def version_operations(settings: Settings, record_id: str, domain: str, model_index: int) -> list[str]:
    """The Evol-Instruct operations of one model's versions: drawn by `choose_operation` (the evolve run's
    up / down / in-breadth ratios), distinct where the draws allow, reproducible on resume."""
    n, ops = settings.reward.variants_per_model, []
    for attempt in range(8 * n):
        key = f"{record_id}#irm-{settings.reward.seed}-{model_index}-{attempt}"
        op = choose_operation(settings.evol_instruct, key, domain or "general", 0)
        if op not in ops or attempt >= 4 * n:
            ops.append(op)
        if len(ops) == n:
            break
    return ops


def _label_of(item: object, labels: list[str]) -> str | None:
    """'B', 'b', '[B]', 'Version B', 'B.' -> 'B'; 1-based / 0-based numbers are handled by the caller."""
    if not isinstance(item, str):
        return None
    s = item.strip().strip("[]()*.:'\" ").upper()
    s = re.sub(r"^(VERSION|OPTION|PROMPT|INSTRUCTION)\s*", "", s).strip("[]() ")
    return s if s in labels else None


def parse_ranking(value: object, labels: list[str]) -> tuple[list[int] | None, list[float] | None, str | None]:
    """(order as label indices best first, scores aligned with labels or None, failure reason or None)."""
    raw = value
    if isinstance(value, dict):
        raw = next((value[k] for k in RANKING_KEYS if k in value), None)
        if raw is None:
            lower = {str(k).lower(): v for k, v in value.items()}
            raw = next((lower[k] for k in RANKING_KEYS if k in lower), None)
    if raw is None and isinstance(value, dict) and value and all(_label_of(k, labels) for k in value):
        return _ranking_from_scores(value, labels)  # {"A": 5, "B": 7, "C": 2}: scores only
    if raw is None:
        return None, None, "no ranking in the reply"
    if isinstance(raw, dict):  # {"A": 2, "B": 1}: label -> position
        try:
            items = sorted(((float(v), _label_of(k, labels)) for k, v in raw.items()), key=lambda x: x[0])
        except (TypeError, ValueError):
            return None, None, "ranking positions are not numbers"
        raw = [lab for _, lab in items]
    if not isinstance(raw, list) or not raw:
        return None, None, "ranking is not a list"
    if all(isinstance(x, dict) for x in raw):  # [{"label": "B", "score": 6}, ...]
        raw = [next((x[k] for k in ("label", "id", "version", "name") if k in x), None) for x in raw]
    if all(isinstance(x, str) and x.strip().isdigit() for x in raw):
        raw = [int(x) for x in raw]
    if all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        base = 1 if set(raw) == set(range(1, len(labels) + 1)) else 0
        order = [x - base for x in raw]
    else:
        names = [_label_of(x, labels) for x in raw]
        if any(n is None for n in names):
            return None, None, f"unknown labels in ranking {raw!r} (expected {labels})"
        order = [labels.index(n) for n in names]
    if sorted(order) != list(range(len(labels))):
        return None, None, f"ranking {raw!r} is not a permutation of {labels}"
    return order, _parse_scores(value, labels), None


def _ranking_from_scores(value: dict, labels: list[str]) -> tuple[list[int] | None, list[float] | None, str | None]:
    scores = _parse_scores({"scores": value}, labels)
    if scores is None:
        return None, None, "a reply of scores only must score every label from 0 to 10"
    if len(set(scores)) < len(scores):
        return None, None, f"tied scores {scores} give no ranking"
    return sorted(range(len(labels)), key=lambda i: -scores[i]), scores, None


def _parse_scores(value: object, labels: list[str]) -> list[float] | None:
    if not isinstance(value, dict):
        return None
    raw = next((value[k] for k in SCORE_KEYS if k in value), None)
    try:
        if isinstance(raw, dict):
            by_label = {_label_of(k, labels): float(v) for k, v in raw.items()}
            scores = [by_label[lab] for lab in labels]
        elif isinstance(raw, list) and len(raw) == len(labels):
            scores = [float(v) for v in raw]
        else:
            return None
    except (KeyError, TypeError, ValueError):
        return None
    return scores if all(0.0 <= s <= 10.0 for s in scores) else None


def rank_group(row: dict, gw: Gateway, settings: Settings, journal: CallJournal | None = None) -> dict:
    cfg, evo = settings.reward, settings.evol_instruct
    task_id = f"irm-{row['id']}"
    group = {"id": row["id"], "status": "ranked", "reason": None, "versions": [row["instruction"]],
             "sources": ["original"], "ranking": None, "judge_scores": None,
             "judge_model": gw.model_for("judge"), "failed_attempts": 0, "calls": 0}
    seen = {_norm(row["instruction"])}
    for mi, model in enumerate(cfg.variant_models or [gw.model_for("evolve")]):
        for k, op in enumerate(version_operations(settings, row["id"], row.get("domain") or "general", mi)):
            res = gw.chat("evolve", evolve_messages(op, row["instruction"]), task_id=task_id, model=model,
                          purpose=f"irm-version-{mi}-{k}", temperature=cfg.variant_temperature, top_p=evo.top_p,
                          max_tokens=evo.max_new_tokens, journal=journal)
            group["calls"] += 1
            text = clean_evolved(res.text)
            if is_empty(text) or _norm(text) in seen:
                continue
            seen.add(_norm(text))
            group["versions"].append(text)
            group["sources"].append(f"{model}:{op}")
    n = len(group["versions"])
    if n < 2:
        return {**group, "status": "too_few_versions", "reason": "every version was empty or a duplicate"}
    labels = labels_for(n)
    for attempt in range(cfg.ranking_attempts):
        shown = list(range(n))  # label j shows version shown[j]; a new shuffled order per attempt
        seeded_rng(cfg.seed, row["id"], "order", attempt).shuffle(shown)
        parsed, _ = gw.chat_json(
            "judge", rank_messages([(labels[j], group["versions"][shown[j]]) for j in range(n)], cfg.ask_scores),
            expect=(dict, list), schema=ranking_model(tuple(labels), cfg.ask_scores),
            task_id=task_id, purpose=f"irm-rank-{attempt}", temperature=cfg.judge_temperature,
            max_tokens=cfg.judge_max_tokens, journal=journal)
        group["calls"] += 1
        if parsed is None:
            status, failure = "ranking_unparseable", "the judge's reply holds no JSON"
        else:
            order, scores, failure = parse_ranking(parsed, labels)
            status = "ranking_invalid"
        if failure is None:
            group.update(status="ranked", reason=None, ranking=[shown[j] for j in order])
            if scores is not None:
                aligned = [0.0] * n
                for j, sc in enumerate(scores):
                    aligned[shown[j]] = sc
                group["judge_scores"] = aligned
            return group
        group.update(status=status, reason=failure[:300], failed_attempts=group["failed_attempts"] + 1)
    return group


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def error_group(row: dict, err: Exception) -> dict:
    return {"id": row["id"], "status": "error", "reason": str(err)[:500], "versions": [row["instruction"]],
            "sources": ["original"], "ranking": None, "judge_scores": None, "judge_model": None,
            "failed_attempts": 0, "calls": 0}


def pairs_from_group(group: dict, prompt: str) -> list[dict]:
    ranking = group.get("ranking")
    if group.get("status") != "ranked" or not ranking:
        return []
    n, versions, sources = len(ranking), group["versions"], group["sources"]
    pairs = []
    for a in range(n):
        for b in range(a + 1, n):
            hi, lo = ranking[a], ranking[b]
            pairs.append({"prompt": prompt, "chosen": versions[hi], "rejected": versions[lo],
                          "margin": (b - a) / (n - 1), "instruction_id": group["id"], "chosen_rank": a + 1,
                          "rejected_rank": b + 1, "group_size": n, "chosen_source": sources[hi],
                          "rejected_source": sources[lo]})
    return pairs


def group_scores(group: dict) -> list[float]:
    """Data-level IRM scores of a ranked group, in 0..1: the judge's 0-10 scores / 10 when it gave them,
    else the rank-derived score 1 - position / (n - 1) (uniform by construction: a weak check)."""
    ranking = group.get("ranking")
    if group.get("status") != "ranked" or not ranking:
        return []
    if group.get("judge_scores"):
        return [s / 10.0 for s in group["judge_scores"]]
    n = len(ranking)
    return [1.0 - pos / (n - 1) for pos in range(n)]
