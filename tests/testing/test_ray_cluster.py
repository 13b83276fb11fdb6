"""A real local Ray cluster (`ray start --head` on loopback, 2 CPUs, a 200 MB object store) for the PPO stage's
Ray job (through the Jobs API) and for the evolve flow on Prefect's Ray task runner.

The cluster is started once per session and stopped by process id (testing/ray_cluster.py); its teardown checks
that no Ray process of it is left.
"""

from __future__ import annotations

import json
import os
import re
import shlex

import polars as pl
import pytest

from evolforge.flows.ppo import PPOParams, ppo_flow
from evolforge.storage.ppo import PPOLayout, read_jsonl
from evolforge.tasks.ppo import ray_jobs
from evolforge.testing.lazy import needs
from evolforge.testing.ppo_models import (
    one_torch_thread,  # noqa: F401 (autouse fixture)
    shared_reward_models,
    write_evolved,
)

pytestmark = needs("ray", "prefect_ray")


@pytest.fixture(scope="module")
def ray_cluster():
    from evolforge.testing.ray_cluster import local_ray_cluster, processes_using, session_pids

    with local_ray_cluster(num_cpus=2, object_store_memory=200_000_000) as cluster:
        yield cluster
    assert not session_pids(cluster.session_id) and not processes_using(cluster.temp_dir)
    assert cluster.stragglers == [], f"Ray processes outlived the graceful stop: {cluster.stragglers}"


@pytest.fixture
def no_ray_env(monkeypatch):
    for name in ray_jobs.ADDRESS_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def evolved(tmp_path):
    return write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=6)


def _client(cluster):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(cluster.dashboard_url)


# ---------------------------------------------------------------- without a cluster

def test_secret_looking_env_vars_never_reach_the_job():
    req = ray_jobs.JobRequest(entrypoint=["python3", "-c", "pass"], submission_id="x",
                              env_vars={"HF_HOME": "/cache", "OPENAI_API_KEY": "sk-live-123", "hf_token": "t"})
    with pytest.raises(ray_jobs.RayJobError, match=r"OPENAI_API_KEY \(.*\); hf_token \(") as err:
        req.runtime_env()
    assert "sk-live-123" not in str(err.value)
    with pytest.raises(ray_jobs.RayJobError):
        ray_jobs.submit_command("http://head:8265", req)  # not even into the printed command


def test_a_configured_address_the_environment_would_override_is_refused(monkeypatch, no_ray_env):
    assert ray_jobs.job_address("") == ""
    monkeypatch.setenv("RAY_ADDRESS", "http://other:8265")
    assert ray_jobs.job_address("") == "http://other:8265"
    assert ray_jobs.job_address("http://other:8265/") == "http://other:8265/"
    with pytest.raises(ray_jobs.RayJobError, match="RAY_ADDRESS"):
        ray_jobs.job_address("http://head:8265")


def test_the_printed_command_carries_the_same_job():
    req = ray_jobs.JobRequest(entrypoint=["python3", "-m", "m", "a b"], submission_id="id-1", working_dir="/w",
                              env_vars={"HF_HOME": "/c"}, entrypoint_num_cpus=1)
    cmd = ray_jobs.submit_command("", req)
    assert cmd[:5] == ["ray", "job", "submit", "--address", "$RAY_ADDRESS"]
    assert cmd[cmd.index("--submission-id") + 1] == "id-1" and cmd[cmd.index("--working-dir") + 1] == "/w"
    assert json.loads(cmd[cmd.index("--runtime-env-json") + 1]) == {"env_vars": {"HF_HOME": "/c"}}
    assert cmd[cmd.index("--") + 1:] == ["python3", "-m", "m", "a b"]


# ---------------------------------------------------------------- on the cluster

