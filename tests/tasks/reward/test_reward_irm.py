"""IRM data: version writing, the judge's ranking (tolerant parsing, counted failures), preference pairs."""

from __future__ import annotations

import pytest

from evolforge.storage.journal import CallJournal
from evolforge.storage.ledger import LedgerWriter, read_ledger
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.reward.irm import group_scores, pairs_from_group, parse_ranking, rank_group
from evolforge.testing.settings import make_settings

LABELS = ["A", "B", "C"]
ROW = {"id": "s1", "instruction": "Compute 3 plus 4 and explain the result.", "domain": "math"}


def gateway(server, tmp_path, **reward):
    settings = make_settings(server.base_url, reward=reward,
                             gateway={"backoff_base_seconds": 0.0, "timeout_seconds": 2.0})
    return Gateway(settings, base_url=server.base_url, run_id="r", ledger=LedgerWriter(tmp_path / "ledger", "r")), settings


@pytest.mark.parametrize("reply,order", [
    ({"ranking": ["B", "C", "A"]}, [1, 2, 0]),
    ({"ranking": ["[b]", "Version C", "A."]}, [1, 2, 0]),
    ({"Ranking": ["C", "A", "B"]}, [2, 0, 1]),
    ({"order": [2, 3, 1]}, [1, 2, 0]),  # 1-based numbers
    ({"ranking": [1, 2, 0]}, [1, 2, 0]),  # 0-based numbers
    ({"ranking": ["2", "3", "1"]}, [1, 2, 0]),
    ({"ranking": {"A": 3, "B": 1, "C": 2}}, [1, 2, 0]),  # label -> position
    (["C", "B", "A"], [2, 1, 0]),  # a bare list
])
def test_parse_ranking_is_tolerant(reply, order):
    got, _, failure = parse_ranking(reply, LABELS)
    assert failure is None and got == order


@pytest.mark.parametrize("reply,why", [
    ({"ranking": ["A", "A", "B"]}, "not a permutation"),
    ({"ranking": ["A", "B"]}, "not a permutation"),
    ({"ranking": ["A", "B", "C", "D"]}, "unknown labels"),
    ({"ranking": ["A", "B", "Z"]}, "unknown labels"),
    ({"ranking": [1, 2, 2]}, "not a permutation"),
    ({"best": "A"}, "no ranking"),
    ({"ranking": "A > B > C"}, "not a list"),
    ({"ranking": []}, "not a list"),
])
def test_invalid_rankings_are_failures_not_crashes(reply, why):
    got, scores, failure = parse_ranking(reply, LABELS)
    assert got is None and scores is None and why in failure


def test_scores_are_aligned_and_validated():
    _, scores, _ = parse_ranking({"ranking": ["B", "C", "A"], "scores": {"A": 2, "B": 9, "C": "6"}}, LABELS)
    assert scores == [2.0, 9.0, 6.0]
    assert parse_ranking({"ranking": ["B", "C", "A"], "scores": {"A": 2, "B": 90, "C": 6}}, LABELS)[1] is None
    assert parse_ranking({"ranking": ["B", "C", "A"], "scores": {"A": 2}}, LABELS)[1] is None


def test_rank_group_against_scripted_judge(server, tmp_path):
    gw, settings = gateway(server, tmp_path, variants_per_model=2)
    group = rank_group(ROW, gw, settings)
    assert group["status"] == "ranked" and group["calls"] == 3 and len(server.posts()) == 3
    assert len(group["versions"]) == 3 and group["sources"][0] == "original"
    assert sorted(group["ranking"]) == [0, 1, 2]
    assert group["ranking"][-1] == 0  # the scripted judge prefers the longer, evolved versions
    assert group["judge_scores"][0] == 3.0 and max(group["judge_scores"]) == 9.0
    gw.ledger.close()
    ledger = read_ledger(tmp_path)
    assert set(ledger["task_id"]) == {"irm-s1"} and sorted(ledger["stage"]) == ["evolve", "evolve", "judge"]


