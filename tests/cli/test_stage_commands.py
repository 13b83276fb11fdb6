"""The stage commands (`evolforge reward-data`, `train-reward`, `ppo`) run their flows like `run` does: same
flags, fail-fast checks, live progress, the flow's result printed, exit 0; `status` reads what they left."""

from __future__ import annotations

import json

import pytest

from evolforge.cli import main
from evolforge.cli.status import stage_status as folder_status
from evolforge.storage.reward_sets import RewardLayout
from evolforge.testing.evolved_runs import TINY_TRAINING, evolve_folder
from evolforge.testing.ppo_models import shared_reward_models, write_evolved

pytestmark = pytest.mark.usefixtures("prefect_harness")


def toml(sections: dict) -> str:
    return "".join(f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
                   for name, values in sections.items())


def test_reward_data_then_train_reward_commands(tmp_path, server, capsys):
    cfg = tmp_path / "config.toml"
    cfg.write_text(toml({"reward": {"batch_size": 4, "concurrency": 2, **TINY_TRAINING},
                         "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 2.0}}))
    out = tmp_path / "reward"
    rc = main(["reward-data", "--evolve-out", str(evolve_folder(tmp_path)), "--out", str(out),
               "--base-url", server.base_url, "--config", str(cfg)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    lay = RewardLayout(out)
    assert lay.irm_pairs.exists() and lay.prm_steps.exists()
    # a short summary (the whole one is summary.json, not the screen)
    assert "== evolforge reward-data complete ==" in captured.out and "{" not in captured.out
    assert "\nirm_pairs: 36\n" in captured.out and "\nprm_rows: 6\n" in captured.out
    assert f"summary: {out}/summary.json" in captured.out and len(captured.out.split("== evolforge")[1].splitlines()) < 20
    result = json.loads((out / "summary.json").read_text())
    assert result["irm_pairs"] == 36 and result["prm_rows"] == 6
    assert "reward-data: " in captured.out and "batches 6/6" in captured.out  # the progress, one line per update

    marker = json.loads((out / "stage.json").read_text())
    assert marker["kind"] == "reward-data" and marker["counts"] == {"irm_pairs": 36, "prm_rows": 6}
    st = folder_status(out)
    assert st["kind"] == "reward-data" and st["finished"] and [u["unit"] for u in st["units"]] == ["irm", "prm"]
    assert all(u["done"] == u["batches"] == 3 and u["pending"] == 0 for u in st["units"])
    assert st["units"][0]["accepted"] == 12 and st["cost"]["calls"] == len(server.posts()) + len(server.probes)

    rc = main(["train-reward", "--data", str(out), "--models", "irm", "--config", str(cfg)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    metrics = json.loads(lay.metrics.read_text())
    assert list(metrics["models"]) == ["irm"] and metrics["models"]["irm"]["train_pairs"] > 0
    assert lay.model_ready("irm") and not lay.model_ready("prm")
    st = folder_status(out)  # train-reward over the data folder (its default --out) keeps its reward-data marker
    assert st["kind"] == "reward-data" and st["models_trained"] == ["irm"]
    assert json.loads((out / "stage.json").read_text()) == marker

    with pytest.raises(SystemExit) as exc:  # argparse: a bad --models value is a usage error
        main(["train-reward", "--data", str(out), "--models", "irm,orm"])
    assert exc.value.code == 2 and "orm not one of irm, prm" in capsys.readouterr().err


def test_ppo_command_writes_data_and_the_verl_config(tmp_path, capsys):
    evolved = write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=6)
    cfg = tmp_path / "config.toml"
    cfg.write_text(toml({"ppo": {"policy_path": "/cluster/models/sft"}}))
    out = tmp_path / "ppo"
    rc = main(["ppo", "--evolved", str(evolved.parent.parent), "--reward-dir", str(shared_reward_models()),
               "--out", str(out), "--local-steps", "0", "--config", str(cfg)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["train"] > 0 and (out / "verl" / "ppo_config.yaml").exists()
    assert "verl.trainer.main_ppo" in (out / "verl" / "submit.sh").read_text()
    assert folder_status(out)["kind"] == "ppo"
