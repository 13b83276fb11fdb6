"""The run record, OUT/run.json: what an evolve run stands on, checked whenever a run goes on over the folder.

    {
      "run_id": ..., "created_at": ...,            the first run over the folder
      "seeds": PATH, "seeds_sha256": ..., "seeds_bytes": N,   the seed file of the run (content hash, streamed)
      "settings": {...},                           the run's settings, whole (a retry reuses the result-changing
                                                   ones but the locations: `recorded_overrides`; `evolforge
                                                   retry`, the evolve flow's `retry`, tasks/evolve/stage.py);
                                                   evol_instruct.rounds is the most rounds any run asked for
      "history": [                                 every run over the folder, oldest first, appended, never rewritten
        {"event": "start", "run_id", "at", "seeds", "seeds_sha256", "seeds_bytes", "rounds", "settings"},
        {"event": "resume", "run_id", "at", "rounds", ...},
        {"event": "forced", ..., "changes": {key: [old, new]}, "seeds_changed": {...}, "replaced": {...}},
      ]
    }

A run that goes on over an existing output folder (its round-1 pool exists) must use the same inputs:
  - the seed file's content (sha256); the same content under another path is accepted and noted;
  - the settings that change results (`result_settings`): the models each evolve stage uses (as resolved:
    a stage's own model, else models.default), every evol_instruct setting but rounds, concurrency and
    batch_size (how many records share a checkpoint: each record is evolved the same whatever its batch;
    its randomness is seeded by record), every input setting, the dedup settings when dedup_each_round is on
    (but threads, chunk_records, batch_size, static_cache_dir: speed and caches), and the embedded model's
    model_path, alias, n_ctx and max_new_tokens when the embedded model serves.
Not compared (they change how fast, where or how a run goes, not what it produces): gateway (endpoint URL,
concurrency, timeouts, retries), runner, storage (flush window), pricing (cost reporting only), schedule,
and the other stages' sections. A setting the record does not know (added in a later version) is not compared.
`evol_instruct.rounds` is handled by the flow: more rounds continue the run, fewer keep the finished ones.

A changed input raises `RunInputsChanged`, naming what changed and the two ways on: accept it
(`force_settings` / `--force-settings`, recorded in the history; the round-1 pool already imported is kept)
or start a new run in a new output folder.
"""

from __future__ import annotations

import copy
import hashlib
import time
from typing import Any

from evolforge.config.settings import Settings
from evolforge.storage.fs import AnyPath, exists, location, read_json, write_json_atomic
from evolforge.storage.layout import RunLayout

EVOLVE_STAGES = ("evolve", "judge", "answer")
# Inside the compared sections: settings that change speed, checkpoint granularity or caches, not results.
NOT_RESULTS = frozenset({
    "evol_instruct.rounds",  # checked apart (the flow): more rounds continue the run, fewer keep finished rounds
    "evol_instruct.concurrency", "evol_instruct.batch_size",
    "dedup.threads", "dedup.chunk_records", "dedup.batch_size", "dedup.static_cache_dir",
})
EMBEDDED_RESULTS = ("model_path", "alias", "n_ctx", "max_new_tokens")
# Result-changing settings that are also locations of models or files to load or write: a run's record never sets
# them for a later run over the folder (`recorded_overrides`); the user's settings do, and a difference from the
# record stops the run like any changed setting (`open_run`).
LOCATIONS = frozenset({"embedded.model_path", "dedup.embedding_model", "dedup.static_cache_dir", "dedup.shard_dir"})


class RunInputsChanged(ValueError):
    """A run over an existing output folder with other seeds or result-changing settings than the run's own."""


def seed_digest(seeds: str | AnyPath) -> dict[str, Any]:
    """sha256 and size of the seed file (local path or URL), read in 1 MiB chunks."""
    h, n = hashlib.sha256(), 0
    with location(seeds).open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return {"seeds_sha256": h.hexdigest(), "seeds_bytes": n}


def result_settings(settings: dict) -> dict[str, Any]:
    """The settings (a `Settings.fingerprint()` dict) that change an evolve run's results, as flat dotted keys."""
    out: dict[str, Any] = {}
    models = settings.get("models", {})
    for stage in EVOLVE_STAGES:
        out[f"models.{stage}"] = models.get(stage) or models.get("default")
    sections = ["evol_instruct", "input"]
    if settings.get("evol_instruct", {}).get("dedup_each_round"):
        sections.append("dedup")
    for section in sections:
        for key, value in _flatten(settings.get(section, {}), section).items():
            if key not in NOT_RESULTS:
                out[key] = value
    if not settings.get("gateway", {}).get("base_url"):  # the embedded model serves
        for key in EMBEDDED_RESULTS:
            out[f"embedded.{key}"] = settings.get("embedded", {}).get(key)
    return out


