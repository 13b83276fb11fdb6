"""The pipeline's stages and each one's parameters, composed from the registry's declarations (tasks/pipeline/plan.py):
which stages a run runs for its switches (a stage a later one needs runs with it), and what each stage is given
from the folders of those that ran, without running any."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolforge.storage.pipeline_sets import PipelineLayout
from evolforge.tasks.core.stages import get, stages
from evolforge.tasks.pipeline.plan import STAGES, params_of, stages_of
from evolforge.tasks.pipeline.stage import PipelineParams


@pytest.mark.parametrize("switches, expected", [
    ({}, ["evolve", "synthesize", "reward-data", "train-reward"]),
    ({"reward": False}, ["evolve", "synthesize"]),
    ({"reward": False, "synthesize": False, "ppo": True}, ["evolve", "reward-data", "train-reward", "ppo"]),
    ({"reward": False, "sft": True, "eval": True}, ["evolve", "synthesize", "sft", "eval"]),
    ({"sft": True, "ppo": True, "eval": True},
     ["evolve", "synthesize", "reward-data", "train-reward", "sft", "ppo", "eval"]),
])
def test_the_switches_choose_the_stages_and_ppo_brings_the_reward_models(switches, expected):
    assert [s.name for s in stages_of(PipelineParams(**switches))] == expected


@pytest.mark.parametrize("through, expected", [
    ("evolve", ["evolve"]),
    ("synthesize", ["evolve", "synthesize"]),
    ("reward", ["evolve", "synthesize", "reward-data", "train-reward"]),
    ("sft", ["evolve", "synthesize", "reward-data", "train-reward", "sft"]),
    ("eval", ["evolve", "synthesize", "reward-data", "train-reward", "sft", "ppo", "eval"]),
])
def test_through_runs_every_stage_up_to_it_and_none_after(through, expected):
    assert [s.name for s in stages_of(PipelineParams(through=through))] == expected


def test_a_switch_that_disagrees_with_through_is_refused_through_the_cli(tmp_path, capsys):
    from evolforge.cli import main

    assert PipelineParams(through="sft", sft=True, reward=True).sft  # agreeing switches are fine
    with pytest.raises(ValueError, match="--through reward does not run the sft stage: leave out --sft"):
        PipelineParams(through="reward", sft=True)
    with pytest.raises(ValueError, match="--through eval runs the synthesize stage: leave out --no-synthesize"):
        PipelineParams(through="eval", synthesize=False)
    code = main(["pipeline", "--through", "reward", "--sft", "--out", str(tmp_path / "out")])
    assert code == 2 and "leave out --sft" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_pipelines_stages_are_registered_in_its_order_and_switched_by_its_fields():
    order = [s.name for s in stages() if s.name in STAGES]
    assert order == list(STAGES)
    assert {s for s in STAGES.values() if s} <= set(PipelineParams.model_fields)


def _run(tmp_path: Path, params: PipelineParams, leave: dict[str, list[str]]) -> dict[str, dict]:
    """Each stage's parameters, the stages 'running' by leaving the paths `leave` names in their folders."""
    lay, ran, given = PipelineLayout(str(tmp_path)), [], {}
    for stage in stages_of(params):
        given[stage.name] = params_of(stage, params, lay, ran).model_dump(exclude_defaults=True)
        ran.append(stage.name)
        folder = lay.stage(stage.name)
        folder.mkdir(parents=True, exist_ok=True)
        for path in leave.get(stage.name, []):
            (folder / path).mkdir(parents=True, exist_ok=True)
    return given


LEFT = {"evolve": ["dataset/evolved.parquet"], "train-reward": ["models/irm", "models/prm"], "sft": ["model"]}


