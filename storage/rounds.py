"""Round bookkeeping of the evolve stage on disk (paths: storage/layout.py RunLayout): next pools,
completion markers, round tables, final datasets and their SFT view, the retry's reopened batches, the
rounds' dedup decisions.

Everything streams batch by batch (one row group / part at a time), so memory
stays flat as the dataset grows. The pool a round evolves has one entry per
seed: an accepted evolution replaces its parent, an eliminated (or errored)
evolution gives the parent back to the pool to be evolved again next round.

    write_final_datasets(layout, rounds, batch_size)  dataset/evolved, lineage, final_pool
    write_sft_view(evolved, dest)                      dataset/sft/train.parquet (TRL SFTTrainer `messages`)
    reopen_failed_batches(layout, stamp)               what a retry redoes (tasks/evolve/resume.py)
"""

from __future__ import annotations

import json

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from evolforge.storage.datasets import POOL_SCHEMA
from evolforge.storage.fs import (
    AnyPath,
    exists,
    list_files,
    parquet_writer,
    read_parquet,
    replace,
    scan_parquet,
    unlink,
    write_json_atomic,  # noqa: F401 - write_json_atomic: part of this module's API
    write_text_atomic,
)
from evolforge.storage.layout import RunLayout
from evolforge.storage.parts import num_row_groups, read_part, read_row_group, write_table_atomic
from evolforge.storage.schemas import LINEAGE_SCHEMA


def read_row_groups_all(path: AnyPath) -> pa.Table:
    return read_parquet(path)


def batch_count(layout: RunLayout, round_no: int) -> int:
    return num_row_groups(layout.round_input(round_no))


def round_is_complete(layout: RunLayout, round_no: int) -> bool:
    """The round's _SUCCESS marker parses and every batch part it counts is present (RunLayout.round_complete)."""
    return layout.round_complete(round_no)


def mark_round_complete(layout: RunLayout, round_no: int, stats: dict) -> None:
    write_text_atomic(layout.round_success(round_no), json.dumps(stats, indent=2))


def _next_pool_rows(inp: pa.Table, out: pa.Table) -> pa.Table:
    if inp.num_rows != out.num_rows or inp.column("id").to_pylist() != out.column("parent_id").to_pylist():
        raise ValueError("part does not line up with its input batch (rows out of order or missing)")
    accepted = pc.equal(out.column("status"), "accepted")
    cols = {}
    for name in POOL_SCHEMA.names:
        cols[name] = pc.if_else(accepted, out.column(name).cast(POOL_SCHEMA.field(name).type),
                                        inp.column(name))
    return pa.table(cols, schema=POOL_SCHEMA)


def build_next_pool(layout: RunLayout, round_no: int, dest: AnyPath, batch_size: int) -> int:
    """Stream round `round_no`'s input and parts into `dest` (the next round's pool)."""
    src = layout.round_input(round_no)
    n = 0
    buffer: list[pa.Table] = []
    buffered = 0
    with parquet_writer(dest, POOL_SCHEMA, compression="zstd") as writer:
        for i in range(num_row_groups(src)):
            rows = _next_pool_rows(read_row_group(src, i), read_part(layout.part(round_no, i)))
            buffer.append(rows)
            buffered += rows.num_rows
            n += rows.num_rows
            while buffered >= batch_size:
                merged = pa.concat_tables(buffer)
                writer.write_table(merged.slice(0, batch_size), row_group_size=batch_size)
                rest = merged.slice(batch_size)
                buffer, buffered = ([rest] if rest.num_rows else []), rest.num_rows
        if buffered:
            writer.write_table(pa.concat_tables(buffer), row_group_size=batch_size)
    return n


def round_parts(layout: RunLayout, round_no: int) -> list[AnyPath]:
    return list_files(layout.parts_dir(round_no), "batch_*.parquet")


def round_lineage(layout: RunLayout, round_no: int) -> pl.LazyFrame:
    return scan_parquet(round_parts(layout, round_no))


def round_table(layout: RunLayout, round_no: int) -> dict:
    """Counts of one round: by status, by elimination rule and survival by operation."""
    df = round_lineage(layout, round_no).select("status", "operation", "direction", "elimination_rule",
                                                 "prompt_tokens", "completion_tokens", "calls").collect()
    total = df.height
    accepted = df.filter(pl.col("status") == "accepted").height
    by_op = (
        df.group_by("operation", "direction")
        .agg(pl.len().alias("attempts"), (pl.col("status") == "accepted").sum().alias("accepted"))
        .with_columns((pl.col("accepted") / pl.col("attempts")).round(3).alias("survival"))
        .sort("operation")
    )
    by_rule = (
        df.filter(pl.col("status") == "eliminated").group_by("elimination_rule").agg(pl.len().alias("count"))
        .sort("elimination_rule")
    )
    return {
        "round": round_no,
        "attempts": total,
        "accepted": accepted,
        "eliminated": df.filter(pl.col("status") == "eliminated").height,
        "errors": df.filter(pl.col("status") == "error").height,
        "survival": round(accepted / total, 4) if total else 0.0,
        "calls": int(df["calls"].sum() or 0),
        "prompt_tokens": int(df["prompt_tokens"].sum() or 0),
        "completion_tokens": int(df["completion_tokens"].sum() or 0),
        "by_operation": by_op.to_dicts(),
        "by_rule": {r["elimination_rule"]: r["count"] for r in by_rule.to_dicts()},
    }


