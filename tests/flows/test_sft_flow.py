"""The SFT flow on a real (ephemeral) Prefect server and through the CLI: rows, training with real TRL on a tiny
policy, the model folder, plots, the dataset card, the ledger row, stage.json; a second run keeps the model."""

from __future__ import annotations

import json

import pytest

from evolforge.cli import main
from evolforge.flows.sft import SFTParams, sft_flow
from evolforge.storage.folder import read_marker
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import read_ledger
from evolforge.storage.rounds import write_sft_view
from evolforge.storage.sft_sets import SFTFolder
from evolforge.testing.ppo_models import one_torch_thread, write_evolved  # noqa: F401 (autouse fixture)
from evolforge.testing.tiny_policy import build_tiny_policy

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def inputs(tmp_path):
    evolved = write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=6)
    write_sft_view(evolved, RunLayout(tmp_path / "evolve").sft)
    return tmp_path / "evolve", build_tiny_policy(tmp_path / "tiny")


def test_flow_trains_and_reports(tmp_path, inputs):
    run, tiny = inputs
    out = tmp_path / "sft"
    params = SFTParams(evolve_out=str(run), out=str(out), base_model=str(tiny), max_steps=3,
                       overrides={"sft": {"batch_size": 2, "save_steps": 2, "compute_usd_per_hour": 3.6}})
    summary = sft_flow(params)
    folder = SFTFolder(out)
    assert summary["data"]["rows"] == 5 and summary["data"]["by_source"]["evolved"] == 5
    assert summary["data"]["skipped_by_reason"] == {"held-out lineage": 1, "not step form": 2, "repeated prompt": 1}
    assert summary["decontamination"]["evolved"]["checked"] == 6  # before the repeat check
    assert summary["training"]["steps"] == 3 and folder.model_ready()
    assert set(summary["plots"]) == {"sft_loss", "sft_learning_rate"}
    assert all((out / "plots" / f"{p}.png").stat().st_size > 1000 for p in summary["plots"])
    card = (folder.data_dir / "README.md").read_text()
    assert "config_name: train" in card and "## Decontamination" in card and "table `evolved`, 6 rows" in card
    ledger = read_ledger(out)
    assert ledger.height == 1 and ledger["stage"][0] == "sft" and ledger["latency_s"][0] > 0
    assert ledger["cost_usd"][0] == pytest.approx(ledger["latency_s"][0] / 1000, rel=1e-2)  # 3.6 USD/h
    assert summary["cost"]["cost_usd"] == pytest.approx(ledger["cost_usd"][0])
    marker = read_marker(out)
    assert marker["kind"] == "sft" and marker["counts"]["rows"] == 5 and marker["counts"]["steps"] == 3
    # again over the same folder: the rows and the model are kept, nothing is trained
    again = sft_flow(params)
    assert again["data"]["reused"] and again["training"]["steps"] == 3 and read_ledger(out).height == 1
    # retrain: from the base model again (checkpoints removed), 3 steps in this run, a second ledger row
    third = sft_flow(params.model_copy(update={"retrain": True}))
    assert third["training"]["resumed_from"] is None and third["training"]["steps_this_run"] == 3
    assert read_ledger(out).height == 2


def test_command_refuses_bad_inputs_before_anything_starts(tmp_path, capsys):
    out = tmp_path / "sft"
    for args, says in ((["sft", "--out", str(out)], "nothing to train on"),
                       (["sft", "--evolve-out", str(tmp_path / "nope"), "--out", str(out)], "finished evolve run"),
                       (["sft", "--tasks", str(tmp_path), "--out", "s3://b/sft"], "not found")):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_command_runs_the_stage(tmp_path, inputs, capsys):
    run, tiny = inputs
    out = tmp_path / "sft-cli"
    code = main(["sft", "--evolve-out", str(run), "--out", str(out), "--base-model", str(tiny), "--max-steps", "2",
                 "--lora"])
    assert code == 0, capsys.readouterr().err
    meta = json.loads((out / "model" / "sft_meta.json").read_text())
    assert meta["steps"] == 2 and meta["lora"] is True and (out / "adapter" / "adapter_config.json").exists()
