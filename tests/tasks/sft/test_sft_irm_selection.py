"""The RLEIF loop's IRM filter in the SFT stage: with --irm-dir and reward.select_by_irm on, only the evolved rows
the trained IRM selects are trained on; the others are skipped with their score (data/skipped.parquet)."""

from __future__ import annotations

import pytest

from evolforge.config.settings import Settings
from evolforge.storage import sft_sets as store
from evolforge.storage.layout import RunLayout
from evolforge.storage.ppo import read_evolved
from evolforge.storage.rounds import write_sft_view
from evolforge.storage.sft_sets import SFTFolder
from evolforge.tasks.core.checks import InputError
from evolforge.tasks.reward.selection import irm_selection
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


def test_unselected_evolved_rows_are_skipped_with_their_score():
    selection = {"r0": {"irm_score": 0.8, "irm_rank": 1, "irm_selected": True},
                 "r1": {"irm_score": 0.2, "irm_rank": 2, "irm_selected": False}}
    cfg = Settings().sft.model_copy(update={"decontaminate": "off"})
    built = build([_view(0), _view(1), _view(2)], [], [], set(), cfg, None, selection)
    assert [r["id"] for r in built.rows] == ["r0"]
    reasons = {s["id"]: s["reason"] for s in built.skipped}
    assert reasons == {"r1": "not selected by the IRM: IRM score 0.2 (rank 2 of 2)",
                       "r2": "not selected by the IRM: not in the scored pool"}
    assert built.counts()["skipped_by_reason"] == {"not selected by the IRM": 2}
    assert sorted(r["id"] for r in build([_view(0), _view(1)], [], [], set(), cfg, None).rows) == ["r0", "r1"]


def _evolve(tmp_path):
    evolved = write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=8)
    write_sft_view(evolved, RunLayout(tmp_path / "evolve").sft)
    return evolved


def test_prepare_trains_on_the_irm_selection(tmp_path):
    evolved = _evolve(tmp_path)
    irm = shared_reward_models() / "models" / "irm"
    reward = {"select_by_irm": "share", "select_share": 0.5}
    params = SFTParams(evolve_out=str(tmp_path / "evolve"), out=str(tmp_path / "sft"), irm_dir=str(irm),
                       overrides={"reward": reward, "sft": {"decontaminate": "off"}})
    check(params, params.settings())
    got = job.prepare(params, params.settings(), SFTFolder(params.out).ensure())
    plain = SFTParams(evolve_out=str(tmp_path / "evolve"), out=str(tmp_path / "all"), irm_dir=str(irm),
                      overrides={"sft": {"decontaminate": "off"}})  # select_by_irm off: the IRM is not used
    everything = job.prepare(plain, plain.settings(), SFTFolder(plain.out).ensure())
    assert everything["irm_selection"] is None and "not selected by the IRM" not in everything["skipped_by_reason"]

    chosen, _ = irm_selection(read_evolved(evolved), irm, params.settings().reward)  # the PPO stage's rule
    rows = store.read_rows(SFTFolder(params.out).train)
    assert rows and all(chosen[r["id"]]["irm_selected"] for r in rows if r["source"] == "evolved")
    left_out = got["skipped_by_reason"]["not selected by the IRM"]
    assert left_out > 0 and 0 < got["rows"] < everything["rows"]
    kept_all = {r["id"] for r in store.read_rows(SFTFolder(plain.out).train) if r["source"] == "evolved"}
    assert {r["id"] for r in rows if r["source"] == "evolved"} == {i for i in kept_all if chosen[i]["irm_selected"]}
    assert got["irm_selection"]["mode"] == "share" and got["irm_selection"]["selected"] == sum(
        v["irm_selected"] for v in chosen.values())
    skipped = store.read_table_rows(SFTFolder(params.out).skipped)
    assert any(s["reason"].startswith("not selected by the IRM: IRM score") for s in skipped)


def test_an_irm_dir_that_is_not_an_irm_is_refused(tmp_path):
    _evolve(tmp_path)
    params = SFTParams(evolve_out=str(tmp_path / "evolve"), out=str(tmp_path / "sft"), irm_dir=str(tmp_path))
    with pytest.raises(InputError, match="not a trained IRM folder"):
        check(params, params.settings())
