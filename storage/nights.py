"""The nightly stage's folder: a dataset of one dated evolve folder per night and an index of the nights.

    DATASET/stage.json           the stage marker: kind "nightly", counts once a night finished (storage/folder.py)
    DATASET/nights/YYYY-MM-DD/   an evolve output folder (storage/layout.py RunLayout, its own stage.json)
    DATASET/nights.json          [{night, seeds, previous, rounds, total_rounds, evolved, cost_usd, out}, ...]
    DATASET/dedup_index/         one dedup index for the dataset: every night is checked against all earlier ones
    DATASET/summary.json         the last night's entry (flows/nightly.py)

`evolforge status --out DATASET` counts the batches of every night's rounds ("night 2026-11-28 round 1").
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from evolforge.storage.folder import BatchedSet, StageFolder
from evolforge.storage.fs import AnyPath, ensure_dir, exists, list_files, read_text, write_text_atomic
from evolforge.storage.layout import RunLayout


@dataclass(frozen=True, init=False)
class NightlyFolder(StageFolder):
    """A nightly dataset (see the module docstring); DATASET may be a local folder or an fsspec URL (storage/fs.py).
    Its nights have their own ledgers, logs and summaries: the dataset folder itself holds none of them."""

    @property
    def index(self) -> AnyPath:
        """nights.json: one entry per finished night, in night order."""
        return self.root / "nights.json"

    @property
    def nights_dir(self) -> AnyPath:
        return self.root / "nights"

    def night_dir(self, night: str) -> AnyPath:
        return self.nights_dir / night

    def night(self, night: str) -> RunLayout:
        """The evolve folder of a night."""
        return RunLayout(self.night_dir(night))

    @property
    def dedup_index(self) -> AnyPath:
        """One dedup index per dataset: every night is checked against all earlier ones."""
        return self.root / "dedup_index"

    def nights_started(self) -> list[str]:
        """The nights that have a folder, in order."""
        return sorted(d.name for d in list_files(self.nights_dir, "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"))

    def entries(self) -> list[dict]:
        if not exists(self.index):
            return []
        return json.loads(read_text(self.index))

    def last_finished(self, before: str) -> str | None:
        """The latest night before `before` that finished (its final pool written): what the next night evolves."""
        done = [e["night"] for e in self.entries() if e["night"] < before and exists(self.final_pool(e["night"]))]
        return max(done) if done else None

    def final_pool(self, night: str) -> AnyPath:
        return self.night(night).final_pool

    def record(self, night: str, *, seeds: str, previous: str | None, summary: dict) -> dict:
        """Enter a finished night (its evolve summary) in nights.json; returns its entry."""
        entries = [e for e in self.entries() if e["night"] != night]
        prev_total = next((e["total_rounds"] for e in entries if e["night"] == previous), 0)
        rounds = len(summary["rounds"])
        entry = {"night": night, "seeds": seeds, "previous": previous, "rounds": rounds,
                 "total_rounds": prev_total + rounds, "evolved": summary["counts"]["evolved"],
                 "cost_usd": summary["cost"].get("cost_usd"), "out": summary["out_dir"]}
        entries.append(entry)
        entries.sort(key=lambda e: e["night"])
        ensure_dir(self.root)
        write_text_atomic(self.index, json.dumps(entries, indent=2))
        return entry

    def batched_sets(self) -> dict[str, BatchedSet]:
        """Every round of every night ("night 2026-11-28 round 1"): what `evolforge status` counts."""
        return {f"night {n} {unit}": s for n in self.nights_started() for unit, s in self.night(n).batched_sets().items()}

    def unit_complete(self, unit: str) -> bool:
        """A night's round ("night 2026-11-28 round 1") is complete: its _SUCCESS marker is whole."""
        _, night, rest = unit.split(" ", 2)
        return self.night(night).unit_complete(rest)

    def status_extra(self) -> dict:
        return {"nights": self.entries()}

    def ensure(self) -> "NightlyFolder":
        """The dataset folder only: each night's evolve run makes its own folder, ledger and logs."""
        ensure_dir(self.root)
        return self
