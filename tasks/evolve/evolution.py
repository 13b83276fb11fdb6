"""One evolution of one record: choose the operation, rewrite, answer, eliminate.

`evolve_record` is a plain function (no Prefect): a test calls it with a
gateway pointed at any endpoint. The operation is chosen by an RNG seeded with
(config seed, record id, round), so a resumed run makes the same choice and
its calls are replayed from the journal instead of being sent again.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, create_model

from evolforge.config.settings import EvolInstructSettings
from evolforge.storage.journal import CallJournal
from evolforge.storage.schemas import LINEAGE_FIELDS
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.core.rng import seeded_rng
from evolforge.tasks.core.structured import char_budget
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


def rewrite_chars(max_tokens: int) -> int:
    """The longest new instruction a rewrite call's reply holds: its token budget less about 16 tokens for the one
    short key, at 3 characters a token (prose takes 3 to 4), so a grammar-constrained model closes the string
    before the cap."""
    return char_budget(max_tokens, overhead_tokens=16, chars_per_token=3.0)


@lru_cache(maxsize=32)
def rewrite_model(max_tokens: int) -> type[BaseModel]:
    """The schema a rewrite call asks for: {"instruction": "<the new task>"}, sized by `rewrite_chars`."""
    field = Annotated[str, Field(min_length=10, max_length=rewrite_chars(max_tokens))]
    return create_model("Rewrite", __config__=ConfigDict(extra="forbid"), **{prompts.REPLY_FIELD: (field, ...)})


_LABEL = re.compile(
    r"^\s*#*\s*(the\s+)?(rewritten|created|new|rewrite)\s+(prompt|question|instruction|task)\s*(#+\s*:?|:)\s*",
    re.I,
)
# the reply's JSON, whole or cut at the token cap: {"instruction": "...
_JSON_OPEN = re.compile(r'^\s*(?:```(?:json)?\s*)?\{\s*"(\w+)"\s*:\s*"((?:[^"\\]|\\.)*)', re.S)
# a first line that only announces the task ("Here's a possible rewording of the task:", "The new task is:")
_ANNOUNCE = re.compile(r"^(?=.*\b(rewrit\w*|reword\w*|rephras\w*|new|harder|easier|more complex|simpler)\b)"
                       r"(?=.*\b(task|version|question|prompt|instruction)\b)"
                       r"\W*(here'?s|here is|this is|below is|the|a|my|sure|ok|okay|rewritten|new|harder|easier|"
                       r"simpler|possible)\b(\S*\s+){0,14}\S*:\s*$", re.I)
# a line after the task that talks about it instead of posing it: a bare label ("Question:"), the request's own
# words ("Reply with the new task only."), or talk about the task ("Create the new task.", "You can ask a question
# in the following format", "This problem was solved before."), or a line that introduces what never comes
# ("Here's how you can implement it:", "To complete the task, you can use the following method:")
_META_LINE = re.compile(
    r"\W*(question|answer|solution|task|new task|rewritten task|created task|rewritten question|output|input|"
    r"example|note|language: \w+)\W*$|"  # a bare label
    r".*:\s*$|"  # an introduction of nothing
    r".*\b(the|a|this|your) (new|rewritten|original|given|created|above|previous) (task|question|prompt|instruction|"
    r"version)\b|.*\bthe following format\W*$|"
    r".*\b(reply with the (new )?task|(rewrite|create|write) the (new )?task|10 to 20 words)\b|"
    r"\W*(this (task|problem|question) (was|has been|is now) |i hope\b|let me know\b)", re.I)


def _reply_field(text: str) -> str:
    """The new instruction out of a reply in the reply's JSON form (whole, fenced, or cut off inside the string);
    any other reply as it is."""
    try:
        obj = json.loads(text.strip().removeprefix("```json").removeprefix("```").removesuffix("```"))
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        value = obj.get(prompts.REPLY_FIELD)
        strings = [v for v in obj.values() if isinstance(v, str)]
        if isinstance(value, str):
            return value
        if len(strings) == 1:
            return strings[0]
        return text
    m = _JSON_OPEN.match(text)
    if m:
        try:
            return json.loads(f'"{m.group(2)}"')
        except ValueError:
            return m.group(2)
    return text


_SENTENCE_END = re.compile(r"[.?!](?=\s)")


def _last_whole_sentences(text: str) -> str:
    """A reply cut at its length: up to its last whole sentence, when that keeps at least 40% of it."""
    if text.rstrip().endswith((".", "?", "!", '"', "'", ")", "]", "`")):
        return text
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    return text[:ends[-1]] if ends and ends[-1] >= 0.4 * len(text) else text


def clean_evolved(text: str, cut: bool = False) -> str:
    """The new instruction in a rewriter's reply: the JSON's instruction when the reply is in the reply's form;
    without a leading '#Rewritten Prompt#:' style label, a first line that only announces the task ('Here's a
    possible rewording of the task:'), wrapping quotes, and lines after the task that only talk about it
    ('Create the new task.', 'Question:', 'Reply with the new task only.'). `cut`: the reply was cut at its length
    (token cap or the schema's length); it ends at its last whole sentence. Everything else is kept for the rules to
    judge: a reply that is only talk stays as it is."""
    out = _reply_field(text).strip()
    for _ in range(2):
        out = _LABEL.sub("", out, count=1).strip()
    lines = [ln for ln in out.splitlines()]
    if len(lines) > 1 and _ANNOUNCE.match(lines[0]) and any(ln.strip() for ln in lines[1:]):
        lines = lines[1:]
    while len([ln for ln in lines if ln.strip()]) > 1 and (not lines[-1].strip() or _META_LINE.match(lines[-1].strip())):
        lines.pop()
    out = "\n".join(lines).strip()
    if out.endswith("}") and "{" not in out:  # the JSON's closing brace left after the string
        out = out[:-1].rstrip()
    if len(out) >= 2 and out[0] == out[-1] and out[0] in "\"'`":
        out = out[1:-1].strip()
    for _ in range(2):
        out = _LABEL.sub("", out, count=1).strip()
    return _last_whole_sentences(out).strip() if cut else out


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

    budget = gateway.max_tokens_for(cfg.max_new_tokens)
    res = call("evolve", prompts.evolve_messages(op, parent_text, domain), "evolve", max_tokens=cfg.max_new_tokens,
               schema=rewrite_model(budget), **sampling)
    cut = res.finish_reason == "length" or len(_reply_field(res.text)) >= rewrite_chars(budget) - 1
    evo.instruction = clean_evolved(res.text, cut=cut)
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
