"""The RLEIF loop's PRM filter in the SFT stage: with --prm-dir and reward.prm_min_step > 0, an evolved answer is
trained on only when every step scores at least that under the trained PRM; the others are skipped with their
lowest step and score (data/skipped.parquet). Verified tasks are never filtered by it."""

from __future__ import annotations

import pytest

from evolforge.config.settings import Settings
from evolforge.storage import sft_sets as store
from evolforge.storage.layout import RunLayout
from evolforge.storage.ppo import read_evolved
from evolforge.storage.rounds import write_sft_view
from evolforge.storage.sft_sets import SFTFolder
from evolforge.tasks.core.checks import InputError
from evolforge.tasks.problems.benchmarks import held_out_seeds
from evolforge.tasks.reward.selection import prm_filter
from evolforge.tasks.sft import job
from evolforge.tasks.sft.data import build
from evolforge.tasks.sft.stage import SFTParams, check
from evolforge.testing.ppo_models import (
    one_torch_thread,  # noqa: F401 (autouse fixture)
    shared_reward_models,
    write_evolved,
)

STEPS = "Step 1: 3 + 4 = 7.\nStep 2: 7 - 1 = 6.\nThe answer is: 6"


def _view(i):
    return {"id": f"r{i}", "seed_id": f"s{i}", "round": 1, "domain": "math",
            "messages": [{"role": "user", "content": f"Question number {i}: how many apples?"},
                         {"role": "assistant", "content": STEPS}]}


def test_answers_with_a_doubted_step_are_skipped_with_the_step_and_score():
    prm = {"r0": {"prm_min": 0.9, "prm_step": 2, "prm_kept": True},
           "r1": {"prm_min": 0.1, "prm_step": 1, "prm_kept": False}}
    cfg = Settings().sft.model_copy(update={"decontaminate": "off"})
    built = build([_view(0), _view(1), _view(2)], [], [], set(), cfg, None, prm=prm)
    assert [r["id"] for r in built.rows] == ["r0"]
    reasons = {s["id"]: s["reason"] for s in built.skipped}
    assert reasons == {"r1": "a step the PRM doubts: step 1 scored 0.1", "r2": "a step the PRM doubts: not scored"}
    assert sorted(r["id"] for r in build([_view(0), _view(1)], [], [], set(), cfg, None).rows) == ["r0", "r1"]


def _evolve(tmp_path):
    evolved = write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=8)
    write_sft_view(evolved, RunLayout(tmp_path / "evolve").sft)
    return evolved


@pytest.mark.long("the PRM (MiniLM) scores every evolved answer three times, ~11 s CPU")
def test_prepare_trains_only_on_answers_the_prm_accepts(tmp_path):
    evolved = _evolve(tmp_path)
    prm_dir = shared_reward_models() / "models" / "prm"
    plain = SFTParams(evolve_out=str(tmp_path / "evolve"), out=str(tmp_path / "all"), prm_dir=str(prm_dir),
                      overrides={"sft": {"decontaminate": "off"}})  # reward.prm_min_step 0: the PRM is not used
    everything = job.prepare(plain, plain.settings(), SFTFolder(plain.out).ensure())
    assert everything["prm_filter"] is None
    view = store.read_rows(SFTFolder(plain.out).train)
    held = held_out_seeds(read_evolved(evolved), [], plain.settings().ppo)  # the stage's own split
    asked = job.prm_rows(store.read_table_rows(RunLayout(tmp_path / "evolve").sft), held, plain.settings().sft)
    scored, _ = prm_filter(asked, prm_dir, 0.0)
    mins = sorted(v["prm_min"] for v in scored.values())
    threshold = mins[len(mins) // 2]  # the median lowest-step score: about half the answers pass
    params = SFTParams(evolve_out=str(tmp_path / "evolve"), out=str(tmp_path / "sft"), prm_dir=str(prm_dir),
                       overrides={"reward": {"prm_min_step": threshold}, "sft": {"decontaminate": "off"}})
    check(params, params.settings())
    got = job.prepare(params, params.settings(), SFTFolder(params.out).ensure())
    rows = {r["id"] for r in store.read_rows(SFTFolder(params.out).train) if r["source"] == "evolved"}
    passing = {i for i, v in scored.items() if v["prm_min"] >= threshold}
    assert rows == passing & {r["id"] for r in view if r["source"] == "evolved"}
    assert 0 < len(rows) < sum(r["source"] == "evolved" for r in view)
    assert got["prm_filter"]["kept"] == len(passing) and got["prm_filter"]["scored"] == len(scored)
    skipped = store.read_table_rows(SFTFolder(params.out).skipped)
    assert any(s["reason"].startswith("a step the PRM doubts: step ") for s in skipped)


def test_a_prm_dir_that_is_not_a_prm_is_refused(tmp_path):
    _evolve(tmp_path)
    params = SFTParams(evolve_out=str(tmp_path / "evolve"), out=str(tmp_path / "sft"), prm_dir=str(tmp_path))
    with pytest.raises(InputError, match="not a trained PRM folder"):
        check(params, params.settings())


def test_keep_share_keeps_the_best_answers_by_their_lowest_step(monkeypatch):
    from evolforge.tasks.reward import scoring

    lowest = {"a": 0.9, "b": 0.2, "c": 0.6, "d": 0.05, "e": 0.6}
    # the PRM's step scores stand in (the PRM itself is tested above): each answer's steps, its lowest as given
    monkeypatch.setattr(scoring, "score_step_lists", lambda d, prompts, steps: [[0.99, lowest[p]] for p in prompts])
    rows = [(k, k, ["s1", "s2"]) for k in lowest]
    got, summary = prm_filter(rows, "prm", 0.0, keep_share=0.6)  # 3 of 5
    assert {k for k, v in got.items() if v["prm_kept"]} == {"a", "c", "e"}
    assert [got[k]["prm_rank"] for k in "acebd"] == [1, 2, 3, 4, 5] and got["b"]["prm_step"] == 2
    assert summary["kept"] == 3 and summary["keep_share"] == 0.6
    both, _ = prm_filter(rows, "prm", 0.7, keep_share=0.6)  # with a threshold too: both must hold
    assert {k for k, v in both.items() if v["prm_kept"]} == {"a"}
    assert sum(v["prm_kept"] for v in prm_filter(rows, "prm", 0.0, keep_share=0.01)[0].values()) == 1  # at least one
    assert all(v["prm_kept"] for v in prm_filter(rows, "prm", 0.0)[0].values())  # neither set: all kept
