"""Ray jobs of the PPO stage through the Ray Jobs API (ray.job_submission.JobSubmissionClient).

    job_address(configured)         the cluster's dashboard address: ppo.ray_address, else $RAY_API_SERVER_ADDRESS /
                                    $RAY_ADDRESS (Ray's client lets those override any address it is given, so a
                                    configured address that disagrees with them is refused, not silently replaced)
    JobRequest                      entrypoint (argv), submission id, runtime_env working_dir and env vars
    submit_command(address, req)    the equivalent `ray job submit` line, for users without a cluster at hand
    submit(address, req)            submit through the Jobs API; returns the job record
    wait(address, id, timeout_s)    poll until SUCCEEDED / FAILED / STOPPED or the timeout
    logs(address, id)               the job's whole log
    run(address, req, wait_s)       submit, then (wait_s > 0) wait and fetch the log; the record says how it ended

The job's environment variables show in the Ray dashboard and its job table, so `JobRequest.runtime_env` refuses a
variable (`secret_findings`) whose name is not a plain ASCII name or looks like a credential, or whose value holds a
configured secret (tasks/core/keys.py: the API keys, HF_TOKEN, the proxy's and sandbox service's tokens), a
well-known token shape or a URL with credentials; names listed in `allow_env` (ppo.ray_env_allow) pass, as the
operator vouches for them. Errors name the variables and why, never a value; a record keeps only the names. `ray[default]` provides the client (its
dashboard hosts the job server on the cluster); the client is imported only when a job is submitted.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import Any

from evolforge.tasks.core.keys import SECRET_ENV, configured_secrets

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
ADDRESS_VARIABLES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")  # Ray's order of precedence
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Names that look like credentials: a part anywhere in the name, or a whole word between underscores.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|PWD|AUTH|CREDENTIAL|COOKIE|PRIVATE|SALT|SESSION|DSN", re.IGNORECASE)
_SECRET_WORD = re.compile(r"(?:^|_)(?:PAT|CREDS?|JWT|BEARER|OTP)(?:_|$)", re.IGNORECASE)
# Values that look like credentials, whatever the variable's name.
_TOKEN_SHAPES = tuple((what, re.compile(pattern)) for what, pattern in (
    ("an API key (sk-...)", r"\bsk-[A-Za-z0-9_-]{16,}"),
    ("a GitHub token", r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
    ("a GitLab token", r"\bglpat-[A-Za-z0-9_-]{20,}"),
    ("a Hugging Face token (hf_...)", r"\bhf_[A-Za-z0-9]{20,}"),
    ("an AWS access key id", r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    ("a Google API key", r"\bAIza[0-9A-Za-z_-]{35}"),
    ("a Stripe key", r"\b[rs]k_(?:live|test)_[0-9A-Za-z]{16,}"),
    ("a Slack token (xox...)", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    ("a JWT", r"\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"),
    ("a private key", r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    ("a bearer or basic credential", r"(?i)\b(?:bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"),
    ("a URL with credentials (user@host)", r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#@]+@"),
))


class RayJobError(RuntimeError):
    """The job could not be submitted, or it failed / was stopped / did not finish in time."""


def secret_findings(env_vars: dict[str, str], allow: tuple[str, ...] = (),
                    secret_env: tuple[str, ...] = SECRET_ENV) -> dict[str, str]:
    """{variable as shown (non-ASCII escaped): why it looks like a credential} for every variable of `env_vars` not
    named in `allow`: a name that is not a plain ASCII name or looks like a credential, a value holding the value
    of one of the `secret_env` variables (as set now in this process's environment), a well-known token shape or a
    URL with credentials. The reasons never quote a value."""
    configured = configured_secrets(secret_env)
    found: dict[str, str] = {}
    for name, value in env_vars.items():
        name, value = str(name), str(value)
        if name in allow and _PLAIN_NAME.fullmatch(name):
            continue
        shown = name if name.isascii() and name.isprintable() else ascii(name)
        if not _PLAIN_NAME.fullmatch(name):
            found[shown] = "not a plain ASCII name"
        elif _SECRET_NAME.search(name) or _SECRET_WORD.search(name):
            found[shown] = "its name looks like a credential"
        elif holder := next((n for n, secret in configured.items() if secret in value), None):
            found[shown] = f"holds the value of ${holder}"
        elif shape := next((what for what, pattern in _TOKEN_SHAPES if pattern.search(value)), None):
            found[shown] = f"its value looks like {shape}"
    return found


@dataclass(frozen=True)
class JobRequest:
    """A Ray job. `allow_env`: variables passed although they look like credentials (ppo.ray_env_allow);
    `secret_env`: the variables whose values (read when the job is submitted) must not be passed."""

    entrypoint: list[str]
    submission_id: str
    working_dir: str = ""
    env_vars: dict[str, str] = field(default_factory=dict)
    entrypoint_num_cpus: float | None = None
    allow_env: tuple[str, ...] = ()
    secret_env: tuple[str, ...] = SECRET_ENV

    def runtime_env(self) -> dict[str, Any]:
        secret = secret_findings(self.env_vars, self.allow_env, self.secret_env)
        if secret:
            raise RayJobError(
                "refusing to pass " + "; ".join(f"{k} ({why})" for k, why in sorted(secret.items())) + " to the Ray "
                "job: job environment variables are shown by the Ray dashboard and its job table. Give the cluster "
                "credentials its own way (its environment, a secret store), or name a variable you vouch for in "
                "ppo.ray_env_allow")
        env: dict[str, Any] = {"env_vars": {str(k): str(v) for k, v in self.env_vars.items()}}
        if self.working_dir:
            env["working_dir"] = self.working_dir
        return env

    def entrypoint_line(self) -> str:
        return shlex.join(self.entrypoint)


def job_address(configured: str = "") -> str:
    """The dashboard address jobs go to; empty when neither the setting nor the environment names one."""
    from_env = next(((name, os.environ[name]) for name in ADDRESS_VARIABLES if os.environ.get(name)), None)
    if configured and from_env and from_env[1].rstrip("/") != configured.rstrip("/"):
        raise RayJobError(f"ppo.ray_address is {configured} but {from_env[0]}={from_env[1]}: Ray's job client always "
                          f"uses {from_env[0]}, so the job would go to the other cluster. Unset it or make them agree.")
    return configured or (from_env[1] if from_env else "")


def submit_command(address: str, request: JobRequest) -> list[str]:
    """`ray job submit` with the same id, working dir and environment (no address: $RAY_ADDRESS at run time)."""
    request.runtime_env()  # the same refusals as a submission
    cmd = ["ray", "job", "submit", "--address", address or "$RAY_ADDRESS", "--submission-id", request.submission_id,
           "--no-wait"]
    if request.working_dir:
        cmd += ["--working-dir", request.working_dir]
    if request.env_vars:
        import json

        cmd += ["--runtime-env-json", json.dumps({"env_vars": request.env_vars})]
    if request.entrypoint_num_cpus is not None:
        cmd += ["--entrypoint-num-cpus", str(request.entrypoint_num_cpus)]
    return cmd + ["--"] + list(request.entrypoint)


def _client(address: str):
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise RayJobError("submitting a Ray job needs the Ray client: pip install 'ray[default]' (or run the written "
                          "submit command where Ray is installed)") from None
    try:
        return JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayJobError(f"no Ray job server at {address}: {e} (ppo.ray_address is the dashboard address, "
                          "e.g. http://head:8265, and the head must run ray[default] with the dashboard)") from None


AGENT_WAIT_S = 60.0  # how long a submission waits for a head whose job agent has not registered yet


def submit(address: str, request: JobRequest, agent_wait_s: float = AGENT_WAIT_S) -> dict[str, Any]:
    """Submit the job. A head that answers "No available agent to submit job, please try again later" (its job
    agent is still starting: a cluster just brought up) is asked again every second for up to `agent_wait_s`;
    any other refusal is a RayJobError at once."""
    client = _client(address)
    deadline, tried = time.monotonic() + agent_wait_s, False
    while True:
        try:
            submission_id = client.submit_job(entrypoint=request.entrypoint_line(),
                                              submission_id=request.submission_id,
                                              runtime_env=request.runtime_env(),
                                              entrypoint_num_cpus=request.entrypoint_num_cpus)
            break
        except RuntimeError as e:
            if tried and "already exists" in str(e):  # an earlier attempt got through before its answer failed
                submission_id = request.submission_id
                break
            if "No available agent" in str(e) and time.monotonic() < deadline:
                tried = True
                time.sleep(1.0)
                continue
            raise RayJobError(f"Ray refused job {request.submission_id} at {address}: {e}") from None
    return {"address": address, "submission_id": submission_id, "entrypoint": request.entrypoint_line(),
            "env_var_names": sorted(request.env_vars), "working_dir": request.working_dir or None,
            "status": "PENDING", "submitted_at": time.time()}


def status(address: str, submission_id: str, client: Any = None) -> dict[str, Any]:
    info = (client or _client(address)).get_job_info(submission_id)
    return {"status": str(info.status.value if hasattr(info.status, "value") else info.status),
            "message": info.message, "exit_code": getattr(info, "driver_exit_code", None)}


def wait(address: str, submission_id: str, timeout_s: float, poll_s: float = 1.0) -> dict[str, Any]:
    """Poll until the job ends or `timeout_s` passes; returns status, message, exit_code and the seconds waited."""
    client = _client(address)
    t0 = time.monotonic()
    while True:
        st = status(address, submission_id, client)
        if st["status"] in TERMINAL or time.monotonic() - t0 >= timeout_s:
            return {**st, "waited_seconds": round(time.monotonic() - t0, 2)}
        time.sleep(poll_s)


def logs(address: str, submission_id: str) -> str:
    return _client(address).get_job_logs(submission_id)


def run(address: str, request: JobRequest, wait_s: float = 0.0) -> dict[str, Any]:
    """Submit; with wait_s > 0 also wait for the end and fetch the log (record["log"]). Does not raise on a failed
    job: the caller reports first, then calls `raise_for_status`."""
    record = submit(address, request)
    if wait_s > 0:
        record.update(wait(address, record["submission_id"], wait_s))
        record["log"] = logs(address, record["submission_id"])
    return record


def raise_for_status(record: dict[str, Any], log_tail: int = 3000) -> None:
    """Raise RayJobError unless the job succeeded or is still running (not waited for, or still going at the
    end of the wait: it keeps running on the cluster)."""
    if record.get("status") in ("FAILED", "STOPPED"):
        tail = (record.get("log") or "")[-log_tail:]
        raise RayJobError(f"Ray job {record['submission_id']} {record['status']}: {record.get('message')}\n{tail}")
