"""Module graph vs single-shot (`modules.compare`, `evolforge modules --compare`): the same questions answered both
ways and scored by the same judge; win rate overall and by difficulty, judge calls per question, resume, the
difficulty rule, the flow's table artifact and the CLI flag."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.storage import module_sets as store
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.modules.batch import run_modules_batch
from evolforge.tasks.modules.compare import compare_item, comparison_summary, comparison_table, run_compare_batch
from evolforge.testing.scripted_server import ScriptedServer
from evolforge.testing.settings import make_settings

GRAPH_CALLS = 9 + 9  # nine modules + 1 + 8 judge calls per question (mask ablation)

# (id, question, difficulty): the scripted judge takes 3 points off a single-shot answer (no "Module trace"),
# none on a [tie] question, and 4 off the graph's answer on a [single] question:
# plain 7 vs graph 10 -> graph; [tie] 10 vs 10 -> tie; [single] 10 vs 6 -> single-shot
QUESTIONS = [
    ("e1", "What is 1 plus 2?", "easy"), ("e2", "[tie] What is 2 plus 2?", "Easy"),
    ("m1", "What is 3 times 4?", "medium"), ("m2", "[single] What is 3 times 5?", "medium"),
    ("h1", "What is 17 times 23 minus 5?", "hard"), ("h2", "What is 2 to the 10th?", "hard"),
    ("u1", "What is 9 minus 4?", None),
]
EXPECTED_TABLE = [
    {"difficulty": "easy", "n": 2, "graph wins": 1, "single-shot wins": 0, "ties": 1, "win rate": 0.5},
    {"difficulty": "medium", "n": 2, "graph wins": 1, "single-shot wins": 1, "ties": 0, "win rate": 0.5},
    {"difficulty": "hard", "n": 2, "graph wins": 2, "single-shot wins": 0, "ties": 0, "win rate": 1.0},
    {"difficulty": "unknown", "n": 1, "graph wins": 1, "single-shot wins": 0, "ties": 0, "win rate": 1.0},
    {"difficulty": "all", "n": 7, "graph wins": 5, "single-shot wins": 1, "ties": 1, "win rate": 0.7143},
]


@pytest.fixture
def judge_server():
    with ScriptedServer(hang_seconds=3.0, nodelay=True) as srv:
        srv.judge_plain_penalty = {"": 3, "[tie]": 0, "[single]": 0}
        srv.judge_graph_penalty = {"[single]": 4}
        yield srv


def write_questions(path, rows=QUESTIONS):
    path.write_text("\n".join(json.dumps({"id": i, "question": q, "difficulty": d}) for i, q, d in rows) + "\n")
    return path


def settings_for(server, **modules):
    return make_settings(server.base_url, modules={"compare": True, **modules},
                         gateway={"backoff_base_seconds": 0.0, "timeout_seconds": 5.0, "concurrency": 32})


def test_difficulty_rule():
    assert store.difficulty_of("Hard", 0) == "hard"           # the difficulty column first
    assert store.difficulty_of(None, 0) == "easy" and store.difficulty_of("", 1) == "medium"
    assert store.difficulty_of(None, 2) == "hard" and store.difficulty_of(None, 5) == "hard"
    assert store.difficulty_of() == "unknown" and store.difficulty_of(None, "x") == "unknown"


def test_batch_comparison_reuses_the_graph_score_and_resumes(judge_server, tmp_path):
    settings = settings_for(judge_server, batch_size=4)
    lay = store.ModulesLayout(tmp_path / "out").ensure()
    assert store.build_input(write_questions(tmp_path / "q.jsonl"), lay.input, 4) == 7
    assert store.read_batch(lay, 0)[1] == {"id": "e2", "question": "[tie] What is 2 plus 2?", "difficulty": "easy"}
    for b in range(2):  # the graph first (as a run without --compare), then the comparison over it
        run_modules_batch(lay.root, b, settings, judge_server.base_url, "r1")
    assert len(judge_server.posts()) == 7 * GRAPH_CALLS
    stats = [run_compare_batch(lay.root, b, settings, judge_server.base_url, "r1") for b in range(2)]
    # per question: 1 single-shot call + 1 judge call (the graph's own judge_full is reused)
    assert len(judge_server.posts()) == 7 * GRAPH_CALLS + 7 * 2
    assert stats[0]["by_status"] == {"graph": 2, "tie": 1, "single_shot": 1}
    rows = [r for b in range(2) for r in pl.read_parquet(lay.comparisons.part(b)).to_dicts()]
    assert all(r["judge_calls"] == 1 and r["single_calls"] == 1 and r["graph_score_reused"] for r in rows)
    by = {r["id"]: r for r in rows}
    assert (by["e1"]["graph_score"], by["e1"]["single_score"], by["e1"]["winner"]) == (10.0, 7.0, "graph")
    assert (by["e2"]["single_score"], by["e2"]["winner"]) == (10.0, "tie")
    assert (by["m2"]["graph_score"], by["m2"]["winner"]) == (6.0, "single_shot")
    assert by["u1"]["difficulty"] == "unknown" and by["u1"]["single_answer"].startswith("Step 1:")
    assert comparison_table(comparison_summary(rows, settings)) == EXPECTED_TABLE

    # a rerun sends nothing: parts done; and with the parts gone, every call replays from the journals
    assert run_compare_batch(lay.root, 0, settings, judge_server.base_url, "r1")["skipped"]
    lay.comparisons.part(1).unlink()
    again = run_compare_batch(lay.root, 1, settings, judge_server.base_url, "r1")
    assert again["replayed_calls"] == 3 * 2 and len(judge_server.posts()) == 7 * GRAPH_CALLS + 7 * 2


def test_judge_calls_when_the_graph_has_no_score_or_no_answer(judge_server):
    settings = settings_for(judge_server)
    gw = Gateway(settings, base_url=judge_server.base_url, run_id="r")
    row = {"id": "x1", "question": "What is 6 times 7?", "difficulty": "hard"}
    graph = {"status": "judge_failed", "reason": "judge-full: no score", "judge_full": None,
             "answer": "Final answer: The answer is 42.\n\nModule trace:\n[parse] (steps) [\"add\"]"}
    out = compare_item(row, graph, gw, settings)  # the graph's answer is judged here: 2 judge calls
    assert (out["judge_calls"], out["single_calls"], out["graph_score_reused"]) == (2, 1, False)
    assert (out["graph_score"], out["single_score"], out["winner"]) == (10.0, 7.0, "graph")
    assert len(judge_server.posts()) == 3
    failed = {"status": "failed", "reason": "exit module integrate invalid", "judge_full": None, "answer": "x"}
    out = compare_item(row, failed, gw, settings)  # no graph answer: not judged, and it loses
    assert out["judge_calls"] == 1 and out["winner"] == "single_shot" and "exit module integrate" in out["reason"]
    assert len(judge_server.posts()) == 3 + 2


def test_difficulty_from_the_evolve_generation(judge_server, tmp_path):
    src = tmp_path / "evolved.parquet"
    pl.DataFrame({"id": ["s0", "g1", "g2", "g3", "x"], "status": ["seed", "accepted", "accepted", "accepted", "eliminated"],
                  "instruction": ["Add 1 and 1.", "Add 1, 1 and 1.", "[single] Add 1, 1, 1 and 1.", "Add 5 ones.", "no"],
                  "generation": [0, 1, 2, 3, 2]}).write_parquet(src)
    settings = settings_for(judge_server)
    lay = store.ModulesLayout(tmp_path / "out").ensure()
    assert store.build_input(src, lay.input, 16) == 4
    assert [r["difficulty"] for r in store.read_batch(lay, 0)] == ["easy", "medium", "hard", "hard"]
    run_modules_batch(lay.root, 0, settings, judge_server.base_url, "r1")
    run_compare_batch(lay.root, 0, settings, judge_server.base_url, "r1")
    summary = comparison_summary(pl.read_parquet(lay.comparisons.part(0)).to_dicts(), settings)
    assert {k: (g["n"], g["graph_wins"], g["win_rate"]) for k, g in summary["by_difficulty"].items()} == \
        {"easy": (1, 1, 1.0), "medium": (1, 1, 1.0), "hard": (2, 1, 0.5)}
    # a difficulty column wins over generation; an empty one falls back to it
    both = tmp_path / "both.csv"
    both.write_text("question,difficulty,generation\nA?,hard,0\nB?,,1\n")
    assert store.build_input(both, tmp_path / "in2.parquet", 4) == 2
    assert pl.read_parquet(tmp_path / "in2.parquet")["difficulty"].to_list() == ["hard", "medium"]


@pytest.mark.usefixtures("prefect_harness")
def test_flow_compare_table_artifact_rerun_and_cli(judge_server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from evolforge.cli import main
    from evolforge.flows.modules import ModulesParams, modules_flow

    src = write_questions(tmp_path / "q.jsonl")
    overrides = {"modules": {"batch_size": 4, "concurrency": 4},
                 "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 5.0}}
    params = ModulesParams(input=str(src), out=str(tmp_path / "out"), base_url=judge_server.base_url,
                           overrides=overrides, compare=True)
    summary = modules_flow(params)
    total = 7 * (GRAPH_CALLS + 2)
    assert len(judge_server.posts()) == total
    cmp = summary["comparison"]
    assert cmp["calls"] == {"single_shot": 7, "judge": 7, "graph_scores_reused": 7}
    assert cmp["overall"]["win_rate"] == 0.7143 and cmp["overall"]["not_compared"] == 0
    assert comparison_table(cmp) == EXPECTED_TABLE
    on_disk = json.loads(store.ModulesLayout(tmp_path / "out").summary.read_text())["comparison"]
    assert on_disk["by_difficulty"]["hard"]["win_rate"] == 1.0
    items = pl.read_parquet(store.ModulesLayout(tmp_path / "out").comparison)
    assert items.height == 7 and set(items.columns) >= {"single_answer", "graph_score", "single_score", "winner",
                                                        "difficulty"}
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["modules-comparison"])))
    latest = max(arts, key=lambda a: a.created)  # other tests' modules runs in this session left theirs too
    table = latest.data if isinstance(latest.data, list) else json.loads(latest.data)
    assert table == EXPECTED_TABLE
    for row in table:
        assert row["n"] == row["graph wins"] + row["single-shot wins"] + row["ties"]

    again = modules_flow(params)  # a rerun sends no call
    assert len(judge_server.posts()) == total and again["comparison"]["overall"] == cmp["overall"]

    rc = main(["modules", "--input", str(src), "--out", str(tmp_path / "cli"), "--base-url", judge_server.base_url,
               "--max-items", "2", "--compare"])
    assert rc == 0 and len(judge_server.posts()) == total + 2 * (GRAPH_CALLS + 2)
    cli_items = pl.read_parquet(store.ModulesLayout(tmp_path / "cli").comparison)
    assert cli_items["winner"].to_list() == ["graph", "tie"]
