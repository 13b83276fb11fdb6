"""Plots of the PPO (GRPO smoke run), trajectories and module-DAG stages: PNG files in OUT/plots/, each a readable
image of a sane size, each inline in the stage's markdown artifact; every plot draws on empty or odd data."""

from __future__ import annotations

import base64
import json
import time

import httpx
import matplotlib.image
import pytest

from evolforge.tasks.modules import report as modules_report
from evolforge.tasks.ppo import report as ppo_report
from evolforge.tasks.trajectories import report as trajectory_report
from evolforge.testing.lazy import lazy_module

openai = lazy_module("openai")

pytestmark = pytest.mark.usefixtures("prefect_harness")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def artifact_markdown(key: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key!r}"
    return sorted(found, key=lambda a: a.created)[-1].data


def assert_plots(folder, names: set[str], key: str) -> dict:
    files = {p.stem: p for p in (folder / "plots").glob("*.png")}
    assert set(files) == names
    md = artifact_markdown(key)
    for name, path in files.items():
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC)
        height, width = matplotlib.image.imread(path).shape[:2]
        assert 150 < height < 1500 and 500 < width < 1800, (name, width, height)
        assert f"![{name}](data:image/png;base64,{base64.b64encode(data).decode()})" in md
    return files


def test_ppo_plots_grpo_steps_and_held_out_rewards(tmp_path):
    import torch

    from evolforge.flows.ppo import PPOParams, ppo_flow
    from evolforge.storage.ppo import PPOLayout
    from evolforge.testing.ppo_models import shared_reward_models, write_evolved
    from evolforge.testing.tiny_policy import build_tiny_policy

    threads = torch.get_num_threads()
    evolved = write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=6)
    out = tmp_path / "ppo"
    build_tiny_policy(PPOLayout(out).base_policy)
    try:
        summary = ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(shared_reward_models()), out=str(out),
                                     local_steps=3, overrides={"ppo": {
                                         "local_max_completion_length": 8, "local_eval_max_new_tokens": 8,
                                         "local_torch_threads": 1}}))
    finally:
        torch.set_num_threads(threads)
    assert_plots(out, {"grpo_training", "held_out_reward"}, "ppo-plots")
    assert set(summary["plots"]) == {"grpo_training", "held_out_reward"}
    assert json.loads((out / "summary.json").read_text())["plots"] == summary["plots"]


def test_ppo_without_a_local_run_draws_no_plots(tmp_path):
    from evolforge.flows.ppo import PPOParams, ppo_flow
    from evolforge.testing.ppo_models import shared_reward_models, write_evolved

    evolved = write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=6)
    summary = ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(shared_reward_models()), out=str(tmp_path / "p"),
                                 local_steps=0, overrides={"ppo": {"policy_path": "/cluster/sft"}}))
    assert "plots" not in summary and not (tmp_path / "p" / "plots").exists()


def test_trajectories_plots(tmp_path):
    from evolforge.flows.trajectories import TrajectoriesParams, trajectories_flow
    from evolforge.storage.proxy_sets import ProxyLayout, iter_records
    from evolforge.tasks.proxy.server import running_proxy
    from evolforge.testing.agent_upstream import AgentUpstream
    from evolforge.testing.settings import make_settings

    rec = tmp_path / "rec"
    with AgentUpstream() as up, running_proxy(make_settings(), up.base_url, str(rec)) as url:
        for i in range(4):
            client = openai.OpenAI(base_url=f"{url}/s/t{i}/v1", api_key="sk-test", max_retries=0)
            msgs = [{"role": "user", "content": f"List {i + 2} rivers"}]
            for _ in range(i + 1):  # 1..4 calls per session
                reply = client.chat.completions.create(model="agent-model", messages=msgs)
                msgs += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": "More?"}]
        with httpx.Client(base_url=url, timeout=10) as h:
            assert h.post("/s/t0/reward", json={"reward": 0.25}).status_code == 200
            assert h.post("/s/t3/reward", json={"reward": 1.0}).status_code == 200
            for i in range(4):
                assert h.post(f"/s/t{i}/finish").status_code == 200
        deadline = time.time() + 10
        while len(list(iter_records(ProxyLayout(rec)))) < 10 and time.time() < deadline:
            time.sleep(0.05)
    out = tmp_path / "out"
    summary = trajectories_flow(TrajectoriesParams(proxy_out=str(rec), out=str(out), tokens=False, dedup=False))
    assert_plots(out, {"trajectory_calls", "session_rewards"}, "trajectories-plots")
    assert json.loads((out / "summary.json").read_text())["plots"] == summary["plots"]
    from evolforge.storage.trajectory_sets import TrajectoryLayout, call_figures

    fig = call_figures(TrajectoryLayout(out))
    assert sorted(fig["calls_per_session"]) == [1, 2, 3, 4] and len(fig["latency_s"]) == 10
    assert sorted(r for r in fig["session_rewards"] if r is not None) == [0.25, 1.0]
    assert fig["session_rewards"].count(None) == 2


def test_modules_plots(tmp_path):
    from evolforge.flows.modules import ModulesParams, modules_flow
    from evolforge.testing.scripted_server import ScriptedServer

    src = tmp_path / "questions.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"m{i}", "question": f"What is {i} times 3?"}) for i in range(3)) + "\n")
    with ScriptedServer(hang_seconds=3.0, nodelay=True) as srv:
        summary = modules_flow(ModulesParams(input=str(src), out=str(tmp_path / "out"), base_url=srv.base_url,
                                             overrides={"modules": {"batch_size": 3},
                                                        "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 5.0}}))
    assert_plots(tmp_path / "out", {"module_contributions", "module_schema_pass", "cost_tokens_by_stage"},
                 "modules-plots")
    assert set(summary["plots"]) == {"module_contributions", "module_schema_pass", "cost_tokens_by_stage"}


@pytest.mark.parametrize("draw", [
    lambda: ppo_report.grpo_training([]),
    lambda: ppo_report.grpo_training([{"step": 1, "reward": None, "kl": float("nan")}, {"step": "x"}],
                                {"passed": False, "steps_watched": 1, "r_a": {}, "drift": None}),
    lambda: ppo_report.policy_rewards([], []),
    lambda: ppo_report.policy_rewards([0.5, None, float("inf")], [1.0], "train (no held-out prompts)"),
    lambda: trajectory_report.trajectory_calls([], [], [], []),
    lambda: trajectory_report.trajectory_calls([1], [None], [None], [None]),
    lambda: trajectory_report.session_rewards([None, None]),
    lambda: modules_report.module_contributions({}),
    lambda: modules_report.module_contributions({"<b>x</b>" * 20: [], "y": [3.0, -10.0]}),
    lambda: modules_report.module_schema_pass([{"id": "a", "runs": 0}]),
    lambda: modules_report.module_schema_pass([{"id": "a" * 200, "runs": 2, "ok": 1, "invalid": None, "error": 1}]),
])
def test_every_new_plot_draws_on_empty_or_odd_data(draw):
    assert draw().startswith(PNG_MAGIC)