def recorded_overrides(recorded: dict) -> dict[str, Any]:
    """The run's own result-changing settings (a `Settings.fingerprint()` dict from run.json) as nested overrides
    for a retry of the run: the models each evolve stage used, the evol_instruct, input and dedup sections, the
    embedded model's alias, n_ctx and max_new_tokens. Never a location (LOCATIONS), the endpoint, key handling,
    runner, storage or any other setting: an output folder is data, so those come from the user's settings.
    Keys the current settings do not know are left out."""
    from evolforge.config.settings import Settings

    models = recorded.get("models") or {}
    out: dict[str, Any] = {"models": {s: m for s in EVOLVE_STAGES if (m := models.get(s) or models.get("default"))}}
    for section in ("evol_instruct", "input", "dedup", "embedded"):
        known = Settings.model_fields[section].annotation.model_fields
        wanted = EMBEDDED_RESULTS if section == "embedded" else known
        values = {k: v for k, v in (recorded.get(section) or {}).items()
                  if k in known and k in wanted and f"{section}.{k}" not in LOCATIONS}
        if values:
            out[section] = values
    return out


def _flatten(d: dict, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}.{k}"))
        else:
            out[f"{prefix}.{k}"] = v
    return out


def settings_changes(recorded: dict, now: dict) -> dict[str, list]:
    """{key: [recorded, now]} for every result-changing setting both know and that differs."""
    old, new = result_settings(recorded), result_settings(now)
    return {k: [old[k], new[k]] for k in sorted(old.keys() & new.keys()) if old[k] != new[k]}


class RunRecord:
    """run.json of one run over an output folder: `open_run` checks it, `save` appends this run to its history."""

    def __init__(self, layout: RunLayout, info: dict, entry: dict, notes: list[str]):
        self.layout, self.info, self.entry, self.notes = layout, info, entry, notes

    @property
    def event(self) -> str:
        return self.entry["event"]

    def save(self) -> dict:
        """Write run.json with this run appended to the history (the start record's seed hash is taken now
        when it was not yet: the seed file exists once the round-1 pool was imported from it)."""
        if self.event == "start" and "seeds_sha256" not in self.info:
            try:
                digest = seed_digest(self.info["seeds"])
            except OSError as e:  # only when the pool was there already (run.json was missing) and the file is gone
                digest = {"seeds_sha256": None, "seeds_bytes": None}
                self.entry["seeds_note"] = f"seed file unreadable ({type(e).__name__}): no hash recorded"
            self.info.update(digest)
            self.entry.update(digest)
        self.info.setdefault("history", []).append(self.entry)
        write_json_atomic(self.layout.run_info, self.info)
        return self.info


