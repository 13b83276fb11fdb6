"""One batch of task synthesis (plain function + thin Prefect task), checkpointed like evolve batches."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa

from ..config.settings import Settings
from ..storage import parts
from ..storage.fs import exists
from ..storage.synthesis_sets import TASK_SCHEMA, SynthLayout
from .evolve_batch import BATCH_TASK_OPTIONS, batch_journal, gateway_for
from .synthesis import synthesize_task


def task_kind(seed: dict, setting: str) -> str:
    if setting != "auto":
        return setting
    return "math" if seed.get("domain") == "math" else "code"


def run_synthesize_batch(out_dir: str | Path, batch: int, settings: Settings, base_url: str, run_id: str) -> dict:
    lay = SynthLayout(out_dir)
    part = lay.synth_part(batch)
    if exists(part):
        try:
            t = parts.read_part(part)
            return {"part": str(part), "tasks": t.num_rows, "skipped": True}
        except parts.CorruptPart:
            parts.quarantine(part)
    seeds = parts.read_row_group(lay.input, batch).to_pylist()
    gw = gateway_for(settings, base_url, run_id, out_dir)
    seen: list[set[str]] = []
    lock = threading.Lock()
    with batch_journal(gw, lay.synth_journal(batch), settings) as journal:
        workers = max(1, min(settings.synthesis.concurrency, len(seeds)))
        with ThreadPoolExecutor(workers, thread_name_prefix=f"synth{batch}") as pool:
            futures = [pool.submit(synthesize_task, s, task_kind(s, settings.synthesis.kinds), gw, settings, journal,
                                   seen, lock) for s in seeds]
            results = [f.result() for f in futures]
    table = pa.Table.from_pylist([r.to_row() for r in results], schema=TASK_SCHEMA)
    parts.write_table_atomic(table, part)
    return {"part": str(part), "tasks": table.num_rows, "skipped": False}


from prefect import task  # noqa: E402


@task(name="synthesize-batch", **BATCH_TASK_OPTIONS)
def synthesize_batch_task(out_dir: str, batch: int, settings_json: str, base_url: str, run_id: str) -> dict:
    return run_synthesize_batch(out_dir, batch, Settings.model_validate_json(settings_json), base_url, run_id)
