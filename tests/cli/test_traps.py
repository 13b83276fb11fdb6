"""The traps a first hour fell into, closed: a real --base-url without --model, an endpoint whose pre-flight fails
inside the flow, an unpriced model under a USD budget, a stage that keeps nothing, an unhealthy reward stage.
Each is one line naming the fix, and nothing is left in the output folder that would turn the corrected command
into a refused resume."""

from __future__ import annotations

import json

import pytest

from evolforge.cli import main
from evolforge.testing.scripted_server import ScriptedServer

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def seeds(tmp_path):
    path = tmp_path / "seeds.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Add {i} and {i + 3}, then explain."}) + "\n"
                            for i in range(3)))
    return path


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_real_endpoint_without_model_lists_its_models_then_the_corrected_command_runs(tmp_path, seeds, capsys):
    out = tmp_path / "out"
    with ScriptedServer() as srv:
        srv.models = ["org/llama-3-8b", "org/qwen-7b"]
        argv = ["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "1", "--base-url", srv.base_url]
        assert main(argv) == 2
        err = one_line(capsys)
        assert "does not serve 'smollm2-135m-instruct'" in err and "org/llama-3-8b, org/qwen-7b" in err
        assert "--model" in err and "no --model was given" in err
        assert not out.exists()  # no run.json: the corrected command is a new run, not a refused resume
        assert srv.posts() == [] and srv.probes == []  # found from GET /models alone
        assert main(argv + ["--model", "org/qwen-7b"]) == 0, capsys.readouterr().err
    assert json.loads((out / "run.json").read_text())["settings"]["models"]["default"] == "org/qwen-7b"


def test_a_failed_preflight_in_the_flow_is_one_line_and_leaves_no_folder(tmp_path, seeds, capsys):
    out = tmp_path / "out"
    with ScriptedServer() as srv:
        srv.unknown_models = {"smollm2-135m-instruct"}  # listed, but its pre-flight call is answered 404
        assert main(["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "1",
                     "--base-url", srv.base_url]) == 2
        assert len(srv.probes) == 1
    err = capsys.readouterr().err
    assert "pre-flight failed for model 'smollm2-135m-instruct'" in err and "Traceback" not in err
    assert not out.exists()


def test_unpriced_model_with_a_usd_budget_says_both_ways_out(tmp_path, seeds, capsys):
    out = tmp_path / "out"
    with ScriptedServer() as srv:
        assert main(["synthesize", "--seeds", str(seeds), "--out", str(out), "--base-url", srv.base_url]) == 2
        assert srv.probes == []
    err = one_line(capsys)
    assert "'smollm2-135m-instruct' (models.default) has no known price" in err
    assert '[pricing.overrides."smollm2-135m-instruct"]' in err and "synthesis.budget_usd_per_task = 0" in err
    assert not out.exists()


def test_a_stage_that_keeps_nothing_exits_non_zero(tmp_path, seeds, capsys):
    config = tmp_path / "tiny-budget.toml"
    config.write_text("[gateway]\nbackoff_base_seconds = 0.0\n[synthesis]\nbudget_usd_per_task = 0.0000001\n"
                      "[pricing.overrides.smollm2-135m-instruct]\ninput_per_mtok = 1.0\noutput_per_mtok = 1.0\n")
    with ScriptedServer() as srv:
        code = main(["synthesize", "--seeds", str(seeds), "--out", str(tmp_path / "out"), "--base-url", srv.base_url,
                     "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "evolforge synthesize: kept nothing (kept = 0); rejected: 3 x over the cost budget" in err


def unhealthy_reward_folder(root):
    for name in ("irm", "prm"):
        (root / "models" / name).mkdir(parents=True)
        (root / "models" / name / "config.json").write_text("{}")
    (root / "health.json").write_text(json.dumps({"data": {"passed": True}, "model": {
        "passed": False, "problems": ["IRM overfit: mean over 0.9"]}}))
    return root


def test_unhealthy_reward_stage_follows_the_health_policy(tmp_path, monkeypatch):
    from evolforge.tasks.core.checks import InputError
    from evolforge.tasks.core.stages import get
    from evolforge.testing.ppo_models import write_evolved

    evolved = write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=2)
    stage = get("ppo")
    params = stage.params(evolved=str(evolved), reward_dir=str(unhealthy_reward_folder(tmp_path / "rm")),
                          out=str(tmp_path / "ppo"))
    stage.check(params, params.settings())  # "warn", the default: it goes on (the flow logs a warning)
    monkeypatch.setenv("EVOLFORGE__REWARD__HEALTH_POLICY", "stop")
    with pytest.raises(InputError, match="IRM overfit.*run anyway with --ignore-reward-health"):
        stage.check(params, params.settings())
    ignoring = params.model_copy(update={"ignore_reward_health": True})
    stage.check(ignoring, ignoring.settings())



def test_pipeline_takes_the_override_flag(capsys):
    with pytest.raises(SystemExit):
        main(["pipeline", "--help"])
    assert "--ignore-reward-health" in capsys.readouterr().out
