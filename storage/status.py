"""What a stage's output folder holds, read from its checkpoints alone (no Prefect, no model, no writes).

    folder_status(out)    {"kind", "root", "finished", "units": [...], "cost": {...}, "stages": [...]}
    has_checkpoints(out)  True when a run over `out` left work to resume (a batch part or a call journal)

A unit is what a stage splits its batches by: an evolve run's rounds, the reward-data stage's IRM and PRM
sets, the synthesis and modules stages' one set. Per unit: batches done (a part is checkpointed), failed
(the part holds records that failed with an error, which `evolforge retry` redoes, or the part is
unreadable), pending (no part yet) -- the three add up to the batches -- and records in the input, done
(in any part), accepted and failed. Calls, tokens and
cost come from the folder's cost ledger. A pipeline folder (OUT/evolve, OUT/synthesize, ...) gives one
status per stage under "stages".
"""

from __future__ import annotations

from pathlib import Path

from evolforge.storage.fs import AnyPath, exists, is_remote, list_files, location, parquet_file, read_parquet
from evolforge.storage.layout import PipelineLayout, RunLayout

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
            unit["pending"] += 1
            continue
        try:
            statuses = read_parquet(part, columns=["status"]).column("status").to_pylist()
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


def _evolve_units(lay: RunLayout) -> list[dict]:
    from evolforge.storage.rounds import round_is_complete

    units = []
    for rdir in list_files(lay.rounds_dir, "round_[0-9][0-9]"):
        r = int(rdir.name.split("_")[1])
        unit = batch_unit(f"round {r}", lay.round_input(r), lambda b, r=r: lay.part(r, b))
        unit["complete"] = round_is_complete(lay, r)
        units.append(unit)
    return units


def _kind(root: AnyPath) -> str | None:
    if exists(root / "rounds"):
        return "evolve"
    if exists(root / "reward_input.parquet") or exists(root / "irm_pairs.parquet") or exists(root / "metrics.json"):
        # (irm_pairs.parquet: a reward folder from before the pairs moved to data/, storage/reward_sets.py)
        return "reward"
    if exists(root / "modules_input.parquet"):
        return "modules"
    if exists(root / "input.parquet") and exists(root / "parts"):
        return "synthesize"
    if exists(root / "verl") or exists(root / "data" / "train.parquet"):  # storage/ppo.py PPOLayout
        return "ppo"
    return None


def folder_status(out: str | Path) -> dict:
    """The status of a stage folder, or of each stage of a pipeline folder (see the module docstring)."""
    root = location(out)
    if not exists(root):
        return {"kind": None, "root": str(root), "exists": False}
    kind = _kind(root)
    if kind is None:
        pipe = PipelineLayout(root)
        stages = [folder_status(pipe.stage(s)) for s in ("evolve", "synthesize", "reward", "ppo")
                  if exists(pipe.stage(s))]
        if stages:
            return {"kind": "pipeline", "root": str(root), "exists": True, "stages": stages}
        return {"kind": None, "root": str(root), "exists": True}
    units: list[dict] = []
    extra: dict = {}
    if kind == "evolve":
        units = _evolve_units(RunLayout(root))
    elif kind == "reward":
        from evolforge.storage.reward_sets import RewardLayout

        lay = RewardLayout(root)
        units = [batch_unit(k, lay.input, lambda b, k=k: lay.part(k, b)) for k in ("irm", "prm")
                 if exists(root / k)]
        extra = {"models_trained": [k for k in ("irm", "prm") if lay.model_ready(k)]}
    elif kind == "modules":
        from evolforge.storage.module_sets import ModulesLayout

        lay = ModulesLayout(root)
        units = [batch_unit("questions", lay.input, lay.part)]
    elif kind == "synthesize":
        from evolforge.storage.synthesis_sets import SynthLayout

        lay = SynthLayout(root)
        units = [batch_unit("tasks", lay.input, lay.synth_part)]
    return {"kind": kind, "root": str(root), "exists": True, "finished": exists(root / "summary.json"),
            "units": units, "cost": ledger_totals(root), **extra}
