"""The nightly dataset: one dated folder per night and an index of the nights.

    DATASET/nights/YYYY-MM-DD/   an evolve output folder (see storage/layout.py)
    DATASET/nights.json          [{night, seeds, previous, rounds, total_rounds, evolved, cost_usd}, ...]
"""

from __future__ import annotations

import json
from pathlib import Path

from evolforge.storage.fs import AnyPath, ensure_dir, exists, location, read_text, write_text_atomic
from evolforge.storage.layout import RunLayout


class NightIndex:
    """DATASET may be a local folder or an fsspec URL (see storage/fs.py)."""

    def __init__(self, root: str | Path):
        self.root = location(root)
        self.path = self.root / "nights.json"

    def night_dir(self, night: str) -> AnyPath:
        return self.root / "nights" / night

    @property
    def dedup_index(self) -> AnyPath:
        """One dedup index per dataset: every night is checked against all earlier ones."""
        return self.root / "dedup_index"

    def entries(self) -> list[dict]:
        if not exists(self.path):
            return []
        return json.loads(read_text(self.path))

    def last_finished(self, before: str) -> str | None:
        done = [e["night"] for e in self.entries() if e["night"] < before
                and exists(RunLayout(self.night_dir(e["night"])).final_pool)]
        return max(done) if done else None

    def final_pool(self, night: str) -> AnyPath:
        return RunLayout(self.night_dir(night)).final_pool

    def record(self, night: str, *, seeds: str, previous: str | None, summary: dict) -> dict:
        entries = [e for e in self.entries() if e["night"] != night]
        prev_total = next((e["total_rounds"] for e in entries if e["night"] == previous), 0)
        rounds = len(summary["rounds"])
        entry = {"night": night, "seeds": seeds, "previous": previous, "rounds": rounds,
                 "total_rounds": prev_total + rounds, "evolved": summary["counts"]["evolved"],
                 "cost_usd": summary["cost"].get("cost_usd"), "out": summary["out_dir"]}
        entries.append(entry)
        entries.sort(key=lambda e: e["night"])
        ensure_dir(self.root)
        write_text_atomic(self.path, json.dumps(entries, indent=2))
        return entry
