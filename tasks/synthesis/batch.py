"""One batch of task synthesis, described for the batch runtime (tasks/core/batch.py).

Resume, journal replay, the atomic part and the error classification are the runtime's, as for evolve and
reward batches: a seed whose request the endpoint rejects (HTTP 400/422) is kept as a task with status
`error` (it lands in rejected.parquet with the reason); it no longer fails the whole batch. The Prefect task
that wraps it is in flows/synthesize.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

from evolforge.config.settings import Settings
from evolforge.storage import parts
from evolforge.storage.synthesis_sets import TASK_SCHEMA, SynthLayout
from evolforge.tasks.core.batch import BatchSpec, run_batch
from evolforge.tasks.core.gateway import GatewayError
from evolforge.tasks.synthesis.synthesize import SynthTask, synthesize_task


def task_kind(seed: dict, setting: str) -> str:
    if setting != "auto":
        return setting
    return "math" if seed.get("domain") == "math" else "code"


def _rejected(seed: dict, kind: str, err: GatewayError) -> dict:
    """The endpoint rejected a request of this seed's task (400/422): kept, visibly, as an error."""
    return SynthTask(task_id=f"t-{seed['id']}-{kind}", seed_id=seed.get("seed_id") or seed["id"], kind=kind,
                     status="error", reject_reason=f"endpoint rejected the request: {str(err)[:400]}").to_row()


def synthesize_batch_spec(out_dir: str | Path, batch: int, settings: Settings) -> BatchSpec:
    lay = SynthLayout(out_dir)
    kinds = settings.synthesis.kinds
    seen: list[set[str]] = []  # proposals of this batch, for near-duplicate pruning
    lock = threading.Lock()

    def work(seed: dict, gw, journal) -> dict:
        return synthesize_task(seed, task_kind(seed, kinds), gw, settings, journal, seen, lock).to_row()

    return BatchSpec(
        name=f"synth{batch}", part=lay.seeds.part(batch), journal=lay.seeds.journal(batch), schema=TASK_SCHEMA,
        load_rows=lambda: parts.read_row_group(lay.input, batch).to_pylist(),
        work=work, on_rejected=lambda seed, err: _rejected(seed, task_kind(seed, kinds), err),
        concurrency=settings.synthesis.concurrency, extra_stats=lambda statuses: {"tasks": len(statuses)})


def run_synthesize_batch(out_dir: str | Path, batch: int, settings: Settings, base_url: str, run_id: str) -> dict:
    return run_batch(synthesize_batch_spec(out_dir, batch, settings), settings, base_url, run_id, out_dir)
