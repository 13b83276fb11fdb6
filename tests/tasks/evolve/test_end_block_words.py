"""What a user reads at the end of an evolve run: every elimination rule in words, and why survival is low."""

from __future__ import annotations

from evolforge.tasks.evolve import elimination as rules
from evolforge.tasks.evolve.report import rules_in_words, survival_note
from evolforge.tasks.evolve.stage import EvolveParams, present


def _summary(by_rule: dict, accepted: int, attempts: int = 30, errors: int = 0, endpoint: str = "embedded x") -> dict:
    rnd = {"round": 1, "attempts": attempts, "accepted": accepted, "eliminated": attempts - accepted - errors,
           "errors": errors, "survival": accepted / attempts, "by_rule": by_rule}
    return {"rounds": [rnd], "endpoint": endpoint, "out_dir": "/tmp/x",
            "counts": {"evolved": 30 + accepted},
            "datasets": {"evolved": "e.parquet", "lineage": "l.parquet", "cost_ledger": "c.parquet"},
            "cost": {"cost_usd": 0.0, "attempts": 60, "by_stage": []}}


def test_the_end_block_names_every_rule_in_words_and_no_python_dict(tmp_path):
    by_rule = {rules.RULE_NOT_TASK: 15, rules.RULE_COPY: 2, "duplicate_embedding": 3}
    text = present(_summary(by_rule, accepted=10), EvolveParams(out=str(tmp_path)))
    assert "{" not in text and "}" not in text
    for rule in by_rule:
        assert rules.rule_words(rule) in text
    assert "15 eliminated: answered or wrote something else instead of a new instruction" in text


def test_low_survival_on_the_embedded_model_says_so_and_points_to_a_real_endpoint():
    note = survival_note(_summary({rules.RULE_NOT_TASK: 25, rules.RULE_COPY: 3}, accepted=2))
    assert "only 2 of 30" in note and rules.rule_words(rules.RULE_NOT_TASK) in note
    assert "embedded" in note and "--base-url" in note
    assert "embedded" not in survival_note(_summary({rules.RULE_COPY: 28}, accepted=2, endpoint="http://gpu/v1"))
    assert survival_note(_summary({rules.RULE_COPY: 10}, accepted=12)) is None  # 40% is not low


def test_errors_are_not_blamed_on_the_model(tmp_path):
    summary = _summary({}, accepted=0, errors=30)
    note = survival_note(summary)
    assert note.startswith("30 attempt(s) ended in an error") and "retry" in note
    assert "expected of the embedded" not in note
    assert "30 ended in an error" in present(summary, EvolveParams(out=str(tmp_path)))


def test_rules_in_words_most_frequent_first():
    assert rules_in_words({rules.RULE_COPY: 1, rules.RULE_NOT_TASK: 4}).startswith("4 answered")
    assert rules_in_words({}) == "none"
