"""Nightly evolution continues the same dataset: each night one round further, in a new dated folder."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.cli.status import stage_status
from evolforge.flows.nightly import NightlyParams, nightly_flow
from evolforge.storage.folder import read_marker

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.mark.long("two whole nights through the flow, measured at 10.3 s CPU")
def test_two_nights_continue_the_same_dataset(tmp_path, server):
    seeds = tmp_path / "seeds.csv"
    seeds.write_text("prompt\n" + "\n".join(f"Name {i} famous bridges and their lengths." for i in range(4)) + "\n")
    base = dict(dataset=str(tmp_path / "ds"), seeds=str(seeds), base_url=server.base_url,
                overrides={"input": {"instruction_field": "prompt"}})
    n1 = nightly_flow(NightlyParams(night="2026-11-28", **base))
    night1 = tmp_path / "ds" / "nights" / "2026-11-28"
    lineage1_before = (night1 / "dataset" / "lineage.parquet").read_bytes()
    n2 = nightly_flow(NightlyParams(night="2026-11-29", **base))
    assert n1["previous"] is None and n2["previous"] == "2026-11-28"
    assert n2["seeds"].endswith("2026-11-28/dataset/final_pool.parquet") and n2["total_rounds"] == 2

    pool1 = pl.read_parquet(night1 / "dataset" / "final_pool.parquet")
    lin2 = pl.read_parquet(tmp_path / "ds" / "nights" / "2026-11-29" / "dataset" / "lineage.parquet")
    assert set(lin2["parent_id"]) == set(pool1["id"])  # night 2 evolved night 1's survivors
    assert set(lin2["seed_id"]) == set(pool1["seed_id"])  # seed lineage carried across nights
    assert set(lin2["generation"]) == {2}
    assert (night1 / "dataset" / "lineage.parquet").read_bytes() == lineage1_before  # never overwritten

    sent = len(server.posts())
    again = nightly_flow(NightlyParams(night="2026-11-29", **base))  # same night again: resumes, nothing new
    assert len(server.posts()) == sent and again["total_rounds"] == 2
    index = json.loads((tmp_path / "ds" / "nights.json").read_text())
    assert [e["night"] for e in index] == ["2026-11-28", "2026-11-29"]

    # the dataset folder is the nightly stage's (its stage.json), each night's folder an evolve stage's
    marker = read_marker(tmp_path / "ds")
    assert marker["kind"] == "nightly" and marker["counts"] == {"nights": 2, "total_rounds": 2}
    assert read_marker(night1)["kind"] == "evolve"
    assert json.loads((tmp_path / "ds" / "summary.json").read_text())["night"] == "2026-11-29"
    st = stage_status(tmp_path / "ds")
    assert st["kind"] == "nightly" and st["finished"] and [n["night"] for n in st["nights"]] == ["2026-11-28", "2026-11-29"]
    assert [(u["unit"], u["batches"], u["done"], u["records"], u["complete"]) for u in st["units"]] == [
        ("night 2026-11-28 round 1", 1, 1, 4, True), ("night 2026-11-29 round 1", 1, 1, 4, True)]
    assert not (tmp_path / "ds" / "ledger").exists()  # each night has its own ledger


def test_bad_night_label_fails_before_any_work(tmp_path, server):
    with pytest.raises(ValueError, match="not a date"):
        nightly_flow(NightlyParams(night="tomorrow", dataset=str(tmp_path / "ds"), base_url=server.base_url))
    assert not server.posts() and not (tmp_path / "ds").exists()
