"""Live progress: the numbers (tasks/core/progress.py), the plain lines a non-terminal gets, the rich bars a
terminal gets, and the same line in the Prefect progress artifact."""

from __future__ import annotations

import io
import json
import re

import polars as pl
import pytest

from evolforge.storage.ledger import LEDGER_SCHEMA
from evolforge.tasks.core.progress import StageProgress, progress_line


def ledger_rows(n: int, tokens: int, cost: float | None) -> pl.DataFrame:
    return pl.DataFrame([{"stage": "evolve", "prompt_tokens": tokens, "completion_tokens": 0, "cost_usd": cost,
                          "outcome": "ok"} for _ in range(n)], schema=LEDGER_SCHEMA, strict=False)


@pytest.fixture
def ten_seconds_in(monkeypatch):
    """The progress module's clock stopped 10 s after the start: the rates must not depend on how long the test's
    own steps take on a loaded machine (the 10 s from a real clock failed the 5 % tolerance once, on 3 workers)."""
    import types

    from evolforge.tasks.core import progress

    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: 1010.0))
    return 1000.0


def test_stage_numbers_from_batch_results_running_batches_and_the_ledger(ten_seconds_in):
    p = StageProgress("round 1", batches=4)
    p.started = ten_seconds_in
    snap = p.snapshot()
    assert snap["records_total"] is None and snap["eta_s"] is None and snap["records_done"] == 0
    p.batch_finished({"rows": 10, "by_status": {"accepted": 6, "eliminated": 3, "error": 1}, "skipped": False})
    p.running(3, 10, 1)  # one batch running: 3 of its 10 records done
    p.add_calls(ledger_rows(20, 100, 0.001))
    snap = p.snapshot()
    # 2 batches seen of 4 (1 finished, 1 running), 10 records each: the other 2 are taken to be as large
    assert snap["records_done"] == 13 and snap["records_total"] == 40 and snap["accepted"] == 6
    assert snap["calls"] == 20 and snap["calls_per_s"] == pytest.approx(2.0, rel=0.05)
    assert snap["tokens_per_s"] == pytest.approx(200, rel=0.05) and snap["cost_usd"] == pytest.approx(0.02)
    assert snap["eta_s"] == pytest.approx((40 - 13) / 1.3, rel=0.05)  # 13 records in 10 s
    line = progress_line(snap)
    assert line.startswith("round 1: 13/40 records (32%), 6 accepted, batches 1/4, 20 calls (2.00/s), 200 tokens/s, "
                           "cost $0.0200, ETA 0m2") and line.endswith("s")
    # one unpriced call makes the cost unknown, never a partial sum; a failed batch is counted
    p.add_calls(ledger_rows(1, 5, None))
    p.batch_finished(None)
    snap = p.snapshot()
    assert snap["cost_usd"] is None and "cost unpriced" in progress_line(snap) and "1 failed" in progress_line(snap)


def test_resumed_batches_do_not_count_as_speed(ten_seconds_in):
    p = StageProgress("round 2", batches=2)
    p.started = ten_seconds_in
    p.batch_finished({"rows": 100, "by_status": {"accepted": 100}, "skipped": True})  # checkpointed earlier
    p.running(5, 100, 1)
    snap = p.snapshot()
    assert snap["records_done"] == 105 and snap["records_total"] == 200
    assert snap["eta_s"] == pytest.approx(95 / 0.5, rel=0.05)  # 5 fresh records in 10 s, not 105


# ---------------------------------------------------------------- real runs: plain lines, rich bars, artifact

def write_inputs(tmp_path, server):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Compute {i} plus {i + 7} and explain."})
                             + "\n" for i in range(5)))
    cfg = tmp_path / "config.toml"
    cfg.write_text("[evol_instruct]\nbatch_size = 2\nconcurrency = 2\n[gateway]\nbackoff_base_seconds = 0.0\n"
                   "timeout_seconds = 2.0\n[pricing.overrides.scripted]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n")
    return seeds, cfg


