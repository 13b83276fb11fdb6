"""Inputs of the evaluation tests: an evolve run and a synthesis tasks table whose held-out seed lineages hold
verified code tasks (add_numbers, the scripted server's solver answer) and math tasks (one answered 42, the scripted
server's default final answer, one answered 12)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from evolforge.storage.parts import write_table_atomic
from evolforge.storage.synthesis_sets import TASK_SCHEMA, SynthLayout
from evolforge.testing.ppo_models import write_evolved
from evolforge.testing.scripted_server import SYNTH_GOOD, SYNTH_TESTS


def write_eval_inputs(root: Path, n_seeds: int = 6) -> tuple[Path, Path]:
    """(evolve run folder, synthesis folder): every seed s0..s{n-1} has a code task and two math tasks."""
    write_evolved(root / "evolve" / "dataset" / "evolved.parquet", n_seeds=n_seeds)
    rows = []
    for i in range(n_seeds):
        base = dict.fromkeys(TASK_SCHEMA.names)
        rows.append({**base, "task_id": f"c{i}", "seed_id": f"s{i}", "kind": "code", "status": "kept",
                     "statement": f"Write add_numbers(a, b) returning the sum of two integers (task {i}).",
                     "entry_point": "add_numbers", "solution": SYNTH_GOOD, "tests": SYNTH_TESTS})
        rows.append({**base, "task_id": f"m{i}", "seed_id": f"s{i}", "kind": "math", "status": "kept",
                     "statement": f"Ann has 40 apples and gets 2 more (task {i}). How many?", "answer": "40+2"})
        rows.append({**base, "task_id": f"n{i}", "seed_id": f"s{i}", "kind": "math", "status": "kept",
                     "statement": f"Bob buys 3 boxes of 4 pears (task {i}). How many pears?", "answer": "3*4"})
    synth = SynthLayout(root / "synth")
    write_table_atomic(pa.Table.from_pylist(rows, schema=TASK_SCHEMA), synth.tasks)
    return root / "evolve", synth.root
