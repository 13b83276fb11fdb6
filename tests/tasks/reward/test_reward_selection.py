"""The RLEIF loop's IRM filter: a real (tiny) IRM scores the evolved pool, a share or threshold selects what PPO
trains on, and the selection is recorded in each row's lineage."""

from __future__ import annotations

import pytest

from evolforge.config.settings import Settings
from evolforge.storage.ppo import PPOLayout, read_evolved, read_prompt_rows
from evolforge.tasks.reward import scoring
from evolforge.tasks.reward.selection import irm_selection, select
from evolforge.testing.ppo_models import (
    one_torch_thread,  # noqa: F401 (autouse fixture)
    shared_reward_models,
    write_evolved,
)


def test_select_by_share_and_threshold():
    ids, scores = ["a", "b", "c", "d"], [0.2, 0.9, 0.5, 0.5]
    top = select(ids, scores, "share", 0.5, 0.0)
    assert [i for i in ids if top[i]["irm_selected"]] == ["b", "c"]  # ties broken by id: c before d
    assert {i: top[i]["irm_rank"] for i in ids} == {"a": 4, "b": 1, "c": 2, "d": 3}
    assert sum(v["irm_selected"] for v in select(ids, scores, "share", 0.01, 0.0).values()) == 1  # at least one
    cut = select(ids, scores, "threshold", 1.0, 0.5)
    assert [i for i in ids if cut[i]["irm_selected"]] == ["b", "c", "d"]
    assert not any(v["irm_selected"] for v in select(ids, scores, "threshold", 1.0, 0.95).values())
    with pytest.raises(ValueError, match="IRM selection mode"):
        select(ids, scores, "off", 0.5, 0.5)


def _reward(**kw):
    return Settings().reward.model_copy(update=kw)


def test_the_trained_irm_scores_the_pool_and_the_best_are_kept(tmp_path):
    irm = shared_reward_models() / "models" / "irm"
    records = read_evolved(write_evolved(tmp_path / "evolved.parquet", n_seeds=6))
    chosen, summary = irm_selection(records, irm, _reward(select_by_irm="share", select_share=0.25))
    pool = [r for r in records if r["status"] != "eliminated"]
    assert set(chosen) == {r["id"] for r in pool} and summary["scored"] == len(pool)  # x0 (eliminated) not scored
    scores = scoring.score_instructions(irm, [r["instruction"] for r in pool])
    for r, s in zip(pool, scores):
        assert chosen[r["id"]]["irm_score"] == pytest.approx(s, abs=1e-4)
    kept = [r["id"] for r in pool if chosen[r["id"]]["irm_selected"]]
    assert len(kept) == summary["selected"] == 4  # ceil(0.25 x 14)
    assert min(chosen[i]["irm_score"] for i in kept) >= max(chosen[r["id"]]["irm_score"] for r in pool
                                                            if r["id"] not in kept)


def test_ppo_trains_on_the_irm_selection_recorded_in_lineage(tmp_path):
    from evolforge.tasks.ppo import job

    irm = shared_reward_models() / "models" / "irm"
    path = write_evolved(tmp_path / "evolved.parquet", n_seeds=8)
    settings = Settings()
    base = job.prompt_data(path, PPOLayout(tmp_path / "all").ensure(), settings.ppo, None, settings.eval,
                           irm, settings.reward)  # select_by_irm = off: everything, nothing recorded
    assert base["irm_selection"] is None and "irm_selection" not in base["dropped"]
    assert all(r["extra_info"]["lineage"]["irm_score"] is None for r in read_prompt_rows(PPOLayout(tmp_path / "all").train))

    lay = PPOLayout(tmp_path / "sel").ensure()
    reward = _reward(select_by_irm="share", select_share=0.5)
    counts = job.prompt_data(path, lay, settings.ppo, None, settings.eval, irm, reward)
    train, test = read_prompt_rows(lay.train), read_prompt_rows(lay.test)
    lineage = [r["extra_info"]["lineage"] for r in train + test]
    assert all(x["irm_score"] is not None and x["irm_rank"] >= 1 for x in lineage)
    assert all(x["irm_selected"] for x in (r["extra_info"]["lineage"] for r in train))  # training: selected only
    assert counts["dropped"]["irm_selection"] > 0 and counts["train"] == base["train"] - counts["dropped"]["irm_selection"]
    assert len(test) == base["test"]  # the held-out lineages are not filtered
    assert counts["irm_selection"]["mode"] == "share" and counts["irm_selection"]["selected"] > 0
    assert [r["extra_info"]["index"] for r in train] == list(range(len(train)))


def test_verified_tasks_are_never_filtered_by_the_irm(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from evolforge.storage.ppo import read_tasks
    from evolforge.storage.synthesis_sets import TASK_SCHEMA
    from evolforge.tasks.ppo.data import build_prompt_rows

    task = {name: None for name in TASK_SCHEMA.names} | {
        "status": "kept", "difficulty": "easy", "pass_rate": 1.0, "attempts": "[]", "task_id": "t-math",
        "seed_id": "s1", "kind": "math", "statement": "A box holds 3 rows of 4 eggs. How many eggs?", "answer": "3*4"}
    (tmp_path / "synth").mkdir()
    pq.write_table(pa.Table.from_pylist([task], schema=TASK_SCHEMA), tmp_path / "synth" / "tasks.parquet")
    records = read_evolved(write_evolved(tmp_path / "evolved.parquet", n_seeds=6))
    nothing = {r["id"]: {"irm_score": 0.0, "irm_rank": 1, "irm_selected": False} for r in records}
    nothing["t-math"] = nothing["s1"]  # even an id clash does not filter a task
    train, test, counts = build_prompt_rows(records, 0.0, 7, tasks=read_tasks(tmp_path / "synth"), selection=nothing)
    assert [r["extra_info"]["lineage"]["id"] for r in train] == ["t-math"]  # the only training row left
    assert train[0]["extra_info"]["lineage"]["irm_score"] is None
    # 13 distinct kept evolved rows (6 seeds, 6 evolutions, g0): each either dropped by the IRM or held out
    assert counts["dropped"]["irm_selection"] + len(test) == 13 and counts["dropped"]["irm_selection"] > 0
    assert all(r["extra_info"]["lineage"]["irm_selected"] is False for r in test)  # recorded, not filtered


def test_the_ppo_summary_states_the_selection():
    from evolforge.tasks.ppo.report import _irm_line

    assert "off" in _irm_line(None, 0)
    line = _irm_line({"mode": "share", "share": 0.5, "threshold": None, "selected": 7, "scored": 14,
                      "score_mean": 0.51}, 5)
    assert "top 50%" in line and "7 of 14" in line and "5 training prompts left out" in line
