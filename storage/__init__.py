"""The only code that touches checkpoints and datasets on disk.

- layout:   where every file of a run lives (one place to change a path).
- parts:    atomic parquet part files (one per batch) and their validation.
- journal:  append-only jsonl logs of completed model calls, replayed on resume.
- ledger:   the cost ledger (one row per model call) and its totals.
- datasets: reading seed datasets (jsonl / parquet / csv) with a rejects file, writing outputs.
"""
