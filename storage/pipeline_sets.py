"""Files of a pipeline run: one output folder per stage under OUT/, and the run's own files.

    OUT/evolve/        the evolve stage's folder (storage/layout.py RunLayout)
    OUT/synthesize/    the synthesize stage's folder (storage/synthesis_sets.py)
    OUT/reward/        the reward-data and train-reward stages' one folder: the data, and the models beside it
                       (storage/reward_sets.py)
    OUT/sft/           the SFT stage's folder (storage/sft_sets.py; a local folder)
    OUT/ppo/           the PPO stage's folder (storage/ppo.py; a local folder)
    OUT/eval/          the eval stage's folder (storage/eval_sets.py)
    OUT/plots/*.png    tokens and cost of every stage (all stage folders' ledgers), then each stage's own plots
    OUT/summary.json   what each stage did, the stage folders, the cost of all of them
    OUT/stage.json     the marker (kind "pipeline"; storage/folder.py); each stage folder has its own

A stage's folder is OUT/<the stage's name>, except for the stages that share one (SHARED_FOLDERS). The pipeline
itself calls no model: its folder has no ledger of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolforge.storage.folder import StageFolder
from evolforge.storage.fs import AnyPath, ensure_dir

# stages that write into another stage's folder: train-reward trains beside the data reward-data made
SHARED_FOLDERS = {"reward-data": "reward", "train-reward": "reward"}


@dataclass(frozen=True, init=False)
class PipelineLayout(StageFolder):
    """A pipeline run's folder (see the module docstring): a local folder or an fsspec URL."""

    def stage(self, name: str) -> AnyPath:
        """The output folder of the stage `name` (its registered name) in this run."""
        return self.root / SHARED_FOLDERS.get(name, name)

    def ensure(self) -> "PipelineLayout":
        """Only OUT itself: each stage creates its own folder (and the pipeline keeps no ledger or logs)."""
        ensure_dir(self.root)
        return self
