"""The synthesis validator (models.validator): repairs and the final check run on it and are charged to the ledger
stage `validate`; the summary and the card say which model proposed and which validated; a run whose proposer
validates its own tasks says so on one line; math tasks the solvers disagree with go back for repair."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.cli import main
from evolforge.config.sections.gateway import ModelMap
from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow
from evolforge.storage.cards import read_card
from evolforge.storage.ledger import read_ledger
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.synthesis import prompts as P
from evolforge.tasks.synthesis import synthesize as synth
from evolforge.testing.scripted_server import ScriptedServer
from evolforge.testing.settings import make_settings

PROPOSER, VALIDATOR = "smollm2-135m-instruct", "scripted"  # both listed by the scripted server's GET /models
PRICED = {"overrides": {PROPOSER: {"input_per_mtok": 0.1, "output_per_mtok": 0.2},
                        VALIDATOR: {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}}
MARKERS = {P.MARKER_PROPOSE_CODE: "propose", P.MARKER_PROPOSE_MATH: "propose", P.MARKER_REPAIR_CODE: "repair",
           P.MARKER_REPAIR_MATH: "repair", P.MARKER_SOLVE_CODE: "solve", P.MARKER_SOLVE_MATH: "solve"}


def _kind(body: dict) -> str:
    prompt = body["prompt"]
    return next(kind for marker, kind in MARKERS.items() if marker in prompt)


def _seeds(tmp_path, rows) -> str:
    path = tmp_path / "seeds.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_validator_falls_back_to_the_proposer_and_the_solver_to_the_validator():
    assert ModelMap().for_stage("validator") == ModelMap().default == ModelMap().for_stage("solver")
    m = ModelMap(synthesize="big")
    assert m.for_stage("validator") == "big" and m.for_stage("solver") == m.default  # as before the validator
    m = ModelMap(synthesize="big", validator="other")
    assert m.for_stage("validator") == "other" == m.for_stage("solver")
    assert ModelMap(validator="other", solver="third").for_stage("solver") == "third"
    same = make_settings("http://127.0.0.1:9/v1", models={"synthesize": "a", "validator": "a"})
    assert synth.roles(same)["same_model"] and synth.same_model_warning(same) == (
        "proposer and validator are the same model (a); set --validator")
    apart = make_settings("http://127.0.0.1:9/v1", models={"synthesize": "a", "validator": "b"})
    assert synth.roles(apart) == {"proposer": "a", "validator": "b", "solver": "b", "same_model": False}
    assert synth.same_model_warning(apart) is None
    # the stage's --validator flag (and the pipeline's) sets models.validator
    assert SynthesizeParams(seeds="s.jsonl", validator="b").settings().models.validator == "b"
    from evolforge.tasks.pipeline.stage import PipelineParams

    assert PipelineParams(validator="b").settings().models.validator == "b"


@pytest.mark.usefixtures("prefect_harness")
def test_a_separate_validator_repairs_and_checks_and_is_charged_as_validate(tmp_path, server):
    seeds = _seeds(tmp_path, [
        {"id": "buggy", "instruction": "BUGGY: write an adder function.", "domain": "code"},
        {"id": "wrong", "instruction": "WRONGANSWER: 3 boxes with 4 pears each, how many pears?", "domain": "math"},
        {"id": "split", "instruction": "SPLITVOTE: 3 bags of 4 plums, how many plums?", "domain": "math"},
        {"id": "stubborn", "instruction": "WRONGANSWER STUBBORN: 3 crates of 4 figs, how many?", "domain": "math"},
    ])
    out = tmp_path / "out"
    summary = synthesize_flow(SynthesizeParams(
        seeds=seeds, out=str(out), base_url=server.base_url, validator=VALIDATOR,
        overrides={"synthesis": {"batch_size": 4, "prune_jaccard": 1.0, "max_repairs": 2}, "pricing": PRICED}))

    # the requests: proposals on the proposer; every repair and solver attempt on the validator
    by_kind: dict[str, set[str]] = {}
    for body in server.posts():
        by_kind.setdefault(_kind(body), set()).add(body["model"])
    assert by_kind == {"propose": {PROPOSER}, "repair": {VALIDATOR}, "solve": {VALIDATOR}}
    prompts = [b["prompt"] for b in server.posts()]
    assert any(P.MARKER_REPAIR_CODE in p for p in prompts) and any(P.MARKER_REPAIR_MATH in p for p in prompts)

    # kept or dropped as the validator's repairs left them
    rows = {r["task_id"]: r for r in pl.concat([pl.read_parquet(out / "data" / "train-00000-of-00001.parquet"),
                                                pl.read_parquet(out / "rejected.parquet")]).to_dicts()}
    assert {t: (r["status"], r["repairs"]) for t, r in rows.items()} == {
        "t-buggy-code": ("kept", 1), "t-wrong-math": ("kept", 1), "t-split-math": ("kept", 1),
        "t-stubborn-math": ("rejected", 2)}
    split = json.loads(rows["t-split-math"]["attempts"])
    assert [a["phase"] for a in split] == ["solver", "solver-after-repair-1"]
    assert split[0]["failure"] == "the solvers have no majority answer (the problem may be ambiguous)"
    assert split[0]["changed"] == "problem" and rows["t-split-math"]["answer"] == "3*4"
    assert rows["t-stubborn-math"]["reject_reason"].endswith("after 2 repairs")

    # the ledger: stage synthesize on the proposer, validate on the validator; cost per task by stage
    led = read_ledger(out).filter(pl.col("stage") != "preflight")  # the pre-flight probes: one per model
    assert dict(led.group_by("stage").agg(pl.col("model").unique().sort()).iter_rows()) == {
        "synthesize": [PROPOSER], "validate": [VALIDATOR]}
    costs = {r["task_id"]: r for r in pl.read_parquet(out / "cost_per_task.parquet").to_dicts()}
    per_stage = {(r["task_id"], r["stage"]): r["cost_usd"] for r in
                 led.group_by("task_id", "stage").agg(pl.col("cost_usd").sum()).to_dicts()}
    for task_id, row in costs.items():
        assert row["proposal_calls"] == 1 and row["proposal_usd"] == pytest.approx(per_stage[(task_id, "synthesize")])
        assert row["validate_usd"] == pytest.approx(per_stage[(task_id, "validate")]) and row["validate_usd"] > 0
        assert row["usd"] == pytest.approx(row["proposal_usd"] + row["validate_usd"])
    assert costs["t-stubborn-math"]["validate_calls"] == 3 * 3 + 2  # three rounds of 3 solver attempts, two repairs
    assert set(summary["usd_per_task_by_phase"]) == {"proposal", "validate"}
    assert summary["repairs_per_task"] == {"mean": 1.25, "kept_mean": 1.0, "total": 5}

    # both models recorded: summary, card (body and header), no same-model warning
    assert summary["models"] == {"proposer": PROPOSER, "validator": VALIDATOR, "solver": VALIDATOR,
                                 "same_model": False}
    assert "warning" not in summary
    header, body = read_card(out)
    assert f"Proposed by `{PROPOSER}`; repaired and validated by `{VALIDATOR}`" in body
    assert "| validate | `scripted` |" in body and "| synthesize | `smollm2-135m-instruct` |" in body
    assert "proposer validated its own tasks" not in body


def _math(server, instruction: str, **synthesis):
    settings = make_settings(server.base_url, pricing=PRICED, synthesis=synthesis)
    gw = Gateway(settings, base_url=server.base_url, run_id="t")
    return synth.synthesize_task({"id": "s", "instruction": instruction}, "math", gw, settings)


def test_math_repairs_stay_within_the_repair_budget(server):
    no_budget = _math(server, "WRONGANSWER: 3 boxes of 4 pears?", max_repairs=0)
    assert no_budget.status == "rejected" and no_budget.repairs == 0
    assert no_budget.reject_reason == "the reference answer 15 disagrees with the solvers' majority (12)"
    assert not any(P.MARKER_REPAIR_MATH in b["prompt"] for b in server.posts())
    assert _math(server, "SPLITVOTE: 3 bags of 4 plums?", max_repairs=0).reject_reason == (
        "the solvers have no majority answer (the problem may be ambiguous)")
    fixed = _math(server, "WRONGANSWER: 3 boxes of 4 pears?", max_repairs=1)
    assert fixed.status == "kept" and fixed.repairs == 1 and fixed.answer == "3*4" and fixed.pass_rate == 1.0
    assert [a.get("changed") for a in fixed.attempts] == ["answer", None]


@pytest.mark.usefixtures("prefect_harness")
def test_the_command_says_once_that_the_proposer_validated_and_refuses_an_unknown_validator(tmp_path, capsys):
    seeds = _seeds(tmp_path, [{"id": "m", "instruction": "3 boxes of 4 apples, how many?", "domain": "math"}])
    config = tmp_path / "priced.toml"
    config.write_text(f'[pricing.overrides."{PROPOSER}"]\ninput_per_mtok = 0.1\noutput_per_mtok = 0.2\n')
    with ScriptedServer() as srv:
        argv = ["synthesize", "--seeds", seeds, "--base-url", srv.base_url, "--config", str(config)]
        assert main([*argv, "--out", str(tmp_path / "same")]) == 0
        printed = capsys.readouterr().out
        assert [line for line in printed.splitlines() if "same model" in line] == [
            f"warning: proposer and validator are the same model ({PROPOSER}); set --validator"]
        assert main([*argv, "--out", str(tmp_path / "bad"), "--validator", "no-such-model"]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "'no-such-model' (models.validator)" in err, err
        assert not (tmp_path / "bad").exists()