def test_two_variant_models_and_journal_replay(server, tmp_path):
    gw, settings = gateway(server, tmp_path, variants_per_model=3, variant_models=["model-a", "model-b"])
    with CallJournal(tmp_path / "j.jsonl") as journal:
        first = rank_group(ROW, gw, settings, journal)
    assert len(server.posts()) == 7  # 2 models x 3 versions + 1 ranking
    assert first["status"] == "ranked" and len(first["versions"]) >= 4
    ops = [s.split(":")[1] for s in first["sources"][1:] if s.startswith("model-a:")]
    assert len(ops) == len(set(ops))  # one model's versions use distinct operations
    gw.ledger.close()
    assert set(read_ledger(tmp_path).filter(read_ledger(tmp_path)["stage"] == "evolve")["model"]) == {"model-a", "model-b"}
    with CallJournal(tmp_path / "j.jsonl") as journal:
        again = rank_group(ROW, gw, settings, journal)
    assert len(server.posts()) == 7 and again == first  # replayed from the journal, nothing re-sent


@pytest.mark.parametrize("reply,status,reason", [
    ("text:I would rank B first, then A.", "ranking_unparseable", "no JSON"),
    ('text:{"ranking": ["A", "A", "B"]}', "ranking_invalid", "not a permutation"),
    ('text:{"ranking": ["A", "B", "Q"]}', "ranking_invalid", "unknown labels"),
    ('text:{"verdict": "B is best"}', "ranking_invalid", "no ranking"),
])
def test_bad_judge_replies_are_counted_failures(server, tmp_path, reply, status, reason):
    gw, settings = gateway(server, tmp_path, variants_per_model=2)
    server.script("ok", "ok", reply)
    group = rank_group(ROW, gw, settings)
    assert group["status"] == status and reason in group["reason"] and group["ranking"] is None
    assert pairs_from_group(group, "P: ") == [] and group_scores(group) == []
    assert gw.stats.json_failures == (1 if status == "ranking_unparseable" else 0)


def test_duplicate_and_empty_versions_are_dropped(server, tmp_path):
    gw, settings = gateway(server, tmp_path, variants_per_model=2)
    server.script(f"text:{ROW['instruction']}", "text:  ")
    group = rank_group(ROW, gw, settings)
    assert group["status"] == "too_few_versions" and len(server.posts()) == 2  # no judge call for one version


def test_pairs_from_a_ranking():
    group = {"id": "x", "status": "ranked", "versions": ["orig", "v1", "v2"], "sources": ["original", "m:a", "m:b"],
             "ranking": [2, 0, 1], "judge_scores": None}
    pairs = pairs_from_group(group, "Rate: ")
    assert [(p["chosen"], p["rejected"], p["margin"]) for p in pairs] == [
        ("v2", "orig", 0.5), ("v2", "v1", 1.0), ("orig", "v1", 0.5)]
    assert all(p["prompt"] == "Rate: " and p["chosen_rank"] < p["rejected_rank"] for p in pairs)
    assert group_scores(group) == [1.0, 0.5, 0.0]
    assert group_scores({**group, "judge_scores": [5.0, 2.0, 8.0]}) == [0.5, 0.2, 0.8]


def test_ranking_attempts_retry_in_a_new_order_and_count_failures(server, tmp_path):
    gw, settings = gateway(server, tmp_path, variants_per_model=2, ranking_attempts=3)
    server.script("ok", "ok", 'text:{"ranking": ["A", "B"]}', "text:nothing")  # two bad rankings, then the judge
    group = rank_group(ROW, gw, settings)
    assert group["status"] == "ranked" and group["failed_attempts"] == 2 and group["calls"] == 5
    assert group["ranking"][-1] == 0 and len(server.posts()) == 5

    gw2, once = gateway(server, tmp_path, variants_per_model=2, ranking_attempts=2)
    server.script("ok", "ok", 'text:{"ranking": ["A", "B"]}', 'text:{"ranking": ["C", "C", "A"]}')
    failed = rank_group({**ROW, "id": "s2"}, gw2, once)
    assert failed["status"] == "ranking_invalid" and failed["failed_attempts"] == 2 and failed["ranking"] is None


def test_ranking_items_as_objects():
    reply = {"ranking": [{"label": "B", "score": 6}, {"label": "A"}, {"label": "C"}]}
    assert parse_ranking(reply, LABELS)[0] == [1, 0, 2]


def test_a_reply_of_scores_only_ranks_by_score():
    assert parse_ranking({"A": 5, "B": 7, "C": 2}, LABELS)[:2] == ([1, 0, 2], [5.0, 7.0, 2.0])
    assert "tied" in parse_ranking({"A": 5, "B": 5, "C": 2}, LABELS)[2]
    assert "every label" in parse_ranking({"A": 5, "B": 7}, LABELS)[2]
