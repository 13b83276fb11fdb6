"""The pipeline flow chains the stages, each in OUT/<stage>/."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.cli.status import stage_status
from evolforge.flows.pipeline import PipelineParams, pipeline_flow
from evolforge.storage.folder import read_marker

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.mark.long("evolve and synthesis through the pipeline flow, measured at 10.2-10.6 s CPU")
def test_pipeline_evolve_then_synthesize(tmp_path, server):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps(r) for r in [
        {"id": "c1", "instruction": "Write a function that adds two numbers.", "domain": "code"},
        {"id": "m1", "instruction": "A shop sells 3 boxes of 4 apples each. How many apples?", "domain": "math"},
    ]) + "\n")
    # the scripted model is priced here: synthesis counts a task with unpriced calls as over its USD budget
    price = {"pricing": {"overrides": {"smollm2-135m-instruct": {"input_per_mtok": 0.1, "output_per_mtok": 0.2},
                                       "scripted": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}}}}
    done = pipeline_flow(PipelineParams(seeds=str(seeds), out=str(tmp_path / "p"), rounds=1, reward=False,
                                        base_url=server.base_url, validator="scripted", overrides=price))
    assert set(done) == {"evolve", "synthesize"}
    # --validator reaches the synthesis stage: its checks ran on the validator, and it says so
    assert done["synthesize"]["models"]["validator"] == "scripted" and "warning" not in done["synthesize"]
    assert (tmp_path / "p" / "evolve" / "dataset" / "evolved.parquet").exists()
    tasks = pl.read_parquet(tmp_path / "p" / "synthesize" / "data" / "train-00000-of-00001.parquet")  # tasks table
    # the synthesis stage read the evolve stage's output: seeds plus their accepted evolutions
    assert done["synthesize"]["proposed"] == done["evolve"]["evolved"] and tasks.height >= 1
    # the run's folder is marked as a pipeline's, its summary names each stage's folder and the cost of all of them
    marker = read_marker(tmp_path / "p")
    assert marker["kind"] == "pipeline" and marker["counts"] == {"stages": 2} and marker["finished_at"]
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["stages"] == {"evolve": str(tmp_path / "p" / "evolve"), "synthesize": str(tmp_path / "p" / "synthesize")}
    assert summary["synthesize"] == done["synthesize"] and summary["cost"]["attempts"] > 0
    assert not (tmp_path / "p" / "ledger").exists()  # the pipeline calls no model itself
    # `status` shows the pipeline and each stage under it, read from their markers
    st = stage_status(tmp_path / "p")
    assert st["kind"] == "pipeline" and st["finished"] is True
    assert sorted(s["kind"] for s in st["stages"]) == ["evolve", "synthesize"]


@pytest.mark.long("two trainings in one flow: real TRL SFT on the tiny policy, then its eval (~25 s CPU)")
def test_pipeline_through_sft_and_eval(tmp_path, server):
    """With --sft and --eval the pipeline fine-tunes the policy on what evolve and synthesis kept, then evaluates
    that policy (not the endpoint's model) on the held-out lineages' tasks."""
    from evolforge.testing.tiny_policy import build_tiny_policy

    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps({"id": f"m{i}", "domain": "math", "instruction":
                                           f"A shop sells {i + 2} boxes of 4 apples each. How many apples?"})
                               for i in range(6)) + "\n")
    tiny = build_tiny_policy(tmp_path / "tiny")
    over = {"pricing": {"overrides": {"smollm2-135m-instruct": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}}},
            "sft": {"base_model": str(tiny), "max_steps": 1, "batch_size": 2},
            "eval": {"benchmarks": ["own"], "limit": 2, "max_new_tokens": 8}}
    done = pipeline_flow(PipelineParams(seeds=str(seeds), out=str(tmp_path / "p"), rounds=1, reward=False,
                                        sft=True, eval=True, base_url=server.base_url, overrides=over))
    assert list(done) == ["evolve", "synthesize", "sft", "eval"]
    assert done["sft"]["training"]["steps"] == 1 and (tmp_path / "p" / "sft" / "model" / "config.json").exists()
    meta = json.loads((tmp_path / "p" / "eval" / "summary.json").read_text())
    assert meta["policy"] == str(tmp_path / "p" / "sft" / "model")  # the SFT policy, not the endpoint's model
    own = [r for r in done["eval"]["table"] if r["benchmark"] == "own"]
    assert own and all(r["problems"] >= 1 for r in own)  # held-out lineages' tasks were evaluated
    assert sorted(s["kind"] for s in stage_status(tmp_path / "p")["stages"]) == ["eval", "evolve", "sft", "synthesize"]

