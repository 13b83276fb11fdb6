"""One evolution of one record: choose the operation, rewrite, answer, eliminate.

`evolve_record` is a plain function (no Prefect): a test calls it with a
gateway pointed at any endpoint. The operation is chosen by an RNG seeded with
(config seed, record id, round), so a resumed run makes the same choice and
its calls are replayed from the journal instead of being sent again.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, fields

from evolforge.config.settings import EvolInstructSettings
from evolforge.storage.journal import CallJournal
from evolforge.storage.schemas import LINEAGE_FIELDS
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.core.rng import seeded_rng
from evolforge.tasks.evolve import elimination as rules
from evolforge.tasks.evolve import prompts


@dataclass
class Evolution:
    id: str
    parent_id: str
    seed_id: str
    round: int
    operation: str
    direction: str
    model: str
    status: str  # accepted | eliminated | error
    elimination_rule: str | None
    instruction: str
    answer: str | None
    judge_verdict: str | None
    domain: str
    generation: int
    error: str | None = None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duplicate_of: str | None = None  # set by the round's dedup step
    dedup_similarity: float | None = None

    def to_row(self) -> dict:
        return asdict(self)


assert tuple(f.name for f in fields(Evolution)) == LINEAGE_FIELDS, "Evolution and LINEAGE_SCHEMA disagree"


def choose_operation(cfg: EvolInstructSettings, record_id: str, domain: str, round_no: int) -> str:
    rng = seeded_rng(cfg.seed, record_id, round_no)
    if rng.random() < cfg.evolve_down_ratio:
        return rng.choice(prompts.DOWN_OPERATIONS)
    if rng.random() < cfg.in_breadth_share:
        return "in_breadth"
    if domain == "code" and cfg.code_operations:
        return rng.choice(prompts.CODE_OPERATIONS)
    return rng.choice(prompts.UP_OPERATIONS)


def evolution_id(parent_id: str, round_no: int, operation: str) -> str:
    return "e-" + hashlib.sha1(f"{parent_id}|{round_no}|{operation}".encode()).hexdigest()[:14]


_LABEL = re.compile(
    r"^\s*#*\s*(the\s+)?(rewritten|created|new|rewrite)\s+(prompt|question|instruction|task)\s*(#+\s*:?|:)\s*",
    re.I,
)


def clean_evolved(text: str) -> str:
    """Drop a leading '#Rewritten Prompt#:' style label and wrapping quotes; keep everything else."""
    out = text.strip()
    for _ in range(2):
        out = _LABEL.sub("", out, count=1).strip()
    if len(out) >= 2 and out[0] == out[-1] and out[0] in "\"'`":
        out = out[1:-1].strip()
    return out


def evolve_record(
    pool_row: dict,
    round_no: int,
    gateway: Gateway,
    cfg: EvolInstructSettings,
    journal: CallJournal | None = None,
) -> Evolution:
    parent_id, parent_text = pool_row["id"], pool_row["instruction"]
    domain = pool_row.get("domain") or "general"
    op = choose_operation(cfg, parent_id, domain, round_no)
    evo = Evolution(
        id=evolution_id(parent_id, round_no, op), parent_id=parent_id, seed_id=pool_row["seed_id"], round=round_no,
        operation=op, direction=prompts.DIRECTION[op], model=gateway.model_for("evolve"), status="accepted",
        elimination_rule=None, instruction="", answer=None, judge_verdict=None, domain=domain,
        generation=int(pool_row.get("generation") or 0) + 1,
    )
    sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p)

    def call(stage: str, messages: list[dict], purpose: str, **kw):
        res = gateway.chat(stage, messages, task_id=evo.id, purpose=purpose, journal=journal, **kw)
        evo.calls += 1
        evo.prompt_tokens += res.prompt_tokens or 0
        evo.completion_tokens += res.completion_tokens or 0
        return res

    res = call("evolve", prompts.evolve_messages(op, parent_text), "evolve", max_tokens=cfg.max_new_tokens, **sampling)
    evo.instruction = clean_evolved(res.text)
    rule = rules.instruction_rule(evo.instruction, op)
    if rule:
        return _eliminate(evo, rule)
    if cfg.answer:
        ans = call("answer", prompts.answer_messages(evo.instruction, cfg.answer_in_steps), "answer",
                   max_tokens=cfg.max_new_tokens, **sampling)
        evo.answer = ans.text.strip()
        rule = rules.answer_rule(evo.answer, cfg.sorry_max_words)
        if rule:
            return _eliminate(evo, rule)
    if cfg.equal_check and cfg.equal_judge == "words":
        evo.judge_verdict = "equal" if rules.adds_no_information(parent_text, evo.instruction) else "not_equal"
        if evo.judge_verdict == "equal":
            return _eliminate(evo, rules.RULE_EQUAL)
    elif cfg.equal_check:
        verdict_res = call("judge", prompts.equal_messages(parent_text, evo.instruction), "equal",
                           max_tokens=rules.EQUAL_JUDGE_MAX_TOKENS, temperature=0.0, schema=rules.EqualVerdict)
        verdict = rules.parse_equal_reply(verdict_res.text)
        evo.judge_verdict = verdict or "unparseable"
        if verdict == "equal" or (verdict is None and cfg.unparseable_verdict == "eliminate"):
            return _eliminate(evo, rules.RULE_EQUAL)
    return evo


def _eliminate(evo: Evolution, rule: str) -> Evolution:
    evo.status = "eliminated"
    evo.elimination_rule = rule
    return evo
