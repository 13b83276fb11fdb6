"""Trajectory exports on disk: where every file lives, the schemas, readers and writers.

    OUT/                              a trajectories output folder (`evolforge trajectories --out OUT`)
      sft.jsonl                       one conversation per line, TRL SFTTrainer's conversational form
      data/train-00000-of-00001.parquet
                                      the transitions table (config `transitions`, what load_dataset("parquet",
                                      data_dir=OUT) loads, storage/cards.py): one row per model call (GRPO /
                                      RLOO): prompt, completion, reward (`transitions.parquet` before)
      tokens.parquet                  token-level samples: input_ids, assistant loss mask, turns, drift
      duplicates.parquet              conversations (or completions-route calls) dropped as duplicate prompts
      skipped.parquet                 unfinished sessions, failed calls, sessions without a usable call
      summary.json                    counts: sessions, rewards, failed calls, duplicates, drift rate
      README.md, plots/*.png          the dataset card and the plots (tasks/trajectories/report.py)
      stage.json                      the stage marker: kind "trajectories" and, once finished, its counts
                                      (storage/folder.py)
      work/                           the steps' intermediate files (removed when the export completes)

Formats, field by field:
- sft.jsonl: `messages` list of {role, content} in the OpenAI form: an assistant turn that called tools is
  {"role": "assistant", "content": str ("" when it only called tools), "tool_calls": [{"id", "type":
  "function", "function": {"name", "arguments": JSON string}}]}, a tool result {"role": "tool",
  "tool_call_id", "content"}; `reasoning_content` when the model returned some (reasoning items of the
  Responses API, thinking blocks of the Messages API too). A content with images is a list of TRL multimodal
  parts: [{"type": "text", "text"}, {"type": "image", "image": URL or data URL}]. `tools`: the JSON tool
  schemas of the conversation's last call as one JSON string (TRL's SFTTrainer json.loads a string `tools`
  column; a JSON string keeps every schema exact, where arrow would merge different schemas into one struct)
  or null. Beside them: conversation_id ("SESSION#N"), session, parent_session, root_session, agent_role,
  model, reward (null: none), reward_source (event | file | null), calls, finished_by, started_at, ended_at.
- transitions (TRANSITION_SCHEMA): `prompt` / `completion` are message lists (MESSAGE_TYPE; the
  completion holds the one assistant message), TRL's conversational prompt-completion form (a message's
  `content` is its text there, `images` the URLs or data URLs of its images, null when none); completions-route
  calls have `prompt_text` / `completion_text` instead. reward is the session's (null when none).
- tokens.parquet (TOKEN_SCHEMA): `input_ids`, `assistant_mask` (1 on assistant tokens only, 0 elsewhere),
  `turns` (per message: start, end, loss_start for assistant turns, source template | upstream),
  `drift` and `drift_reasons` (the upstream's own token ids differ from the re-tokenised text).

Grouping records by session (`RecordSpool`): one pass over the proxy's record logs writes every record into
a SQLite file in a local temporary folder (indexed by session and time); the export then reads one session's
records at a time. Memory holds one session's records (plus one small metadata row per session), whatever
the size of the proxy folder, and the spool works the same for local and object-store proxy folders.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa

from evolforge.storage.cards import main_table
from evolforge.storage.folder import StageFolder
from evolforge.storage.fs import (
    AnyPath,
    atomic_dir,
    atomic_output,
    ensure_dir,
    exists,
    is_remote,
    location,
    parquet_writer,
    read_bytes,
    read_parquet,
    scratch_dir,
    unlink,
)
from evolforge.storage.proxy_sets import ProxyLayout, iter_records


class TrajectoryLayout(StageFolder):
    """A trajectories export folder (local or URL); see the module docstring. Its run-level files (summary.json,
    README.md, plots/, stage.json) are those of every StageFolder (storage/folder.py); it has no batched table
    (its steps are whole-folder passes), and no ledger/ or logs/: the stage calls no model."""

    sft = property(lambda self: self.root / "sft.jsonl")
    transitions = property(lambda self: main_table(self.root))
    tokens = property(lambda self: self.root / "tokens.parquet")
    duplicates = property(lambda self: self.root / "duplicates.parquet")
    skipped = property(lambda self: self.root / "skipped.parquet")
    work_dir = property(lambda self: self.root / "work")
    work_conversations = property(lambda self: self.work_dir / "conversations.jsonl")
    work_transitions = property(lambda self: self.work_dir / "transitions.jsonl")
    work_skipped = property(lambda self: self.work_dir / "skipped.jsonl")
    work_collect = property(lambda self: self.work_dir / "collect.json")
    work_dedup = property(lambda self: self.work_dir / "dedup.json")
    work_tokens = property(lambda self: self.work_dir / "tokens.json")

    def remove_work(self) -> None:
        for p in (self.work_conversations, self.work_transitions, self.work_skipped, self.work_collect,
                  self.work_dedup, self.work_tokens):
            unlink(p)
        if not is_remote(self.work_dir):
            with contextlib.suppress(OSError):
                Path(self.work_dir).rmdir()

    def remove_tokens(self) -> None:
        """An export without token samples leaves no stale tokens.parquet of an earlier export behind."""
        unlink(self.tokens)

    def ensure(self) -> TrajectoryLayout:
        """Create the folder only: an export calls no model, so it writes no ledger/ and starts no local server."""
        ensure_dir(self.root)
        return self


# ---------------------------------------------------------------- schemas
TOOL_CALL_TYPE = pa.struct([("id", pa.string()), ("type", pa.string()),
                            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string()),
                          ("tool_calls", pa.list_(TOOL_CALL_TYPE)), ("tool_call_id", pa.string()),
                          ("name", pa.string()), ("images", pa.list_(pa.string()))])

TRANSITION_SCHEMA = pa.schema([
    ("transition_id", pa.string()), ("session", pa.string()), ("parent_session", pa.string()),
    ("root_session", pa.string()), ("conversation_id", pa.string()), ("call_index", pa.int32()),
    ("turn_index", pa.int32()), ("record_id", pa.string()), ("ts", pa.float64()), ("route", pa.string()),
    ("agent_role", pa.string()), ("model", pa.string()),
    ("prompt", pa.list_(MESSAGE_TYPE)), ("completion", pa.list_(MESSAGE_TYPE)),
    ("prompt_text", pa.string()), ("completion_text", pa.string()), ("tools", pa.string()),
    ("finish_reason", pa.string()), ("reward", pa.float64()), ("reward_source", pa.string()),
    ("reward_details", pa.string()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
    ("latency_s", pa.float64()), ("prompt_token_ids", pa.list_(pa.int64())),
    ("completion_token_ids", pa.list_(pa.int64())), ("completion_logprobs", pa.list_(pa.float64())),
    ("last_in_conversation", pa.bool_()),
])

TURN_TYPE = pa.struct([("message_index", pa.int32()), ("role", pa.string()), ("start", pa.int32()),
                       ("end", pa.int32()), ("loss_start", pa.int32()), ("source", pa.string())])

TOKEN_SCHEMA = pa.schema([
    ("conversation_id", pa.string()), ("session", pa.string()), ("parent_session", pa.string()),
    ("root_session", pa.string()), ("input_ids", pa.list_(pa.int32())), ("assistant_mask", pa.list_(pa.int8())),
    ("num_tokens", pa.int32()), ("assistant_tokens", pa.int32()), ("turns", pa.list_(TURN_TYPE)),
    ("drift", pa.bool_()), ("drift_reasons", pa.list_(pa.string())), ("upstream_ids_turns", pa.int32()),
    ("warnings", pa.list_(pa.string())), ("rendering", pa.string()), ("tokenizer", pa.string()),
    ("reward", pa.float64()), ("reward_source", pa.string()),
])

DUPLICATE_SCHEMA = pa.schema([
    ("id", pa.string()), ("kind", pa.string()), ("session", pa.string()), ("prompt", pa.string()),
    ("duplicate_of", pa.string()), ("duplicate_of_session", pa.string()), ("method", pa.string()),
    ("similarity", pa.float64()), ("matched_id", pa.string()), ("matched_similarity", pa.float64()),
    ("reason", pa.string()),
])

SKIPPED_SCHEMA = pa.schema([
    ("kind", pa.string()), ("session", pa.string()), ("record_id", pa.string()), ("call_index", pa.int32()),
    ("reason", pa.string()), ("detail", pa.string()),
])


# ---------------------------------------------------------------- streamed writers and readers
@contextlib.contextmanager
def jsonl_writer(path: AnyPath) -> Iterator:
    """`write(row)` appends one JSON line; the file appears whole at `path` when the block ends, or not at all."""
    with atomic_output(path, "w") as fh:
        yield lambda row: fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")


def iter_jsonl(path: AnyPath) -> Iterator[dict]:
    """The rows of a JSON-lines file, one at a time (nothing when it does not exist)."""
    if not exists(path):
        return
    opener = location(path).open("rb") if is_remote(path) else open(path, "rb")
    with opener as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


class TableStream:
    """Rows written in batches to one parquet file that appears whole when the stream closes."""

    def __init__(self, writer, schema: pa.Schema, batch_rows: int):
        self.writer, self.schema, self.batch_rows = writer, schema, batch_rows
        self.rows: list[dict] = []
        self.count = 0

    def write(self, row: dict) -> None:
        self.rows.append(row)
        if len(self.rows) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
            self.count += len(self.rows)
            self.rows = []


@contextlib.contextmanager
def table_stream(path: AnyPath, schema: pa.Schema, batch_rows: int = 512) -> Iterator[TableStream]:
    with parquet_writer(path, schema, compression="zstd") as writer:
        stream = TableStream(writer, schema, batch_rows)
        yield stream
        stream.flush()


def read_rewards(path: AnyPath) -> dict[str, float]:
    """Session rewards from a jsonl / csv / parquet file with `session` and `reward` columns.

    A null reward counts as none; a session listed twice, a missing column or a reward that is not a
    number is an error naming the file."""
    import polars as pl

    path = location(path)
    suffix = path.name.rsplit(".", 1)[-1].lower()
    data = io.BytesIO(read_bytes(path))
    try:
        if suffix in ("jsonl", "ndjson", "json"):
            df = pl.read_ndjson(data)
        elif suffix == "csv":
            df = pl.read_csv(data, schema_overrides={"session": pl.Utf8})
        elif suffix == "parquet":
            df = pl.read_parquet(data)
        else:
            raise ValueError(f"rewards file {path}: unknown format .{suffix} (jsonl, csv or parquet)")
    except pl.exceptions.PolarsError as e:
        raise ValueError(f"rewards file {path} cannot be read: {e}") from None
    missing = {"session", "reward"} - set(df.columns)
    if missing:
        raise ValueError(f"rewards file {path} lacks the column(s) {sorted(missing)} (needs session and reward)")
    try:
        df = df.select(pl.col("session").cast(pl.Utf8), pl.col("reward").cast(pl.Float64, strict=True))
    except pl.exceptions.PolarsError:
        raise ValueError(f"rewards file {path}: the reward column must hold numbers") from None
    df = df.filter(pl.col("reward").is_not_null() & pl.col("session").is_not_null())
    dup = df.filter(pl.col("session").is_duplicated())["session"].unique().to_list()
    if dup:
        raise ValueError(f"rewards file {path} gives {len(dup)} session(s) more than one reward, e.g. {dup[:3]}")
    return dict(zip(df["session"].to_list(), df["reward"].to_list()))


# ---------------------------------------------------------------- grouping records by session
@dataclass(frozen=True)
class SpooledSession:
    session: str
    parent_session: str | None
    first_ts: float
    last_ts: float        # start of the session's last call
    end_ts: float         # end of the session's last call (start + latency)
    records: int


class RecordSpool:
    """Proxy records grouped by session on local disk: a SQLite file in a temporary folder (see the module
    docstring). `add` every record once, then read `sessions()` and `records_of(session)`."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="evolforge-spool-"))
        self.db = sqlite3.connect(self.dir / "records.sqlite")
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("CREATE TABLE records (seq INTEGER PRIMARY KEY, session TEXT NOT NULL, ts REAL NOT NULL,"
                        " end_ts REAL NOT NULL, parent TEXT, line TEXT NOT NULL)")
        self.count = 0

    def add(self, records: Iterable[dict], chunk: int = 2000) -> int:
        rows = []
        for rec in records:
            ts = float(rec.get("ts") or 0.0)
            rows.append((str(rec.get("session") or "default"), ts, ts + float(rec.get("latency_s") or 0.0),
                         rec.get("parent_session"), json.dumps(rec, ensure_ascii=False, default=str)))
            if len(rows) >= chunk:
                self._insert(rows)
                rows = []
        if rows:
            self._insert(rows)
        self.db.execute("CREATE INDEX IF NOT EXISTS by_session ON records (session, ts, seq)")
        return self.count

    def _insert(self, rows: list[tuple]) -> None:
        with self.db:
            self.db.executemany("INSERT INTO records (session, ts, end_ts, parent, line) VALUES (?, ?, ?, ?, ?)", rows)
        self.count += len(rows)

    def sessions(self) -> list[SpooledSession]:
        """Every session, in order of its first call."""
        cur = self.db.execute("SELECT session, MAX(parent), MIN(ts), MAX(ts), MAX(end_ts), COUNT(*) FROM records "
                              "GROUP BY session ORDER BY MIN(ts), session")
        return [SpooledSession(*row) for row in cur]

    def records_of(self, session: str) -> list[dict]:
        """One session's records, in the order their calls started."""
        cur = self.db.execute("SELECT line FROM records WHERE session = ? ORDER BY ts, seq", (session,))
        return [json.loads(line) for (line,) in cur]

    def close(self) -> None:
        self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "RecordSpool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def recorded_roles(proxy_out: AnyPath, stop_when: set[str] | None = None) -> set[str]:
    """The agent roles the proxy's records carry (a record's `role`: X-Evolforge-Role / X-OpenForge-Role), read
    record by record; with `stop_when`, the reading stops as soon as every role in it has been seen."""
    seen: set[str] = set()
    for rec in iter_records(ProxyLayout(proxy_out)):
        role = rec.get("role")
        if isinstance(role, str) and role:
            seen.add(role)
            if stop_when is not None and stop_when <= seen:
                break
    return seen


