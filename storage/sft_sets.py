"""Files of the SFT stage: where they live and how they are written.

    SFT_OUT/
      data/train.parquet        the rows trained on (SFT_SCHEMA: TRL's conversational prompt-completion form)
      data/skipped.parquet      rows left out, with the reason (not step form, held-out lineage, eval overlap, ...)
      data/rejection_samples.parquet  every rejection sample (sft.rejection_samples) with its verdict and reason
      data/README.md            the dataset card of data/ (config `train`; storage/cards.py)
      base_policy/              the base policy as a transformers folder (converted from the GGUF when no
                                sft.base_model is set)
      checkpoints/checkpoint-N/ the trainer's checkpoints (model, optimizer, scheduler, RNG state): a run over the
                                same folder resumes from the last one
      model/                    the fine-tuned policy, a transformers folder, with its model card (README.md) and
                                sft_meta.json (what it was trained from and on); written last, atomically
      adapter/                  the LoRA adapter (peft), when sft.lora
      train_log.jsonl           one line per logged step: step, epoch, loss, learning_rate, grad_norm
      decontamination.json      the n-gram overlap check per input table
      plots/*.png               sft_loss, sft_learning_rate
      summary.json, stage.json, ledger/, logs/   (storage/folder.py); the ledger holds one row for the training run

Format of data/train.parquet (SFT_SCHEMA), one row per training example:
    id, source (evolved | synthesis_code | rejection_sampled | trajectory), seed_id, domain,
    prompt      list of {role, content, tool_calls (JSON text or null), tool_call_id}: the conversation before the
                answer (an evolved row: the step-by-step answer prompt around the instruction; a trajectory row:
                every message of the recorded conversation before that assistant turn)
    completion  list of one such message: the assistant's answer the loss is computed on (a trajectory row: one
                assistant turn, its tool calls in the OpenAI form {id, type, function: {name, arguments}})
    tools       the JSON tool schemas the agent offered (a trajectory row), or null
A trajectory row's id is CONVERSATION_ID/I, I the turn's index in the conversation's messages.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa

from evolforge.storage.folder import StageFolder
from evolforge.storage.fs import atomic_dir, exists, read_parquet, write_text_atomic
from evolforge.storage.parts import write_table_atomic

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.string()),
                     ("tool_call_id", pa.string())])
SFT_SCHEMA = pa.schema([
    ("id", pa.string()), ("source", pa.string()), ("seed_id", pa.string()), ("domain", pa.string()),
    ("prompt", pa.list_(MESSAGE)), ("completion", pa.list_(MESSAGE)), ("tools", pa.string()),
])
SKIPPED_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string()), ("seed_id", pa.string()),
                            ("reason", pa.string()), ("text", pa.string())])
META_FILE = "sft_meta.json"


@dataclass(frozen=True, init=False)
class SFTFolder(StageFolder):
    """The SFT stage's folder (see the module docstring); a local folder (the trainer writes checkpoints there)."""

    def __init__(self, root: str | Path):
        from evolforge.storage.fs import is_url

        if is_url(root):
            raise ValueError(f"the SFT output folder must be a local (or mounted) folder, not {root}: the trainer "
                             "writes its checkpoints and the model there")
        super().__init__(root)

    def ensure(self) -> "SFTFolder":
        super().ensure()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def card_dir(self) -> Path:
        return self.data_dir

    data_dir = property(lambda self: self.root / "data")
    train = property(lambda self: self.data_dir / "train.parquet")
    skipped = property(lambda self: self.data_dir / "skipped.parquet")
    rejection_samples = property(lambda self: self.data_dir / "rejection_samples.parquet")
    base_policy = property(lambda self: self.root / "base_policy")
    checkpoints = property(lambda self: self.root / "checkpoints")
    model = property(lambda self: self.root / "model")
    adapter = property(lambda self: self.root / "adapter")
    train_log = property(lambda self: self.root / "train_log.jsonl")
    decontamination = property(lambda self: self.root / "decontamination.json")

    def last_checkpoint(self) -> Path | None:
        """The newest complete checkpoint folder (checkpoint-N with its trainer_state.json), or None."""
        found = [p for p in Path(self.checkpoints).glob("checkpoint-*")
                 if p.name.split("-")[-1].isdigit() and (p / "trainer_state.json").exists()]
        return max(found, key=lambda p: int(p.name.split("-")[-1])) if found else None

    def clear_checkpoints(self) -> None:
        """Remove every checkpoint (a retrain starts from the base model, not from the last run's steps)."""
        import shutil

        shutil.rmtree(self.checkpoints, ignore_errors=True)

    def model_ready(self) -> bool:
        return exists(self.model / META_FILE)

    def status_extra(self) -> dict:
        ckpt = self.last_checkpoint()
        return {"model": str(self.model) if self.model_ready() else None,
                "last_checkpoint": ckpt.name if ckpt else None}


def message(role: str, content: str | None, tool_calls: Any = None, tool_call_id: str | None = None) -> dict:
    """A message as SFT_SCHEMA stores it (tool calls as JSON text: their arguments vary in shape)."""
    return {"role": role, "content": content or "",
            "tool_calls": json.dumps(tool_calls, ensure_ascii=False) if tool_calls else None,
            "tool_call_id": tool_call_id}


def chat_messages(stored: list[dict]) -> list[dict]:
    """Stored messages -> the chat-template form (tool calls decoded, empty keys dropped)."""
    out = []
    for m in stored:
        msg = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            msg["tool_calls"] = json.loads(m["tool_calls"])
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def write_rows(rows: list[dict], path: Path) -> Path:
    return write_table_atomic(pa.Table.from_pylist(rows, schema=SFT_SCHEMA), path)


def write_skipped(rows: list[dict], path: Path) -> Path:
    return write_table_atomic(pa.Table.from_pylist(rows, schema=SKIPPED_SCHEMA), path)


REJECTION_SCHEMA = pa.schema([("task_id", pa.string()), ("seed_id", pa.string()), ("kind", pa.string()),
                              ("sample", pa.int32()), ("completion", pa.string()), ("verified", pa.bool_()),
                              ("reason", pa.string())])


def write_rejection_samples(rows: list[dict], path: Path) -> Path:
    return write_table_atomic(pa.Table.from_pylist(rows, schema=REJECTION_SCHEMA), path)


def read_rows(path: Path) -> list[dict]:
    """The rows of data/train.parquet (one written before the `tools` column reads with tools None)."""
    return [{"tools": None, **r} for r in read_parquet(path).to_pylist()]


def read_table_rows(path: str | Path, columns: list[str] | None = None) -> list[dict]:
    """Rows of any parquet table an input names (the evolve run's SFT view, the synthesis tasks)."""
    return read_parquet(path, columns=columns).to_pylist()


def read_jsonl(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def write_json(path: Path, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8")) if Path(path).exists() else None


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    return write_text_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def read_log(path: Path) -> list[dict]:
    return read_jsonl(path) if Path(path).exists() else []


def publish_model(staged: Path, dest: Path) -> Path:
    """Move a finished model folder into place atomically (a reader never sees half a model)."""
    import shutil

    with atomic_dir(dest) as tmp:
        for item in Path(staged).iterdir():
            shutil.move(str(item), str(Path(tmp) / item.name))
    return dest
