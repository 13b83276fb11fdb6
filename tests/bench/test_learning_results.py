"""bench/results/learning.json holds what the learning run promises, and BENCHMARKS.md's learning table is the one
generated from it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "bench" / "bench_learning.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_learning_json_keeps_every_problem_and_verdict():
    r = json.loads((ROOT / "bench" / "results" / "learning.json").read_text())
    assert {"problems", "results", "command", "seeds", "timings_s", "uptime", "scale"} <= set(r)
    evals = {p["id"]: p for p in r["problems"] if p["split"] == "eval"}
    train = [p for p in r["problems"] if p["split"] == "train"]
    assert all({"id", "template", "split", "numbers", "answer"} <= set(p) for p in r["problems"])
    assert set(r["results"]) == {"base", "sft", "rl"}
    for verdicts in r["results"].values():
        assert set(verdicts) == {i for i, p in evals.items() if p.get("verified", True)}
        assert all(isinstance(v, bool) for v in verdicts.values())
    held = set(r["held_out_families"])
    assert {p["template"] for p in evals.values()} <= held and not {p["template"] for p in train} & held
    keys = {(tuple(sorted(p["numbers"])), p["answer"]) for p in evals.values()}
    assert not [p for p in train if (tuple(sorted(p["numbers"])), p["answer"]) in keys]
    # the figures of the table are the verdicts' own
    for row in r["compare"]["rows"]:
        v = r["results"][row["policy"]]
        assert abs(row["pass@1"] - sum(v.values()) / len(v)) < 1e-4
    full = r["settings"]["eval_problems"] >= 300 and r["settings"]["samples"] >= 8
    assert r["scale"] == "full" or not full


def test_benchmarks_learning_table_is_generated_from_the_file():
    bench = _bench()
    text = (ROOT / "BENCHMARKS.md").read_text()
    block = text.split(bench.TABLE_START, 1)[1].split(bench.TABLE_END, 1)[0]
    result = json.loads((ROOT / "bench" / "results" / "learning.json").read_text())
    assert block.strip() == bench.table(result).strip()