# ---------------------------------------------------------------- tokenizers converted from GGUF, cached
def tokenizer_cache(gguf: Path) -> Path:
    """A local folder for the transformers tokenizer converted from `gguf` (same file, size and time: same
    folder), so the slow GGUF conversion runs once per machine."""
    st = Path(gguf).stat()
    return scratch_dir("tokenizers", f"{Path(gguf).resolve()}:{st.st_size}:{int(st.st_mtime)}")


def cached_tokenizer_ready(folder: Path) -> bool:
    return (Path(folder) / "tokenizer_config.json").exists()


@contextlib.contextmanager
def filling_tokenizer_cache(folder: Path) -> Iterator[Path]:
    """A scratch folder that becomes the cache folder whole when the block succeeds."""
    with atomic_dir(Path(folder)) as tmp:
        yield tmp


def call_figures(lay: TrajectoryLayout) -> dict[str, list]:
    """What the trajectories plots draw, from the transitions table: model calls per session, prompt / completion
    tokens and latency per call, one reward per session (None: the session has none)."""
    if not exists(lay.transitions):
        return {"calls_per_session": [], "prompt_tokens": [], "completion_tokens": [], "latency_s": [],
                "session_rewards": []}
    t = read_parquet(lay.transitions, ["session", "prompt_tokens", "completion_tokens", "latency_s", "reward"])
    calls: dict[str, int] = {}
    rewards: dict[str, float | None] = {}
    for session, reward in zip(t.column("session").to_pylist(), t.column("reward").to_pylist()):
        calls[session] = calls.get(session, 0) + 1
        if rewards.get(session) is None:
            rewards[session] = reward
    return {"calls_per_session": list(calls.values()), "prompt_tokens": t.column("prompt_tokens").to_pylist(),
            "completion_tokens": t.column("completion_tokens").to_pylist(), "latency_s": t.column("latency_s").to_pylist(),
            "session_rewards": [rewards[s] for s in calls]}
