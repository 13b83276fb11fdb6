"""The eval flow on a real (ephemeral) Prefect server: a policy behind the gateway (the scripted endpoint, whose
answers are known) and a local transformers folder (a tiny Llama, batched in-process generation), the table with
intervals, the card, the plot, the artifacts; a rerun keeps finished benchmarks; the CLI refuses bad inputs."""

from __future__ import annotations

import json

import pytest

from evolforge.cli import main
from evolforge.flows.eval import EvalParams, eval_flow
from evolforge.storage.eval_sets import EvalFolder, read_rows
from evolforge.storage.folder import read_marker
from evolforge.storage.ledger import read_ledger
from evolforge.testing.eval_inputs import write_eval_inputs
from evolforge.testing.ppo_models import one_torch_thread  # noqa: F401 (autouse fixture)
from evolforge.testing.tiny_policy import build_tiny_policy

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _by(table):
    return {(r["benchmark"], r["domain"]): r for r in table}


def test_endpoint_policy_scores_what_its_answers_deserve(tmp_path, server):
    """The scripted endpoint solves every add_numbers task (its solver answer), answers 42 to every math question
    (so the '40+2' tasks pass and the '3*4' ones fail) and never writes a HumanEval function."""
    run, synth = write_eval_inputs(tmp_path)
    out = tmp_path / "eval"
    params = EvalParams(model="scripted", base_url=server.base_url, tasks=str(synth), evolve_out=str(run), out=str(out),
                        limit=3, samples=2, k=[1, 2])
    summary = eval_flow(params)
    t = _by(summary["table"])
    assert t[("own", "code")]["pass@1"] == 1.0 and t[("own", "math")]["pass@1"] == 0.5
    assert t[("math", "all")]["pass@1"] == 0.5 and t[("humaneval", "all")]["pass@1"] == 0.0
    assert t[("humaneval", "all")]["problems"] == 3 and t[("humaneval", "all")]["samples_per_problem"] == 2
    low, high = t[("own", "math")]["pass@1_ci95"]
    assert low < 0.5 < high
    folder = EvalFolder(out)
    results = read_rows(folder.results("math"))
    assert len(results) == 2 * t[("math", "all")]["problems"] and all("detail" in r for r in results)
    gens = read_rows(folder.generations("humaneval"))
    assert all(g["template"] == "humaneval_instruct" for g in gens)  # a chat endpoint gets the instruct template
    assert json.loads(folder.metrics.read_text()) == summary["table"]
    assert (out / "plots" / "eval_pass_at_1.png").stat().st_size > 1000
    card = (folder.data_dir / "README.md").read_text()
    assert "config_name: humaneval" in card and "Wilson 95% interval" in card
    calls_made = sum(2 * r["problems"] for r in summary["table"] if r["domain"] == "all")  # two samples a problem
    ledger = read_ledger(out)
    assert read_marker(out)["kind"] == "eval" and (ledger["stage"] == "eval").sum() == calls_made  # a row a call
    # a rerun keeps finished benchmarks: no new model call
    calls = len(server.posts())
    again = eval_flow(params)
    assert again["table"] == summary["table"] and len(server.posts()) == calls


def _sft_folder_with_a_leak(root, problem):
    from evolforge.storage.sft_sets import SFTFolder, message, write_rows

    folder = SFTFolder(root).ensure()
    folder.start_marker("sft")
    rows = [{"id": f"r{i}", "source": "evolved", "seed_id": f"s{i}", "domain": "code",
             "prompt": [message("user", text)], "completion": [message("assistant", "Step 1: done.")]}
            for i, text in enumerate(["Write a function that adds two numbers together and returns the sum.",
                                      "Finish this code:\n" + problem.text])]
    write_rows(rows, folder.train)
    return folder.root


def test_local_policy_folder_generates_in_process(tmp_path):
    from evolforge.config.settings import Settings
    from evolforge.tasks.problems.benchmarks import humaneval_problems, ordered

    tiny = build_tiny_policy(tmp_path / "tiny")
    first = ordered(humaneval_problems(), Settings().eval.seed, 2)[0]  # one of the two problems evaluated
    sft = _sft_folder_with_a_leak(tmp_path / "sft", first)
    out = tmp_path / "eval"
    summary = eval_flow(EvalParams(policy=str(tiny), out=str(out), benchmarks=["humaneval", "own"], limit=2,
                                   training=[str(sft)],
                                   overrides={"eval": {"max_new_tokens": 8, "batch_size": 2}}))
    (overlap,) = summary["training_overlap"]
    assert overlap["table"] == "sft" and overlap["checked"] == 2 and overlap["overlapping"] == 1
    assert overlap["examples"] == [{"row": "r1", "eval_set": "humaneval", "eval_item": first.id}]
    assert summary["benchmarks_run"] == ["humaneval"] and "own" in summary["not_run"]
    gens = read_rows(EvalFolder(out).generations("humaneval"))
    assert len(gens) == 2 and all(g["template"] == "humaneval_completion" and len(g["samples"]) == 1 for g in gens)
    assert _by(summary["table"])[("humaneval", "all")]["problems"] == 2


def test_command_refuses_bad_inputs_before_anything_starts(tmp_path, capsys):
    out = tmp_path / "eval"
    for args, says in ((["eval", "--out", str(out)], "name one policy"),
                       (["eval", "--policy", str(tmp_path), "--out", str(out)], "not a transformers model folder"),
                       (["eval", "--model", "m", "--tasks", str(tmp_path / "no"), "--out", str(out)], "not found"),
                       (["eval", "--model", "m", "--training", str(tmp_path), "--out", str(out)], "not an evolve")):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