def write_final_datasets(layout: RunLayout, rounds: list[int], batch_size: int) -> dict:
    """evolved.parquet (seeds + accepted), lineage.parquet (every attempt), final_pool.parquet."""

    first_input = layout.round_input(rounds[0]) if rounds else None
    counts = {"lineage": 0, "evolved": 0}
    with parquet_writer(layout.lineage, LINEAGE_SCHEMA, compression="zstd") as lw, \
            parquet_writer(layout.evolved, LINEAGE_SCHEMA, compression="zstd") as ew:
        if first_input is not None:
            for i in range(num_row_groups(first_input)):
                seeds = read_row_group(first_input, i)
                n = seeds.num_rows
                null = pa.nulls(n, pa.string())
                seed_rows = pa.table({
                    "id": seeds["id"], "parent_id": null, "seed_id": seeds["seed_id"],
                    "round": pa.array([rounds[0] - 1] * n, pa.int32()), "operation": pa.array(["seed"] * n),
                    "direction": pa.array(["seed"] * n), "model": null, "status": pa.array(["seed"] * n),
                    "elimination_rule": null, "instruction": seeds["instruction"], "answer": null,
                    "judge_verdict": null, "domain": seeds["domain"], "generation": seeds["generation"],
                    "error": null, "calls": pa.array([0] * n, pa.int32()),
                    "prompt_tokens": pa.array([0] * n, pa.int64()), "completion_tokens": pa.array([0] * n, pa.int64()),
                    "duplicate_of": null, "dedup_similarity": pa.nulls(n, pa.float64()),
                }, schema=LINEAGE_SCHEMA)
                ew.write_table(seed_rows)
                counts["evolved"] += n
        for r in rounds:
            for i in range(batch_count(layout, r)):
                t = read_part(layout.part(r, i)).cast(LINEAGE_SCHEMA)
                lw.write_table(t)
                counts["lineage"] += t.num_rows
                acc = t.filter(pc.equal(t.column("status"), "accepted"))
                if acc.num_rows:
                    ew.write_table(acc)
                    counts["evolved"] += acc.num_rows
    if rounds:
        counts["final_pool"] = build_next_pool(layout, rounds[-1], layout.final_pool, batch_size)
    return counts


SFT_SCHEMA = pa.schema([
    ("id", pa.string()), ("seed_id", pa.string()), ("round", pa.int64()), ("domain", pa.string()),
    ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
])


def write_sft_view(evolved: AnyPath, dest: AnyPath) -> int:
    """The evolved dataset as TRL SFTTrainer conversations: one row per record with an answer, `messages` =
    [user: instruction, assistant: answer] (seeds without an answer are left out). Returns the row count."""
    t = read_parquet(evolved, columns=["id", "seed_id", "round", "domain", "instruction", "answer"])
    t = t.filter(pc.and_(pc.is_valid(t["answer"]), pc.not_equal(pc.utf8_length(pc.utf8_trim_whitespace(
        pc.fill_null(t["answer"], ""))), 0)))
    rows = t.to_pylist()
    out = pa.Table.from_pylist(
        [{"id": r["id"], "seed_id": r["seed_id"], "round": r["round"], "domain": r["domain"],
          "messages": [{"role": "user", "content": r["instruction"]}, {"role": "assistant", "content": r["answer"]}]}
         for r in rows], schema=SFT_SCHEMA)
    write_table_atomic(out, dest)
    return out.num_rows


def compact_ledger(layout: RunLayout, ledger: pl.DataFrame) -> AnyPath:
    write_table_atomic(ledger.to_arrow(), layout.ledger_parquet)
    return layout.ledger_parquet


