"""The batch task options and the one fan-out every batched stage uses.

`BATCH_TASK_OPTIONS`: every batch task is retried on transient failures only (a down endpoint, a bad key or
a full disk stops at once), and its result is persisted and cached on inputs + source, so a retried flow
run skips the batches that finished.

`run_batches`: submit one task per batch, keep a progress artifact, collect every result, and when batches
failed raise one clear error (a down endpoint is reported first) naming the failed batches and where the
finished ones are checkpointed.
"""

from __future__ import annotations

import errno
from typing import Any, Sequence

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE
from prefect.futures import as_completed
from prefect.tasks import exponential_backoff

from evolforge.tasks.core.batch import is_fatal
from evolforge.tasks.core.gateway import EndpointDown

_STORAGE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM}


def retry_transient(task, task_run, state) -> bool:
    """Retry a batch on transient failures only; a down endpoint, a bad key or a full disk stops at once."""
    try:
        state.result()
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            return False
        return not is_fatal(e)
    return True


BATCH_TASK_OPTIONS = dict(
    retries=2,
    retry_delay_seconds=exponential_backoff(backoff_factor=5),
    retry_jitter_factor=0.5,
    retry_condition_fn=retry_transient,
    persist_result=True,
    cache_policy=INPUTS + TASK_SOURCE,
)


class BatchesFailed(RuntimeError):
    """Some batches of a stage failed; the finished ones are checkpointed."""


def run_batches(runner, task, batches: Sequence[tuple[str, dict[str, Any]]], *, what: str, checkpoints,
                progress_key: str | None = None) -> list[dict]:
    """Run `task` once per (task run name, parameters) on `runner`; results in submission order.

    `what` names the batches in the error ("round 2", "reward-data"); `checkpoints` is where the finished
    batches are kept. With `progress_key`, a Prefect progress artifact follows the batches done.
    """
    total = len(batches)
    progress = None
    if progress_key:
        progress = create_progress_artifact(progress=0.0, key=progress_key,
                                            description=f"{what}: batches done of {total}")
    futures = [runner.submit(task.with_options(task_run_name=name), parameters=params) for name, params in batches]
    position = {id(f): i for i, f in enumerate(futures)}
    results: list[Any] = [None] * total
    failed: list[tuple[int, BaseException]] = []
    for done, fut in enumerate(as_completed(futures), 1):
        i = position[id(fut)]
        try:
            results[i] = fut.result()
        except BaseException as e:  # noqa: BLE001 - collected, reported once below
            failed.append((i, e))
        if progress is not None:
            update_progress_artifact(progress, progress=100.0 * done / total)
    if failed:
        failed.sort(key=lambda x: x[0])
        first = next((e for _, e in failed if isinstance(e, EndpointDown)), failed[0][1])
        names = ", ".join(batches[i][0] for i, _ in failed[:20]) + (", ..." if len(failed) > 20 else "")
        raise BatchesFailed(
            f"{what}: {len(failed)} of {total} batches failed ({names}). First error: {first}. "
            f"Finished batches are checkpointed in {checkpoints}; run again over the same output folder, "
            "or retry this flow run, to redo only the failed batches."
        ) from None
    return results
