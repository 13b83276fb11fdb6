"""Typed settings of the sandbox that runs untrusted generated code (tasks/sandbox/run.py).

Two modes:

- ``bwrap`` (default, the only one that is a security boundary): bubblewrap with
  new PID, network, IPC and UTS namespaces, a read-only view of only /usr, the
  Python interpreter prefix and its site-packages, a private size-capped tmpfs as
  working dir, a cleared environment, a dedicated unprivileged uid, and rlimits.
  Without bubblewrap the sandbox refuses to run (``SandboxUnavailable``).
- ``rlimits-only``: a plain subprocess with the same rlimits, a new session, a
  clean environment and a temporary working dir. It is NOT a security boundary
  (the code can read and write whatever the calling user can, and use the
  network); it must be chosen explicitly, for trusted code or development only.

``service`` (``[sandbox.service]``) configures ``evolforge sandbox-serve``, the same sandbox behind
SandboxFusion's HTTP API (tasks/sandbox/service.py); the limits above are its caps.
"""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import Field, field_validator

from evolforge.config.sections._base import HostNames, Section, WebOrigins


class SandboxServiceSettings(Section):
    """`evolforge sandbox-serve`: this sandbox behind SandboxFusion's HTTP API (`POST /run_code`), for verl."""

    host: str = Field("127.0.0.1", description="Address to bind. Loopback by default; any other address needs an "
                      "access token (token_env).")
    port: int = Field(8080, ge=0, le=65535, description="Port to listen on (0: any free port).")
    token_env: str = Field("EVOLFORGE_SANDBOX_TOKEN", description="Environment variable holding the access token. "
                           "When set, every call must carry it: as `Authorization: Bearer TOKEN`, or in the path "
                           "(`/t/TOKEN/run_code`, the form verl can send). Required when host is not loopback.")
    max_concurrency: int = Field(2, ge=1, le=1024, description="Sandboxed runs in flight at once; further calls wait "
                                 "(each run gets its own thread, uid and PID namespace).")
    queue_timeout_seconds: float = Field(20.0, gt=0, description="How long a call may wait for a free run slot "
                                         "before it is answered 504 (verl's client retries a 504 with back-off).")
    max_body_bytes: int = Field(2_000_000, ge=1024, description="Largest request body accepted (413 above).")
    allowed_hosts: HostNames = Field(default_factory=list, description="Host names clients may reach the service by, "
                                     "besides loopback names and addresses and the address it is bound to (a request "
                                     "with another Host is refused: that is how a web page reaches a loopback server "
                                     "through DNS rebinding). Needed for a name on a non-loopback bind, e.g. "
                                     "[\"sandbox-box\"]; [\"*\"] accepts any.")
    allowed_origins: WebOrigins = Field(default_factory=list, description="Web origins (scheme://host[:port]) whose "
                                        "pages may call the service from a browser. Browser-originated requests (an "
                                        "Origin header, or Sec-Fetch-Site cross-site / same-site) are refused unless "
                                        "their origin is listed; listed ones get CORS answers. Empty (default): no web "
                                        "page may run code on it; [\"*\"]: any page may.")