def open_run(layout: RunLayout, seeds: str, settings: Settings, run_id: str, *, force: bool = False,
             retry: bool = False) -> RunRecord:
    """The record of the run at `layout`, checked against this run's seeds and settings.

    A folder without a round-1 pool holds no results yet: this run starts it (an earlier record's history
    is kept). Otherwise changed seeds or result-changing settings raise `RunInputsChanged`, unless `force`
    (then the change is recorded and the run goes on with the new settings). A `retry` reads no seed file: it
    works from the folder's imported round-1 pool, and the recorded path may name a file that moved or that
    is another one now (a folder moved or copied elsewhere).
    """
    seeds = str(location(seeds))
    now = settings.fingerprint()
    at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rounds = settings.evol_instruct.rounds
    old = read_json(layout.run_info)
    if old is None or not exists(layout.round_input(1)):
        history = list(old.get("history", [])) if old else []
        info = {"run_id": run_id, "created_at": at, "seeds": seeds, "settings": now, "history": history}
        entry = {"event": "start", "run_id": run_id, "at": at, "seeds": seeds, "rounds": rounds,
                 "settings": copy.deepcopy(now)}
        notes = []
        if old is None and exists(layout.round_input(1)):
            notes.append(f"{layout.run_info} was missing beside an imported round-1 pool: recorded from this run")
            entry["note"] = notes[-1]
        return RunRecord(layout, info, entry, notes)

    if "history" not in old:  # a run.json from before the history: its content is the first record
        old["history"] = [{"event": "start", "run_id": old.get("run_id"), "at": None, "seeds": old.get("seeds"),
                           "settings": copy.deepcopy(old.get("settings")),
                           "note": "recorded before run.json kept a history"}]
    info = old
    entry: dict[str, Any] = {"event": "resume", "run_id": run_id, "at": at, "rounds": rounds}
    notes: list[str] = []
    problems: list[str] = []

    recorded_rounds = info["settings"].get("evol_instruct", {}).get("rounds") or rounds
    changes = settings_changes(info["settings"], now)
    if changes:
        problems.append("settings that change results differ from the run's: " + "; ".join(
            f"{k} {old_v!r} -> {new_v!r}" for k, (old_v, new_v) in changes.items()))

    seeds_changed = {} if retry else _seeds_change(info, seeds)
    if seeds_changed.get("changed"):
        problems.append(seeds_changed["message"])
    elif seeds_changed.get("note"):
        notes.append(seeds_changed["note"])
        entry["seeds_note"] = seeds_changed["note"]
        if "seeds_sha256" in seeds_changed.get("new", {}):  # same content, new path: `evolforge retry` finds it
            info["seeds"] = seeds

    if problems and not force:
        raise RunInputsChanged(
            f"{layout.root} holds a run started from other inputs (" + "; ".join(problems) + "): going on would "
            "mix results; pass --force-settings (flow parameter force_settings) to go on with these (recorded in "
            "run.json; the round-1 pool imported from the run's seeds is kept), or a new output folder (--out) to "
            "start a new run. Speed and location settings (concurrency, batch size, timeouts, endpoint URL, "
            "runner) may differ."
        )
    if problems:
        entry["event"] = "forced"
        entry["changes"] = changes
        replaced: dict[str, Any] = {}
        if changes:
            replaced["settings"] = info["settings"]
        if seeds_changed.get("changed"):
            entry["seeds_changed"] = {k: seeds_changed[k] for k in ("old", "new")}
            replaced.update({k: info.get(k) for k in ("seeds", "seeds_sha256", "seeds_bytes")})
            new_seeds = seeds_changed["new"]
            info.update(seeds=seeds, seeds_sha256=new_seeds.get("seeds_sha256"), seeds_bytes=new_seeds.get("seeds_bytes"))
        entry["replaced"] = replaced
        info["settings"] = now
        notes.append("accepted with force_settings: " + " | ".join(problems))
    elif "seeds_sha256" in seeds_changed.get("new", {}) and not info.get("seeds_sha256"):
        info.update({k: v for k, v in seeds_changed["new"].items() if k != "seeds"})  # a legacy record: hash now
    # `evolforge retry` redoes as many rounds as any run asked for
    info["settings"].setdefault("evol_instruct", {})["rounds"] = max(recorded_rounds, rounds)
    return RunRecord(layout, info, entry, notes)


def _seeds_change(info: dict, seeds: str) -> dict[str, Any]:
    """Compare this run's seed file with the record's: {changed, message, old, new} or {note} or {}."""
    old = {k: info.get(k) for k in ("seeds", "seeds_sha256", "seeds_bytes")}
    try:
        new = {"seeds": seeds, **seed_digest(seeds)}
    except (FileNotFoundError, OSError) as e:
        if seeds == info.get("seeds"):
            return {"note": f"seed file {seeds} cannot be read any more ({type(e).__name__}); the run's imported "
                            "round-1 pool is used"}
        return {"changed": True, "old": old, "new": {"seeds": seeds},
                "message": f"seed file changed: {info.get('seeds')} -> {seeds} (which cannot be read: {e})"}
    if old["seeds_sha256"] is None:  # a legacy record: no hash to compare, only the path
        if seeds != old["seeds"]:
            return {"changed": True, "old": old, "new": new,
                    "message": f"seed file changed: {old['seeds']} -> {seeds} (sha256 {new['seeds_sha256'][:16]}; "
                               "the run's record holds no hash of its seed file)"}
        return {"new": new}
    if new["seeds_sha256"] != old["seeds_sha256"]:
        same = "the same path, other content" if seeds == old["seeds"] else f"{old['seeds']} -> {seeds}"
        return {"changed": True, "old": old, "new": new,
                "message": f"seed file changed ({same}): sha256 {old['seeds_sha256'][:16]}... "
                           f"({old['seeds_bytes']} bytes) -> {new['seeds_sha256'][:16]}... ({new['seeds_bytes']} bytes)"}
    if seeds != old["seeds"]:
        return {"new": new, "note": f"seed file {old['seeds']} is now given as {seeds} (same content, sha256 "
                                    f"{new['seeds_sha256'][:16]}...): accepted"}
    return {"new": new}
