"""Files of the PPO stage: where they live and how they are written.

    PPO_OUT/
      data/train.parquet            verl prompt data (also loadable by datasets / TRL GRPOTrainer)
      data/test.parquet             held-out prompts (split by seed lineage)
      verl/ppo_config.yaml          the verl configuration as a nested document (what the overrides set; every
                                    string escaped so that OmegaConf reads it verbatim: no `${...}` resolves)
      verl/overrides.txt            one Hydra override per line (the command's arguments)
      verl/submit.sh                the exact `ray job submit ... -- python3 -m verl.trainer.main_ppo ...` command
      verl/submission.json          address, submission id and output of a submitted job
      verl/checkpoints/             verl's checkpoints (trainer.default_local_dir, every ppo.save_freq steps and the
                                    last): global_step_N/actor/huggingface is the trained policy for `evolforge eval`
      local/base_policy/            the base policy as a transformers folder (converted from the GGUF; used when no
                                    SFT policy is given: `--sft`)
      local/policy/                 the policy after the local GRPO steps
      local/metrics.jsonl           one line per logged GRPO step: reward, kl, loss, step seconds, ...
      local/comparison.json         initial (SFT or base) vs trained mean reward on the held-out prompts
      local/health.json             reward health during the GRPO steps (share of rA < 0.5, reward drift)
      local/run.json                the GRPO smoke run's result (what the flow reports), also when run as a Ray job
      local/grpo_job.json           the smoke run's settings and paths, read by the Ray job that runs it
      ray_job.log                   the submitted Ray job's log, fetched when the flow waited for the job
      decontamination.json          n-gram overlap of the training prompts with the evaluation sets, per table
      data/README.md                the dataset card of data/ (config `prompts`: train, test; storage/cards.py)
      plots/*.png                   grpo_training, held_out_reward (when the GRPO smoke run ran here)
      summary.json                  what the run did, with paths and figures
      stage.json, ledger/, logs/    the stage marker (kind "ppo") and the run-level folders (storage/folder.py)

PPOLayout is the stage's folder (a StageFolder); PPO_OUT must be a local (or shared, mounted) folder, as verl
and the trainers write there.

The reward-model stage's folder holds `health.json` ({"data": report, "model": report}, see
storage/reward_sets.py) next to its model folders; `read_health` reads it for the PPO pre-flight.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import yaml

from evolforge.storage.folder import StageFolder
from evolforge.storage.fs import ensure_dir, exists, read_text, write_text_atomic
from evolforge.storage.parts import write_table_atomic
from evolforge.storage.reward_sets import RewardLayout

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
LINEAGE = pa.struct([("id", pa.string()), ("parent_id", pa.string()), ("seed_id", pa.string()),
                     ("round", pa.int32()), ("operation", pa.string()), ("direction", pa.string()),
                     # the RLEIF IRM filter (reward.select_by_irm; null when off or for a synthesis task)
                     ("irm_score", pa.float64()), ("irm_rank", pa.int32()), ("irm_selected", pa.bool_())])
VERL_SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(MESSAGE)),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64()), ("question", pa.string()),
                              ("answer", pa.string()), ("domain", pa.string()),
                              ("ground_truth_source", pa.string()), ("lineage", LINEAGE)])),
])


@dataclass(frozen=True, init=False)
class PPOLayout(StageFolder):
    """The PPO stage's folder (see the module docstring). PPO_OUT is a local folder: verl reads its data files
    and the trainers write policies there."""

    def __init__(self, root: str | Path):
        from evolforge.storage.fs import is_url

        if is_url(root):
            raise ValueError(f"the PPO output folder must be a local (or shared, mounted) folder, not {root}: "
                             "verl and the local trainer write policies and data files there. Its inputs "
                             "(evolved, reward_dir) may be URLs.")
        super().__init__(root)

    def ensure(self) -> "PPOLayout":
        super().ensure()
        for d in (self.data_dir, self.verl_dir, self.local_dir):
            ensure_dir(d)
        return self

    @property
    def card_dir(self) -> Path:
        """The dataset card (README.md) describes the prompt data: data/."""
        return self.data_dir

    data_dir = property(lambda self: self.root / "data")
    train = property(lambda self: self.data_dir / "train.parquet")
    test = property(lambda self: self.data_dir / "test.parquet")
    verl_dir = property(lambda self: self.root / "verl")
    verl_config = property(lambda self: self.verl_dir / "ppo_config.yaml")
    verl_overrides = property(lambda self: self.verl_dir / "overrides.txt")
    submit_script = property(lambda self: self.verl_dir / "submit.sh")
    submission = property(lambda self: self.verl_dir / "submission.json")
    verl_checkpoints = property(lambda self: self.verl_dir / "checkpoints")  # trainer.default_local_dir
    local_dir = property(lambda self: self.root / "local")
    base_policy = property(lambda self: self.local_dir / "base_policy")
    policy = property(lambda self: self.local_dir / "policy")
    metrics = property(lambda self: self.local_dir / "metrics.jsonl")
    comparison = property(lambda self: self.local_dir / "comparison.json")
    local_health = property(lambda self: self.local_dir / "health.json")
    local_run = property(lambda self: self.local_dir / "run.json")
    grpo_job_spec = property(lambda self: self.local_dir / "grpo_job.json")
    ray_job_log = property(lambda self: self.root / "ray_job.log")
    decontamination = property(lambda self: self.root / "decontamination.json")


def write_prompt_parquet(rows: list[dict], path: Path) -> Path:
    """verl rows -> an atomic parquet file with the fixed VERL_SCHEMA (nested lists and structs)."""
    return write_table_atomic(pa.Table.from_pylist(rows, schema=VERL_SCHEMA), path)


def read_prompt_rows(path: Path, limit: int | None = None) -> list[dict]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return table.slice(0, limit).to_pylist() if limit is not None else table.to_pylist()


def write_json(path: Path, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def write_yaml(path: Path, data: Any, header: str = "") -> Path:
    return write_text_atomic(path, header + yaml.safe_dump(data, sort_keys=False))


def write_lines(path: Path, lines: Iterable[str]) -> Path:
    return write_text_atomic(path, "".join(f"{line}\n" for line in lines))


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    return write_text_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


class UnreadableHealth(ValueError):
    """The reward stage's health.json exists but cannot be read or parsed; the message names the file."""


def read_health(reward_dir: str | Path) -> dict | None:
    """The reward stage's health.json (local folder or URL) as written, {"data": report, "model": report}
    (either report may be null), or None when it is missing. UnreadableHealth when it cannot be read or parsed."""
    path = RewardLayout(reward_dir).health
    if not exists(path):
        return None
    try:
        return json.loads(read_text(path))
    except (OSError, json.JSONDecodeError) as e:
        raise UnreadableHealth(f"unreadable {path}: {e}") from e


def read_tasks(path: str | Path) -> list[dict]:
    """The kept tasks of a synthesis run (its tasks.parquet or output folder) whose verified answers or tests
    become PPO ground truth (storage/synthesis_sets.py `read_kept_tasks`)."""
    from evolforge.storage.synthesis_sets import read_kept_tasks

    return read_kept_tasks(path)


def read_evolved(path: Path) -> list[dict]:
    """An evolve run's dataset/evolved.parquet (or any parquet with id, seed_id, instruction) as rows."""
    from evolforge.storage.fs import exists, location, read_parquet

    path = location(path)
    if not exists(path):
        raise FileNotFoundError(f"evolved dataset not found: {path} (run the evolve flow first, or pass its "
                                "OUT/dataset/evolved.parquet)")
    return read_parquet(path).to_pylist()
