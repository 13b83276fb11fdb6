"""Ray job submission against a head that is still starting (its job agent not registered yet): the refusal Ray
answers then is retried for a while; any other refusal fails at once. The client here is scripted (the retry
logic); tests/testing/test_ray_cluster.py submits to a real Ray cluster."""

from __future__ import annotations

import pytest

from evolforge.tasks.ppo import ray_jobs
from evolforge.tasks.ppo.ray_jobs import JobRequest, RayJobError

NO_AGENT = "Request failed with status code 500: No available agent to submit job, please try again later.."


class ScriptedClient:
    def __init__(self, failures: list[str]):
        self.failures = list(failures)
        self.calls = 0

    def submit_job(self, **kw):
        self.calls += 1
        if self.failures:
            raise RuntimeError(self.failures.pop(0))
        return kw["submission_id"]


def _submit(monkeypatch, client, **kw):
    monkeypatch.setattr(ray_jobs, "_client", lambda address: client)
    monkeypatch.setattr(ray_jobs.time, "sleep", lambda s: None)
    return ray_jobs.submit("http://127.0.0.1:8265", JobRequest(entrypoint=["python", "-V"], submission_id="job-1"), **kw)


def test_a_head_without_its_job_agent_yet_is_asked_again(monkeypatch):
    client = ScriptedClient([NO_AGENT, NO_AGENT])
    record = _submit(monkeypatch, client)
    assert record["submission_id"] == "job-1" and client.calls == 3


def test_an_attempt_that_got_through_is_not_submitted_twice(monkeypatch):
    client = ScriptedClient([NO_AGENT, "Job with submission_id job-1 already exists. Please use a different id."])
    assert _submit(monkeypatch, client)["submission_id"] == "job-1" and client.calls == 2


def test_other_refusals_and_an_agent_that_never_comes_fail(monkeypatch):
    with pytest.raises(RayJobError, match="entrypoint_num_cpus"):
        _submit(monkeypatch, ScriptedClient(["bad entrypoint_num_cpus"]))
    with pytest.raises(RayJobError, match="already exists"):  # a first attempt: another job of that id
        _submit(monkeypatch, ScriptedClient(["Job with submission_id job-1 already exists."]))
    with pytest.raises(RayJobError, match="No available agent"):
        _submit(monkeypatch, ScriptedClient([NO_AGENT] * 3), agent_wait_s=0.0)
