"""Files of a dedup run (the `dedup` stage: any jsonl / parquet / csv file -> kept set + dropped set).

    OUT/kept.<fmt>        the kept rows, every column, in input order (<fmt>: the input's format, jsonl /
                          parquet / csv)
    OUT/dropped.<fmt>     the dropped rows plus dedup_duplicate_of, dedup_method (exact | minhash | embedding),
                          dedup_similarity, dedup_matched_id, dedup_matched_similarity, dedup_detail
    OUT/summary.json      counts, the kept and dropped paths, per-method counts and timings (`stats`)
    OUT/stage.json        the stage marker (storage/folder.py)

The stage makes no model calls and has no batches: no ledger/ or logs/ folder, nothing for `status` to count
but the marker. A persistent dedup index (`--index`) is a folder of its own (storage/layout.py IndexLayout).
`write_outputs` writes the kept and dropped tables and the summary (the dedup's `write` step, tasks/dedup/plan.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from evolforge.storage.folder import StageFolder
from evolforge.storage.fs import AnyPath, ensure_dir, write_text_atomic


@dataclass(frozen=True, init=False)
class DedupOutLayout(StageFolder):
    """A dedup output folder (see the module docstring)."""

    def kept(self, fmt: str) -> AnyPath:
        return self.root / f"kept.{fmt}"

    def dropped(self, fmt: str) -> AnyPath:
        return self.root / f"dropped.{fmt}"

    def ensure(self) -> "DedupOutLayout":
        """The folder itself only: the stage calls no model, so it keeps no ledger and no process logs."""
        ensure_dir(self.root)
        return self


def _free_names(columns: list[str], taken: list[str]) -> dict[str, str]:
    """{input column: its new name} for the input columns named like one of `taken`: input_<name>, with the prefix
    repeated until the name is neither an input column nor taken (nor given to another)."""
    used, out = set(columns) | set(taken), {}
    for c in columns:
        if c in taken:
            new = f"input_{c}"
            while new in used:
                new = f"input_{new}"
            used.add(new)
            out[c] = new
    return out


def write_outputs(df, fmt: str, path, text_field: str, ids: list[str], kept_ids: Sequence[str], d: list[dict],
                  stats: dict, lay) -> dict:
    """OUT/kept.<fmt> (the kept rows, all columns, input order), OUT/dropped.<fmt> (the dropped rows plus the
    reason columns) and OUT/summary.json of a dedup of the table `df` read from `path` (`lay`: a DedupOutLayout);
    `ids` are its rows' ids, `d` the dropped records' reasons in the dedup's order. Returns the summary."""
    import polars as pl

    from evolforge.storage.datasets import write_any_table

    pos = {k: i for i, k in enumerate(ids)}
    kept_rows = sorted(pos[k] for k in kept_ids)
    reasons = pl.DataFrame({
        "dedup_duplicate_of": [r["duplicate_of"] for r in d], "dedup_method": [r["method"] for r in d],
        "dedup_similarity": [r["similarity"] for r in d], "dedup_matched_id": [r["matched_id"] for r in d],
        "dedup_matched_similarity": [r["matched_similarity"] for r in d], "dedup_detail": [r["detail"] for r in d],
    }, schema={"dedup_duplicate_of": pl.Utf8, "dedup_method": pl.Utf8, "dedup_similarity": pl.Float64,
               "dedup_matched_id": pl.Utf8, "dedup_matched_similarity": pl.Float64, "dedup_detail": pl.Utf8})
    # an input that is itself an output (evolved.parquet has dedup_similarity): its own columns keep their values
    # as input_<name>, this dedup's reasons take the names; a dedup's own dropped table already has input_<name>
    # beside <name>, so the prefix repeats until the name is free (input_input_<name>)
    dropped_rows = df[[pos[r["id"]] for r in d]]
    dropped_rows = dropped_rows.rename(_free_names(dropped_rows.columns, reasons.columns))
    dropped_df = pl.concat([dropped_rows, reasons], how="horizontal")  # before any write: nothing half-written
    ensure_dir(lay.root)
    write_any_table(df[kept_rows], lay.kept(fmt), fmt)
    write_any_table(dropped_df, lay.dropped(fmt), fmt)
    summary = {"input": str(path), "text_field": text_field, "kept": len(kept_ids), "dropped": len(d),
               "kept_path": str(lay.kept(fmt)), "dropped_path": str(lay.dropped(fmt)), "stats": stats}
    write_text_atomic(lay.summary, json.dumps(summary, indent=1, default=float))
    return summary
