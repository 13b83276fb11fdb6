"""The nightly chain (nightly -> reward-data -> train-reward -> sft -> ppo -> eval) as Prefect deployment triggers.

Unit: every link's parameters (the stage's feeds: deployments/deploy.py chain_parameters), rendered the way the
Prefect server renders them over the run before it, name the folders of storage/chain.py. Server (slow): `evolforge deploy` with three links on and two off; a
completed nightly run starts reward-data with the night's folders, its completion starts train-reward with the
reward folder as its data, that starts sft with the night's folders, and the completed sft run (its link to ppo
switched off) starts no ppo run.
The upstream runs are completed through the API (no worker): the server emits the same Completed event."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from evolforge.deployments.deploy import chain_parameters, chain_trigger, template_env
from evolforge.storage import chain
from evolforge.tasks.core.stages import get

CHAIN = ["nightly", "reward-data", "train-reward", "sft", "ppo", "eval"]


def _render(params: dict, run: dict) -> dict:
    """What the Prefect server's run-deployment action does with a trigger's parameters (RunDeployment
    .render_parameters: plain template strings upgraded, then hydrated with Jinja rendered), over `run` as the
    upstream `flow_run` it reads from its API."""
    import copy

    from prefect.server.events.actions import RunDeployment
    from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate

    params = copy.deepcopy(params)
    RunDeployment._upgrade_v1_templates(params)
    return hydrate(params, HydrationContext(raise_on_error=True, render_jinja=True, jinja_context={"flow_run": run}))


def test_each_link_renders_the_folders_of_the_night_from_the_run_before_it(monkeypatch):
    from prefect.utilities.templating import apply_values

    monkeypatch.setenv("EVOLFORGE_CHAIN_PRM_KEEP_SHARE", "0.8")  # as `evolforge deploy` sets it (template_env)
    dataset, night = "/data/nightly", "2026-12-01"
    run = {"name": chain.night_run_name(night), "parameters": {"params": {"dataset": dataset, "seeds": "s.jsonl"}}}
    seen = {}
    for up, stage in zip(CHAIN, CHAIN[1:]):
        trig = get(stage).deployment.trigger
        assert trig.after == up
        entry = chain_trigger(stage, trig)
        assert entry["expect"] == ["prefect.flow-run.Completed"]
        assert {r["prefect.resource.name"] for r in entry["match_related"]} == {up}
        assert entry["parameters"] == chain_parameters(stage)
        params = _render(apply_values(entry["parameters"], {}), run)["params"]  # prefect deploy fills $VARIABLES
        seen[stage] = params
        run = {"name": "some-random-name", "parameters": {"params": params}}
    night_dir = f"{dataset}/nights/{night}"
    folder = {s: str(chain.stage_dir(dataset, night, s)) for s in CHAIN[1:]}
    assert seen["reward-data"] == {"evolve_out": night_dir, "out": folder["reward-data"]}
    assert seen["train-reward"] == {"data": folder["reward-data"]}  # the models go into the data folder
    assert seen["sft"] == {"evolve_out": night_dir, "irm_dir": folder["reward-data"] + "/models/irm",
                           "prm_dir": folder["reward-data"] + "/models/prm", "out": folder["sft"],
                           "overrides": {"reward": {"prm_keep_share": "0.8"}}}  # the PRM filter on in the chain
    assert get("sft").params.model_validate(seen["sft"]).settings().reward.prm_keep_share == 0.8
    assert seen["ppo"] == {"evolved": night_dir, "reward_dir": folder["reward-data"], "sft": folder["sft"],
                           "out": folder["ppo"]}
    assert seen["eval"] == {"policy": folder["ppo"] + "/local/policy", "evolve_out": night_dir,
                            "training": [night_dir, folder["sft"]], "out": folder["eval"]}
    for stage, params in seen.items():  # each is a valid parameter set of its stage
        get(stage).params.model_validate(params)


def test_config_switches_each_link(tmp_path):
    from evolforge.config.settings import load_settings

    cfg = tmp_path / "c.toml"
    cfg.write_text('[schedule]\nchain = ["train-reward", "eval"]\n')
    env = template_env(load_settings(str(cfg)))
    assert env["EVOLFORGE_CHAIN_TRAIN_REWARD"] == "true" and env["EVOLFORGE_CHAIN_EVAL"] == "true"
    assert env["EVOLFORGE_CHAIN_REWARD_DATA"] == env["EVOLFORGE_CHAIN_SFT"] == env["EVOLFORGE_CHAIN_PPO"] == "false"
    assert env["EVOLFORGE_CHAIN_PRM_KEEP_SHARE"] == "0.8"  # schedule.chain_prm_keep_share's default
    cfg.write_text('[schedule]\nchain = ["rewards"]\n')
    with pytest.raises(Exception, match="unknown chain stage"):
        load_settings(str(cfg))


def _deployment(api: str, name: str) -> dict:
    deps = httpx.post(f"{api}/deployments/filter", json={"deployments": {"name": {"any_": [name]}}}, timeout=10)
    return deps.json()[0]


def _finish(api: str, run_id: str) -> str:
    """Move the run to COMPLETED through the API: the server emits prefect.flow-run.Completed as for a worker's."""
    for state in ("RUNNING", "COMPLETED"):
        r = httpx.post(f"{api}/flow_runs/{run_id}/set_state", json={"state": {"type": state}, "force": True},
                       timeout=10)
        assert r.status_code in (200, 201), r.text
    return run_id


