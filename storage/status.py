"""What a stage's output folder holds, read from its checkpoints alone (no Prefect, no model, no writes).

    folder_status(out)    {"kind", "root", "finished", "units": [...], "cost": {...}, "stages": [...]}
    has_checkpoints(out)  True when a run over `out` left work to resume (a batch part or a call journal)

The folder's kind is the stage named by its stage.json marker (storage/folder.py), written by the stage runner;
a unit is one of the batched tables of the stage's folder class (`StageFolder.batched_sets`). Per unit: batches done (a part is checkpointed), failed
(the part holds records that failed with an error, which `evolforge retry` redoes, the part is
unreadable, or the batch raised and left its failure marker instead of a part: "failure" is the first such
batch's error), pending (no part and no failure: not run yet, running, or stopped) -- the three add up to the
batches -- and records in the input, done
(in any part), accepted and failed. Calls, tokens and
cost come from the folder's cost ledger. A folder of folders with markers (a pipeline run's) gives one status
per stage under "stages".
"""

from __future__ import annotations

from pathlib import Path

from evolforge.storage.folder import read_marker
from evolforge.storage.fs import AnyPath, exists, is_remote, list_files, location, parquet_file, read_parquet
from evolforge.storage.parts import read_failure

# statuses of a record that made it through its stage (evolve: accepted; synthesis: kept; reward: ranked / ok)
ACCEPTED_STATUSES = frozenset({"accepted", "kept", "ok", "ranked"})
ERROR_STATUSES = frozenset({"error"})


def has_checkpoints(out: str | Path) -> bool:
    """A batch part or a call journal anywhere under `out`: running again resumes from them."""
    root = location(out)
    if not exists(root):
        return False
    patterns = ("**/parts/batch_*.parquet", "**/journal/*.jsonl")
    if is_remote(root):
        fs = root.fs
        return any(fs.glob(f"{root.path.rstrip('/')}/{p}") for p in patterns)
    return any(next(root.glob(p), None) is not None for p in patterns)


def _input_rows(path: AnyPath) -> list[int]:
    """Records per batch (one row group per batch) of a stage's input snapshot."""
    meta = parquet_file(path).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def batch_unit(name: str, input_path: AnyPath, part_of) -> dict:
    """Batches and records of one unit: `part_of(batch)` is the batch's part path."""
    sizes = _input_rows(input_path) if exists(input_path) else []
    unit = {"unit": name, "batches": len(sizes), "done": 0, "failed": 0, "pending": 0, "records": sum(sizes),
            "records_done": 0, "accepted": 0, "errors": 0, "failed_batches": []}
    for b in range(len(sizes)):
        part = part_of(b)
        if not exists(part):
            failure = read_failure(part)  # the batch raised (its retries spent, or a fatal error): no part
            if failure is None:
                unit["pending"] += 1
            else:
                unit["failed"] += 1
                unit["failed_batches"].append(b)
                unit.setdefault("failure", failure.get("error"))  # the first failed batch's error
            continue
        try:
            if "status" in parquet_file(part).schema_arrow.names:
                statuses = read_parquet(part, columns=["status"]).column("status").to_pylist()
            else:  # a stage whose records carry no status: every record of a written part is done
                statuses = ["ok"] * parquet_file(part).metadata.num_rows
        except Exception:  # noqa: BLE001 - an unreadable part is a failed batch (moved aside and redone on resume)
            unit["failed"] += 1
            unit["failed_batches"].append(b)
            continue
        errors = sum(1 for s in statuses if s in ERROR_STATUSES)
        unit["records_done"] += len(statuses)
        unit["accepted"] += sum(1 for s in statuses if s in ACCEPTED_STATUSES)
        unit["errors"] += errors
        if errors:
            unit["failed"] += 1
            unit["failed_batches"].append(b)
        else:
            unit["done"] += 1
    return unit


def ledger_totals(out: str | Path) -> dict:
    """Calls, failed attempts, tokens and cost of a folder's ledger; cost None when any call has no price."""
    from evolforge.storage.ledger import read_ledger, totals

    df = read_ledger(out)
    if df.is_empty():
        return {"calls": 0, "failed_attempts": 0, "tokens": 0, "cost_usd": 0.0, "unpriced_calls": 0, "by_stage": []}
    by_stage = totals(df, ["stage"]).to_dicts()
    unpriced = int(df["cost_usd"].null_count())
    return {"calls": df.height, "failed_attempts": int((df["outcome"] != "ok").sum()),
            "tokens": int((df["prompt_tokens"].fill_null(0) + df["completion_tokens"].fill_null(0)).sum()),
            "cost_usd": None if unpriced else float(df["cost_usd"].sum()), "unpriced_calls": unpriced,
            "by_stage": by_stage}


def folder_status(out: str | Path, folders: dict[str, type]) -> dict:
    """The status of a stage folder (see the module docstring): its kind from its stage.json marker, its units
    from the batched tables of its folder class (`folders`: stage name -> StageFolder class, from the stage
    registry). A folder whose sub-folders have markers (a pipeline run's stage folders) gives one status per
    sub-folder under "stages" (its kind: its own marker's, else "pipeline")."""
    root = location(out)
    if not exists(root):
        return {"kind": None, "root": str(root), "exists": False}
    marker = read_marker(root)
    subs = [folder_status(sub, folders) for sub in list_files(root, "*") if read_marker(sub) is not None]
    if subs:
        return {"kind": marker["kind"] if marker else "folders", "root": str(root), "exists": True,
                "finished": bool(marker and marker.get("finished_at")), "stages": subs}
    if marker is None:
        return {"kind": None, "root": str(root), "exists": True}
    folder = folders.get(marker["kind"])
    lay = folder(root) if folder is not None else None
    units = [batch_unit(name, s.input, s.part) for name, s in lay.batched_sets().items()] if lay else []
    complete = getattr(lay, "unit_complete", None)
    if complete is not None:
        for u in units:
            u["complete"] = complete(u["unit"])
    return {"kind": marker["kind"], "root": str(root), "exists": True, "finished": bool(marker.get("finished_at")),
            "units": units, "cost": ledger_totals(root), **(lay.status_extra() if lay else {})}
