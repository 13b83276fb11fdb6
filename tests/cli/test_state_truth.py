"""State that tells the truth: a retry with nothing to retry leaves stage.json as it was (finished, with its
counts), so `evolforge status` still says finished."""

from __future__ import annotations

import json

import pytest
from prefect import flow

from evolforge.cli import main
from evolforge.cli.common import run_stage
from evolforge.flows._stage import finish_stage, stage_run
from evolforge.storage.folder import StageFolder
from evolforge.tasks.core.params import StageParams
from evolforge.tasks.core.stages import Stage, get, register, unregister
from evolforge.testing.scripted_server import ScriptedServer

pytestmark = pytest.mark.usefixtures("prefect_harness")


class NoopParams(StageParams):
    out: str


@flow(name="noop-stage")
def noop_flow(params: NoopParams) -> dict:
    """Opens its run and returns without finishing it (as a no-op retry does)."""
    with stage_run("noop-stage", params):
        return {"nothing": True}


@pytest.fixture
def noop_stage():
    register(Stage(name="noop-stage", help="", params=NoopParams, flow=f"{__name__}:noop_flow", folder=StageFolder))
    yield noop_flow, NoopParams
    unregister("noop-stage")


def test_a_run_that_finishes_nothing_leaves_a_finished_stage_json_as_it_was(tmp_path, noop_stage):
    noop_flow, params = noop_stage
    folder = StageFolder(tmp_path / "out").ensure()
    folder.start_marker("noop-stage")
    folder.finish_marker("noop-stage", {"kept": 3})
    marker = folder.marker.read_text()
    assert noop_flow(params(out=str(folder.root))) == {"nothing": True}
    assert folder.marker.read_text() == marker


@pytest.mark.long("a whole run, then its retry, through the command")
def test_a_retry_with_nothing_to_retry_leaves_stage_json_as_it_was(tmp_path, capsys):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Add {i} and {i + 3}, then explain."}) + "\n"
                             for i in range(2)))
    out = tmp_path / "out"
    with ScriptedServer() as srv:
        assert main(["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "1", "--base-url", srv.base_url,
                     "--model", "scripted"]) == 0, capsys.readouterr().err[-3000:]
        marker = (out / "stage.json").read_text()
        assert "finished_at" in json.loads(marker)
        assert main(["retry", "--out", str(out), "--base-url", srv.base_url]) == 0, capsys.readouterr().err[-3000:]
        assert "nothing to retry" in capsys.readouterr().out
    assert (out / "stage.json").read_text() == marker
    assert main(["status", "--out", str(out)]) == 0
    assert "not finished" not in capsys.readouterr().out


def test_preflight_refuses_a_model_the_endpoint_does_not_list_as_run_does(capsys):
    with ScriptedServer() as srv:  # it answers completions for any model name, but lists only its own
        code = main(["preflight", "--base-url", srv.base_url, "--model", "gpt-9"])
        assert srv.posts() == [] and srv.probes == []
    err = capsys.readouterr().err
    assert code == 2 and "does not serve 'gpt-9'" in err and len(err.strip().splitlines()) == 1, err


class KeepParams(StageParams):
    out: str
    keep: int = 0


@flow(name="keep-stage")
def keep_flow(params: KeepParams) -> dict:
    """Finishes its run with `keep` kept, listing a file it writes only when it keeps something."""
    with stage_run("keep-stage", params) as run:
        table = run.folder.root / "kept.parquet"
        if params.keep:
            table.write_text("rows")
        return finish_stage(run, {"kept": params.keep, "datasets": {"kept": str(table)}}, cost=False)


@pytest.fixture
def keep_stage():
    register(Stage(name="keep-stage", help="", params=KeepParams, flow=f"{__name__}:keep_flow", folder=StageFolder,
                   kept="kept"))
    yield get("keep-stage")
    unregister("keep-stage")


def test_a_stage_that_keeps_nothing_fails_its_flow_run_and_lists_no_file_it_did_not_write(tmp_path, keep_stage,
                                                                                           capsys):
    state = keep_flow(KeepParams(out=str(tmp_path / "none")), return_state=True)
    assert state.is_failed() and "kept nothing" in state.message
    assert json.loads((tmp_path / "none" / "stage.json").read_text())["counts"] == {}  # finished, with its summary

    assert run_stage(keep_stage, KeepParams(out=str(tmp_path / "none2"))) == 1
    captured = capsys.readouterr()
    assert "kept: 0" in captured.out and "kept.parquet" not in captured.out, captured.out
    assert "kept nothing (kept = 0)" in captured.err
    assert run_stage(keep_stage, KeepParams(out=str(tmp_path / "one"), keep=1)) == 0
    assert f"datasets: kept={tmp_path / 'one' / 'kept.parquet'}" in capsys.readouterr().out


def test_the_end_block_filter_drops_only_missing_files(tmp_path):
    from evolforge.cli.common import _missing_file

    (tmp_path / "dedup_index").mkdir()
    assert not _missing_file(f"{tmp_path / 'dedup_index'}:", str(tmp_path))  # a path ending a clause
    assert _missing_file(str(tmp_path / "tasks.parquet"), str(tmp_path))
    assert not _missing_file("/elsewhere/tasks.parquet", str(tmp_path))