def _runs_of(api: str, deployment: dict) -> list[dict]:
    return httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [deployment["id"]]}}},
                      timeout=10).json()


def _wait_runs(api: str, deployment: dict, timeout: float = 90) -> list[dict]:
    deadline, runs = time.time() + timeout, []
    while time.time() < deadline and not runs:
        runs = _runs_of(api, deployment)
        time.sleep(0.5)
    return runs


@pytest.mark.slow
def test_completed_run_triggers_the_next_stage_and_a_switched_off_link_does_not(prefect_server, tmp_path):
    env, api = prefect_server
    cfg = tmp_path / "c.toml"
    cfg.write_text('[schedule]\nchain = ["reward-data", "train-reward", "sft"]\n')  # ppo, eval: off
    deploy = subprocess.run([sys.executable, "-m", "evolforge.cli", "deploy", "--config", str(cfg), "--pool",
                             "chain-pool", "--no-schedule"], env=env, capture_output=True, text=True, timeout=300)
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    autos = httpx.post(f"{api}/automations/filter", json={}, timeout=10).json()
    enabled = {a["name"]: a["enabled"] for a in autos}
    assert enabled == {"nightly -> reward-data": True, "reward-data -> train-reward": True,
                       "train-reward -> sft": True, "sft -> ppo": False, "ppo -> eval": False}

    nightly, reward_data, train, sft, ppo = (_deployment(api, n) for n in
                                             ("nightly", "reward-data", "train-reward", "sft", "ppo"))
    dataset, night = tmp_path / "ds", "2026-12-01"
    out = str(chain.stage_dir(dataset, night, "reward-data"))
    # a nightly run as the flow names it (flows/nightly.py); its dataset as the deployment sets it
    run = httpx.post(f"{api}/deployments/{nightly['id']}/create_flow_run", timeout=10,
                     json={"name": chain.night_run_name(night), "parameters": {"params": {"dataset": str(dataset)}}})
    _finish(api, run.json()["id"])
    runs = _wait_runs(api, reward_data)
    assert len(runs) == 1, "no reward-data run after the nightly run completed"
    assert runs[0]["parameters"] == {"params": {"evolve_out": f"{dataset}/nights/{night}", "out": out}}

    _finish(api, runs[0]["id"])
    runs = _wait_runs(api, train)
    assert len(runs) == 1, "no train-reward run after the reward-data run completed"
    assert runs[0]["parameters"] == {"params": {"data": out}}

    _finish(api, runs[0]["id"])  # the run the trigger made completes: sft follows, from its data folder
    runs = _wait_runs(api, sft)
    assert len(runs) == 1, "no sft run after the train-reward run completed"
    assert runs[0]["parameters"] == {"params": {"evolve_out": f"{dataset}/nights/{night}",
                                                "irm_dir": f"{out}/models/irm",
                                                "prm_dir": f"{out}/models/prm",
                                                # the PRM filter on, as `evolforge deploy` rendered the default
                                                "overrides": {"reward": {"prm_keep_share": "0.8"}},
                                                "out": str(chain.stage_dir(dataset, night, "sft"))}}

    _finish(api, runs[0]["id"])  # the ppo link is off
    time.sleep(15)  # the links above fired within a few seconds
    assert _runs_of(api, ppo) == []
    assert len(_runs_of(api, train)) == len(_runs_of(api, sft)) == 1  # one run per completed upstream run


def test_a_nightly_run_is_named_after_its_night(monkeypatch):
    from prefect.runtime import flow_run

    from evolforge.flows.nightly import night_run_name

    monkeypatch.setattr(flow_run, "parameters", {"params": {"night": "2026-12-01"}}, raising=False)
    assert night_run_name() == "night-2026-12-01"  # what the reward-data link reads (flow_run.name[6:])
    monkeypatch.setattr(flow_run, "parameters", {"params": {"night": "yesterday"}}, raising=False)
    assert night_run_name() == "nightly"  # the flow reports the bad night itself


def test_the_chains_ppo_policy_is_the_ppo_folders_policy():
    """chain.PPO_POLICY is written out (storage/ppo.py loads pyarrow, the stages' descriptors must not): it is still
    where PPOLayout keeps the trained policy."""
    from pathlib import Path

    from evolforge.storage.ppo import PPOLayout

    assert chain.PPO_POLICY == PPOLayout("/x").policy.relative_to(Path("/x")).as_posix()
