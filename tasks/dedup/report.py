"""What a dedup run reports: the summary figures the flow adds to `dedup_file`'s summary and the `dedup-summary`
table artifact (flows/dedup.py writes them; the summary itself: tasks/dedup/pipeline.py `dedup_file`).

    plain(summary)          the summary with numpy numbers as JSON numbers (as dedup_file writes summary.json)
    counts(summary)         what stage.json keeps: kept and dropped
    removed_by_method(summary)  the `dedup-summary` table: rows removed by exact, minhash, embedding, and kept
"""

from __future__ import annotations

import json

METHODS = ("exact", "minhash", "embedding")


def plain(summary: dict) -> dict:
    """The summary as JSON values: a numpy number (a timing, a similarity) becomes a float, not a string."""
    return json.loads(json.dumps(summary, default=float))


def counts(summary: dict) -> dict:
    return {"kept": summary["kept"], "dropped": summary["dropped"]}


def removed_by_method(summary: dict) -> list[dict]:
    """One row per dedup method (records it removed), then `kept` (records kept)."""
    stats = summary["stats"]
    rows = [{"method": m, "removed": int(stats.get(f"dropped_{m}", 0))} for m in METHODS]
    rows.append({"method": "kept", "removed": summary["kept"]})
    return rows