def test_each_stage_is_given_the_folders_of_those_before_it_and_the_pipelines_own_fields(tmp_path):
    given = _run(tmp_path, PipelineParams(out=str(tmp_path), sft=True, ppo=True, eval=True, rounds=2, validator="v",
                                          base_url="http://gpu:8000/v1", model="m"), LEFT)
    out = {name: str(PipelineLayout(str(tmp_path)).stage(name)) for name in STAGES}
    endpoint = {"base_url": "http://gpu:8000/v1", "model": "m"}
    assert given["evolve"] == {**endpoint, "out": out["evolve"], "rounds": 2}
    assert given["synthesize"] == {**endpoint, "seeds": out["evolve"] + "/dataset/evolved.parquet",
                                   "out": out["synthesize"], "validator": "v"}
    assert given["reward-data"] == {**endpoint, "evolve_out": out["evolve"], "out": out["reward-data"]}
    assert given["train-reward"] == {"data": out["reward-data"]}  # the models go into the data folder
    assert given["sft"] == {"evolve_out": out["evolve"], "tasks": out["synthesize"], "out": out["sft"],
                            "irm_dir": out["train-reward"] + "/models/irm", "prm_dir": out["train-reward"] + "/models/prm"}
    assert given["ppo"] == {"evolved": out["evolve"], "tasks": out["synthesize"], "reward_dir": out["train-reward"],
                            "sft": out["sft"], "out": out["ppo"]}
    # PPO's smoke run left no policy here: eval takes the SFT policy, and not the endpoint's model
    assert given["eval"] == {"policy": out["sft"] + "/model", "tasks": out["synthesize"], "evolve_out": out["evolve"],
                             "training": [out["evolve"], out["sft"]], "out": out["eval"]}


def test_eval_takes_the_last_policy_trained_else_the_endpoints_model(tmp_path):
    given = _run(tmp_path / "a", PipelineParams(out=str(tmp_path / "a"), sft=True, ppo=True, eval=True, model="m"),
                 {**LEFT, "ppo": ["local/policy"]})
    assert given["eval"]["policy"] == str(tmp_path / "a" / "ppo" / "local" / "policy") and "model" not in given["eval"]
    given = _run(tmp_path / "b", PipelineParams(out=str(tmp_path / "b"), reward=False, eval=True, model="m"), LEFT)
    assert given["eval"]["model"] == "m" and "policy" not in given["eval"]
    assert given["eval"]["training"] == [str(tmp_path / "b" / "evolve")]


def test_a_reward_model_not_trained_is_not_given(tmp_path):
    """Only the IRM trained: SFT gets no PRM folder, rather than one its check refuses."""
    given = _run(tmp_path, PipelineParams(out=str(tmp_path), sft=True), {**LEFT, "train-reward": ["models/irm"]})
    assert given["sft"]["irm_dir"] == str(tmp_path / "reward" / "models" / "irm") and "prm_dir" not in given["sft"]


def test_every_feeds_path_is_where_its_stage_keeps_it():
    """The paths inside a stage's folder the descriptors' feeds name are those of the stage's own folder class."""
    from evolforge.storage.layout import RunLayout
    from evolforge.storage.ppo import PPOLayout
    from evolforge.storage.reward_sets import RewardModelsFolder
    from evolforge.storage.sft_sets import SFTFolder

    root = Path("/x")
    where = {("evolve", "dataset/evolved.parquet"): RunLayout(str(root)).evolved,
             ("train-reward", "models/irm"): RewardModelsFolder(str(root)).model_dir("irm"),
             ("train-reward", "models/prm"): RewardModelsFolder(str(root)).model_dir("prm"),
             ("sft", "model"): SFTFolder(str(root)).model,
             ("ppo", "local/policy"): PPOLayout(str(root)).policy}
    named = {src for st in stages() for feed in st.feeds.values() for src in feed.sources if src[1]}
    assert named == set(where), named
    for (stage, path), kept in where.items():
        assert Path(str(kept)) == root / path, (stage, path, kept)
        assert get(stage)  # a registered stage


def test_the_check_runs_the_settings_checks_of_the_stages_it_will_run(tmp_path, monkeypatch):
    """An unpriced model under a USD budget stops the pipeline before anything runs when synthesis is on (the
    synthesis stage's settings_check), not when it is off."""
    from evolforge.config.settings import SAMPLE_SEEDS
    from evolforge.tasks.core.checks import InputError
    from evolforge.tasks.pipeline import stage as pipeline_stage

    monkeypatch.setattr(pipeline_stage, "check_endpoint", lambda settings: None)
    params = PipelineParams(seeds=str(SAMPLE_SEEDS), out=str(tmp_path / "p"), model="no-price-model",
                            base_url="http://127.0.0.1:9/v1")
    with pytest.raises(InputError, match="synthesis.budget_usd_per_task"):
        get("pipeline").check(params, params.settings())
    params = PipelineParams(seeds=str(SAMPLE_SEEDS), out=str(tmp_path / "p"), model="no-price-model",
                            base_url="http://127.0.0.1:9/v1", synthesize=False)
    get("pipeline").check(params, params.settings())