def reopen_failed_batches(layout: RunLayout, stamp: str) -> dict:
    """Make a finished or failed run redo only its failed work on the next run over the folder.

    Batches whose part holds records with status `error` are moved aside (kept as
    `batch_NNNNN.parquet.retry-STAMP`, their journals kept so the calls that did
    succeed are replayed, not re-sent); missing parts are redone anyway. The
    round's dedup step is redone over all of its accepted records: its decisions
    are taken back out of the kept parts and `dedup.parquet` is moved aside
    (`dedup.parquet.retry-STAMP`). Every later round depends on this round's
    output, so later rounds are moved aside whole (`round_NN.superseded-STAMP`),
    as are the final datasets. The dedup index is not touched here (storage
    knows no index): a retry (the evolve flow's `retry`, `evolforge retry`) rolls
    it back with tasks/evolve/dedup_round.py `rollback_run`, and the redone dedup
    step does it again in any case. Returns what was reopened.
    """
    rounds_root = layout.rounds_dir
    reopened: dict = {"batches": [], "superseded_rounds": []}
    first_round = None
    for rdir in list_files(rounds_root, "round_[0-9][0-9]"):
        r = int(rdir.name.split("_")[1])
        if not exists(layout.round_input(r)):
            continue
        n = batch_count(layout, r)
        bad = []
        for b in range(n):
            part = layout.part(r, b)
            if not exists(part):
                bad.append(b)
                continue
            status = read_parquet(part, columns=["status"]).column("status").to_pylist()
            if "error" in status:
                replace(part, part.with_name(f"{part.name}.retry-{stamp}"))
                bad.append(b)
        if bad:
            first_round = r
            reopened["round"] = r
            reopened["batches"] = bad
            unlink(layout.round_success(r))
            decisions = layout.round_dedup(r)
            if exists(decisions):  # taken out of the parts first: a kill in between leaves them to redo
                reopened["dedup_reverted"] = revert_dedup_decisions(layout, r)
                replace(decisions, decisions.with_name(f"{decisions.name}.retry-{stamp}"))
            break
    if first_round is None:
        return reopened
    for rdir in list_files(rounds_root, "round_[0-9][0-9]"):
        if int(rdir.name.split("_")[1]) > first_round:
            dest = rdir.with_name(f"{rdir.name}.superseded-{stamp}")
            replace(rdir, dest)
            reopened["superseded_rounds"].append(rdir.name)
    for f in (layout.evolved, layout.lineage, layout.final_pool, layout.summary):
        if exists(f):
            replace(f, f.with_name(f"{f.name}.superseded-{stamp}"))
    return reopened


DEDUP_SCHEMA = pa.schema([("id", pa.string()), ("duplicate_of", pa.string()), ("method", pa.string()),
                          ("similarity", pa.float64()), ("matched_id", pa.string()),
                          ("matched_similarity", pa.float64())])


def accepted_records(layout: RunLayout, round_no: int) -> tuple[list[str], list[str]]:
    """(ids, instructions) of the round's accepted evolutions, in batch order."""
    df = round_lineage(layout, round_no).filter(pl.col("status") == "accepted").select("id", "instruction").collect()
    return df["id"].to_list(), df["instruction"].to_list()


def write_dedup_decisions(layout: RunLayout, round_no: int, dropped: list[dict], stats: dict) -> AnyPath:
    rows = [{k: d.get(k) for k in DEDUP_SCHEMA.names} for d in dropped]
    table = pa.Table.from_pylist(rows, schema=DEDUP_SCHEMA)
    table = table.replace_schema_metadata({b"evolforge.dedup_stats": json.dumps(stats, default=str).encode()})
    return write_table_atomic(table, layout.round_dedup(round_no))


def revert_dedup_decisions(layout: RunLayout, round_no: int) -> int:
    """Undo `apply_dedup_decisions` in the round's existing parts (idempotent): a row it marked as a
    duplicate is `accepted` again, without rule, duplicate_of or similarity. Returns the rows restored."""
    decisions = read_part(layout.round_dedup(round_no)).to_pylist()
    rule = {d["id"]: f"duplicate_{d['method']}" for d in decisions}
    restored = 0
    for path in round_parts(layout, round_no):
        table = read_part(path)
        rows = table.to_pylist()
        changed = 0
        for row in rows:
            if row["status"] == "eliminated" and rule.get(row["id"]) == row["elimination_rule"]:
                row.update(status="accepted", elimination_rule=None, duplicate_of=None, dedup_similarity=None)
                changed += 1
        if changed:
            write_table_atomic(pa.Table.from_pylist(rows, schema=table.schema.remove_metadata()), path)
            restored += changed
    return restored


def apply_dedup_decisions(layout: RunLayout, round_no: int) -> dict:
    """Mark the round's dropped duplicates in its parts (idempotent): status eliminated, rule duplicate_METHOD."""
    decisions = read_part(layout.round_dedup(round_no)).to_pylist()
    by_id = {d["id"]: d for d in decisions}
    counts: dict[str, int] = {}
    for d in decisions:
        counts[d["method"]] = counts.get(d["method"], 0) + 1
    if not by_id:
        return counts
    for b in range(batch_count(layout, round_no)):
        path = layout.part(round_no, b)
        table = read_part(path)
        rows = table.to_pylist()
        changed = False
        for row in rows:
            d = by_id.get(row["id"])
            if d and row["status"] != "eliminated":
                row.update(status="eliminated", elimination_rule=f"duplicate_{d['method']}",
                           duplicate_of=d["duplicate_of"], dedup_similarity=d["similarity"])
                changed = True
        if changed:
            write_table_atomic(pa.Table.from_pylist(rows, schema=table.schema.remove_metadata()), path)
    return counts