class SandboxSettings(Section):
    """Isolation mode, resource limits and parallelism of sandboxed test runs."""

    mode: Literal["bwrap", "rlimits-only"] = Field(
        "bwrap",
        description="bwrap: bubblewrap isolation plus rlimits (refuses to run when bwrap is missing). "
        "rlimits-only: rlimits, new session, clean env and temp dir only; NOT a security boundary.",
    )
    bwrap_path: str = Field("/usr/bin/bwrap", description="The bubblewrap executable (`apt-get install -y bubblewrap`).")
    cpu_seconds: int = Field(10, ge=1, le=3600, description="RLIMIT_CPU per process: SIGXCPU at this many CPU seconds, SIGKILL one second later.")
    memory_mb: int = Field(1024, ge=64, le=1_048_576, description="RLIMIT_AS (address space) per process, in MiB.")
    max_processes: int = Field(64, ge=4, le=65_536, description="RLIMIT_NPROC: processes and threads the sandboxed uid may have at once.")
    max_file_size_mb: int = Field(16, ge=1, le=1_048_576, description="RLIMIT_FSIZE: largest file the code may write, in MiB.")
    max_open_files: int = Field(256, ge=16, le=1_048_576, description="RLIMIT_NOFILE: open file descriptors per process.")
    max_output_bytes: int = Field(
        1_000_000, ge=1024, description="Cap on captured stdout + stderr; the run is killed when the code prints more."
    )
    wall_timeout_seconds: float = Field(30.0, gt=0, le=86_400, description="Wall-clock limit of one run; the whole process tree is killed.")
    tmpfs_size_mb: int = Field(64, ge=1, le=65_536, description="Size of each private tmpfs (working dir and /tmp) in bwrap mode, in MiB.")
    max_parallel: int = Field(4, ge=1, le=1024, description="Sandboxed runs in flight at once in `run_many`.")
    reuse_workers: bool = Field(
        True,
        description="bwrap mode: run each check in a child forked from a warm worker (one long-lived bwrap sandbox "
        "with the interpreter and pytest loaded); the child gets fresh /sandbox, /tmp and /dev/shm, its own session, "
        "rlimits, uid and no capabilities, and every process of it is killed before the next check. "
        "false: start one bwrap sandbox, interpreter and pytest per check (slower, the pre-pool behaviour).",
    )
    pytest_direct: bool = Field(
        True,
        description="reuse_workers: a pytest file whose tests are plain module-level `def test_*():` functions (no "
        "fixtures, marks, classes or module setup) has them called directly after importing the file as pytest "
        "would, inside pytest's capture, warning filters, logging handlers and assertion hooks, instead of through "
        "pytest's collection tree and runner (the same verdict, less CPU per check; see docs/sandbox.md). A failed "
        "test is run again after the verdict for a report with pytest's assertion details, in pytest's short form. "
        "Any other test file runs under pytest's runner. false: every pytest file runs under pytest's runner.",
    )
    confirm_runs: int = Field(
        2, ge=1, le=16,
        description="A passing verdict used as a reward (PPO's code reward, rejection sampling: run_many(..., "
        "reward=True)) must pass this many runs, each with another hash seed (PYTHONHASHSEED 1, 2, ...; every other "
        "check runs once with seed 1), so a solution that is right on some runs only is not paid for its lucky one. "
        "Only passes are re-run: a failing first run costs one run. 1: no confirmation.",
    )
    worker_max_checks: int = Field(
        200, ge=1, le=1_000_000,
        description="reuse_workers: a worker's sandbox is replaced after this many checks (and at once after a timeout, "
        "an output cap, a surviving process or any protocol anomaly). Idle workers kept: max(max_parallel, "
        "service.max_concurrency).",
    )
    python: str = Field(
        default_factory=lambda: sys.executable,
        description="Interpreter that runs the tests (a venv's python works: its base prefix and site-packages are bound read-only). "
        "Needs pytest installed for pytest-style test files.",
    )
    node: str = Field(
        "node",
        description="The Node.js executable for language \"nodejs\" (a name looked up on PATH, or a path). Bound "
        "read-only into the sandbox at its real path (its prefix when outside /usr). Its address-space limit is "
        "memory_mb + 1024 MiB (V8 reserves that much at start) and its JavaScript heap is capped at memory_mb.",
    )
    extra_ro_binds: list[str] = Field(
        default_factory=list, description="Further host paths made visible read-only at the same path inside the sandbox (bwrap mode)."
    )
    uid_base: int = Field(
        1_500_000, ge=1000, le=4_000_000_000,
        description="When started as root, each concurrent run gets its own unprivileged uid in [uid_base, uid_base + 65536) "
        "so RLIMIT_NPROC is enforced (root is exempt from it) and counted per run. Pick a range no host account uses.",
    )
    service: SandboxServiceSettings = Field(
        default_factory=SandboxServiceSettings,
        description="The SandboxFusion-compatible service (`evolforge sandbox-serve`); the limits above are its caps: "
        "a call's run_timeout and memory_limit_MB can only tighten them.",
    )

    @field_validator("extra_ro_binds")
    @classmethod
    def _absolute(cls, v: list[str]) -> list[str]:
        bad = [p for p in v if not p.startswith("/")]
        if bad:
            raise ValueError(f"paths must be absolute, got {bad}")
        return v