@pytest.mark.usefixtures("prefect_harness")
def test_plain_lines_when_stdout_is_not_a_terminal_and_the_artifact(tmp_path, server, capsys):
    from evolforge.cli import main

    seeds, cfg = write_inputs(tmp_path, server)
    out = tmp_path / "out"
    rc = main(["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "2", "--base-url", server.base_url,
               "--model", "scripted", "--config", str(cfg)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    lines = [ln for ln in captured.out.splitlines() if re.match(r"round \d: \d+/\S+ records", ln)]
    for r in (1, 2):
        last = [ln for ln in lines if ln.startswith(f"round {r}:")][-1]
        m = re.match(rf"round {r}: 5/5 records \(100%\), 5 accepted, batches 3/3, (\d+) calls \(([\d.]+)/s\), "
                     r"(\d+) tokens/s, cost \$([\d.]+), done in \d+m\d\ds$", last)
        assert m, last
        assert int(m.group(1)) == 15 and float(m.group(2)) > 0 and int(m.group(3)) > 0  # 3 calls per record
        assert float(m.group(4)) > 0  # priced through the config override
    assert "\x1b[" not in captured.out  # no terminal escapes in a log file

    # the same line reached the Prefect progress artifact of each round
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["evolve-round-1-progress"])))
    latest = max(arts, key=lambda a: a.updated)
    assert latest.data == 100 and latest.description.startswith("round 1: 5/5 records (100%), 5 accepted, batches 3/3")
    assert "calls (" in latest.description and "tokens/s" in latest.description and "cost $" in latest.description


@pytest.mark.usefixtures("prefect_harness")
def test_rich_bars_on_a_terminal(tmp_path, server):
    from rich.console import Console

    from evolforge.cli.progress import live_progress
    from evolforge.flows.evolve import EvolveParams, evolve_flow

    seeds, cfg = write_inputs(tmp_path, server)
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=220, color_system="standard")
    with live_progress(console=console):
        evolve_flow(EvolveParams(seeds=str(seeds), out=str(tmp_path / "out"), rounds=1, base_url=server.base_url,
                                 model="scripted", config=str(cfg)))
    text = buf.getvalue()
    assert "\x1b[" in text  # drawn for a terminal
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert re.search(r"round 1 .*5/5 records .*5 accepted .*[\d.]+ calls/s .*\d+ tok/s .*\$[\d.]+ .*done \dm\d\ds", plain), plain[-2000:]


def test_a_step_after_the_batches_is_labelled_until_it_gives_the_final_count():
    p = StageProgress("round 1", batches=1, settles="dedup")
    p.batch_finished({"rows": 30, "by_status": {"accepted": 30}, "skipped": False})
    snap = p.snapshot()
    assert snap["accepted"] == 30 and "30 accepted before dedup," in progress_line(snap)
    p.settled(1)
    snap = p.snapshot()
    assert snap["accepted"] == 1 and "1 accepted (29 dropped by dedup)," in progress_line(snap)
    p = StageProgress("round 2", batches=1, settles="dedup")
    p.batch_finished({"rows": 3, "by_status": {"accepted": 3}, "skipped": False})
    p.settled(3)
    assert ", 3 accepted, batches" in progress_line(p.snapshot())  # nothing dropped: nothing to say


@pytest.mark.usefixtures("prefect_harness")
def test_progress_accepted_is_the_summarys_count_after_the_rounds_dedup(tmp_path, server, capsys):
    """Evolutions that are near-duplicates of each other: every one is accepted by its batch, dedup keeps one;
    the round's last progress line (and its artifact) says what the summary says, the earlier ones say 'before
    dedup'."""
    from evolforge.cli import main

    seeds, cfg = write_inputs(tmp_path, server)
    server.evolve_overrides = {f"Compute {i} plus": "Describe carefully how a pupil adds two whole numbers on paper, "
                               f"carrying tens and checking the total at the end, example {i}." for i in range(5)}
    out = tmp_path / "out"
    rc = main(["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "1", "--base-url", server.base_url,
               "--model", "scripted", "--config", str(cfg)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads((out / "summary.json").read_text())
    kept = summary["rounds"][0]["accepted"]
    assert summary["rounds"][0]["attempts"] == 5 and kept < 5  # the near-duplicates were dropped
    lines = [ln for ln in captured.out.splitlines() if re.match(r"round 1: \d+/\S+ records", ln)]
    last = lines[-1]
    assert re.match(rf"round 1: 5/5 records \(100%\), {kept} accepted \({5 - kept} dropped by dedup\), batches 3/3, "
                    r".*done in \d+m\d\ds$", last), last
    assert all("accepted before dedup" in ln for ln in lines[:-1]) and len(lines) > 1
    assert f"round 1: {kept}/5 accepted" in captured.out  # the short summary agrees
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["evolve-round-1-progress"])))
    latest = max(arts, key=lambda a: a.updated)
    assert latest.description.startswith(f"round 1: 5/5 records (100%), {kept} accepted ({5 - kept} dropped by dedup)")