@pytest.mark.slow  # about 80 s on 2 shared cores: the job imports torch / transformers / TRL and trains
@pytest.mark.usefixtures("prefect_harness", "no_ray_env")
def test_grpo_smoke_run_as_a_ray_job(tmp_path, evolved, ray_cluster):
    """The PPO stage submits its GRPO smoke run through the Jobs API, waits for SUCCEEDED, and reports what the
    job wrote (tiny policy, the MiniLM reward models)."""
    from safetensors.torch import load_file

    from evolforge.testing.tiny_policy import build_tiny_policy

    out = tmp_path / "ppo"
    lay = PPOLayout(out)
    build_tiny_policy(lay.base_policy)  # the base policy the flow would otherwise convert from the GGUF
    summary = ppo_flow(PPOParams(
        evolved=str(evolved), reward_dir=str(shared_reward_models()), out=str(out), local_steps=2,
        ray_address=ray_cluster.dashboard_url, ray_job="grpo_smoke", ray_wait_seconds=300,
        overrides={"ppo": {"local_max_completion_length": 8, "local_eval_max_new_tokens": 8,
                           "ray_env_vars": {"EVOLFORGE_TEST_MARK": "on-the-cluster"}}}))
    job = summary["ray_job"]
    assert job["kind"] == "grpo_smoke" and job["status"] == "SUCCEEDED", job
    assert job["env_var_names"] == ["EVOLFORGE_TEST_MARK", "OMP_NUM_THREADS", "PYTHONUNBUFFERED"]
    # Ray's own record of the job
    info = _client(ray_cluster).get_job_info(job["submission_id"])
    assert info.status == "SUCCEEDED"
    assert shlex.split(info.entrypoint) == ["python3", "-m", "evolforge.tasks.ppo.grpo_smoke", str(lay.grpo_job_spec)]
    assert info.runtime_env["env_vars"]["EVOLFORGE_TEST_MARK"] == "on-the-cluster"
    # the job's output: its log line agrees with the metrics it wrote
    log = lay.ray_job_log.read_text()
    line = re.search(rf"GRPO smoke run {job['submission_id']}: 2 steps .*reward per step \[(.*?)\]", log)
    assert line, log[-2000:]
    steps = read_jsonl(lay.metrics)
    assert [s["step"] for s in steps] == [1, 2]
    assert [float(x) for x in line.group(1).split(",")] == [round(s["reward"], 4) for s in steps]
    # ... and it ran in the cluster's worker, not in this process
    local = summary["local_grpo"]
    assert local["ran_on"] == "ray_job" and local["job_id"] == job["submission_id"] and local["pid"] != os.getpid()
    assert local["algorithm"] == "GRPO" and summary["training_health"]["completions"] == 2 * 2 * 2
    sft, trained = load_file(lay.base_policy / "model.safetensors"), load_file(lay.policy / "model.safetensors")
    assert any(not sft[k].equal(trained[k]) for k in sft)
    assert json.loads(lay.summary.read_text())["ray_job"]["status"] == "SUCCEEDED"


@pytest.mark.usefixtures("prefect_harness", "no_ray_env")
def test_verl_ppo_job_is_submitted_as_written_and_its_failure_fails_the_flow(tmp_path, evolved, ray_cluster):
    """The verl job reaches the cluster with exactly the written overrides; verl is not installed on this cluster,
    so the job fails, and the flow says so with the job's log."""
    out = tmp_path / "ppo"
    with pytest.raises(ray_jobs.RayJobError, match=r"FAILED") as err:
        ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(shared_reward_models()), out=str(out), local_steps=0,
                           ray_address=ray_cluster.dashboard_url, ray_wait_seconds=120,
                           overrides={"ppo": {"policy_path": "/cluster/models/sft"}}))
    lay = PPOLayout(out)
    record = json.loads(lay.submission.read_text())
    assert record["kind"] == "verl_ppo" and record["status"] == "FAILED" and record["exit_code"] not in (0, None)
    assert "verl" in str(err.value) and "verl" in lay.ray_job_log.read_text()
    info = _client(ray_cluster).get_job_info(record["submission_id"])
    argv = shlex.split(info.entrypoint)
    assert argv[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert argv[3:] == lay.verl_overrides.read_text().splitlines()
    assert json.loads(lay.summary.read_text())["ray_job"]["status"] == "FAILED"  # reported before failing


def _evolve(tmp_path, server, name, runner):
    from evolforge.flows.evolve import EvolveParams, evolve_flow
    from evolforge.storage.layout import RunLayout

    seeds = tmp_path / "seeds.jsonl"
    if not seeds.exists():
        seeds.write_text("\n".join(json.dumps({"id": f"s{i}", "instruction": f"Describe river number {i} in detail."})
                                   for i in range(12)) + "\n")
    evolve_flow(EvolveParams(seeds=str(seeds), out=str(tmp_path / name), rounds=2, base_url=server.base_url,
                             overrides={"evol_instruct": {"batch_size": 3}, "runner": runner}))
    lay = RunLayout(tmp_path / name)
    return pl.read_parquet(lay.lineage).drop(["model"]).sort("id"), lay


@pytest.mark.usefixtures("prefect_harness", "no_ray_env")
def test_evolve_on_the_ray_task_runner_matches_threads(tmp_path, server, ray_cluster):
    from evolforge.storage.ledger import read_ledger

    threads, _ = _evolve(tmp_path, server, "threads", {"kind": "threads", "max_workers": 2})
    on_ray, lay = _evolve(tmp_path, server, "ray", {"kind": "ray", "address": ray_cluster.gcs_address})
    assert on_ray.height == threads.height > 12 and on_ray.equals(threads)
    # the batches ran in the cluster's worker processes: their ledger files carry other process ids
    batch_pids = {int(p.name.split(".")[1]) for p in lay.ledger_dir.glob("*.jsonl")
                  if any(json.loads(r).get("stage") != "preflight" for r in p.read_text().splitlines() if r.strip())}
    assert batch_pids and os.getpid() not in batch_pids
    assert read_ledger(lay.root).filter(pl.col("stage") != "preflight").height == 12 * 2 * 3
