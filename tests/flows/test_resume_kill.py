"""SIGKILL mid-round, run again: no finished call repeated (seen from the server), no record lost or doubled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import polars as pl
import pytest

from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import read_ledger
from evolforge.testing.scripted_server import ScriptedServer

pytestmark = pytest.mark.usefixtures("prefect_harness")

N_SEEDS, ROUNDS = 40, 2


def _run_cli(seeds, out, base_url, env):
    cmd = [sys.executable, "-m", "evolforge.cli", "run", "--seeds", str(seeds), "--out", str(out),
           "--rounds", str(ROUNDS), "--base-url", base_url]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _env(tmp_path):
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ)
    env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    env["EVOLFORGE__EVOL_INSTRUCT__BATCH_SIZE"] = "8"
    env["EVOLFORGE__EVOL_INSTRUCT__CONCURRENCY"] = "2"
    # MinHash dedup only: the embedding model's load (torch, sentence-transformers: ~4 s of CPU per command, 18 ->
    # 9 s for this test) is not what the kill is about; the dedup tests cover that stage's resume
    env["EVOLFORGE__DEDUP__EMBEDDING"] = "false"
    return env


@pytest.mark.long("the product's resume promise end to end: a real `evolforge run` SIGKILLed mid-round and resumed, "
                  "two command processes (~9 s CPU)")
def test_sigkill_mid_round_then_resume(tmp_path):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps({"id": f"s{i:02d}", "instruction": f"Explain fact number {i} about rivers."})
                               for i in range(N_SEEDS)) + "\n")
    out = tmp_path / "out"
    env = _env(tmp_path)
    with ScriptedServer(latency=0.05) as srv:
        proc = _run_cli(seeds, out, srv.base_url, env)
        deadline = time.time() + 180
        while time.time() < deadline:  # kill once part of round 1 is done and calls are in flight
            if (out / "ledger").exists() and read_ledger(out).height >= 60:
                break
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        t_kill = time.time()
        before = srv.posts()
        assert not RunLayout(out).round_success(1).exists(), "killed too late to test a mid-round resume"

        proc = _run_cli(seeds, out, srv.base_url, env)
        output = proc.communicate(timeout=300)[0].decode()
        assert proc.returncode == 0, output[-3000:]
        after = srv.posts()[len(before):]

    finished_before = {r["key"] for r in before if r["completed"] and r["t"] < t_kill - 1.0}
    repeated = [r for r in after if r["key"] in finished_before]
    assert repeated == [], f"{len(repeated)} finished calls were sent again"
    in_flight_repeats = {r["key"] for r in after} & {r["key"] for r in before if r["completed"]}
    assert len(in_flight_repeats) <= 8  # at most the calls in flight at the kill (gateway concurrency)

    lay = RunLayout(out)
    lineage = pl.read_parquet(lay.lineage)
    assert lineage["id"].n_unique() == lineage.height == N_SEEDS * ROUNDS
    for r in (1, 2):
        assert sorted(lineage.filter(pl.col("round") == r)["seed_id"]) == [f"s{i:02d}" for i in range(N_SEEDS)]
    assert json.loads(lay.summary.read_text())["gateway"]["replayed"] > 0  # the killed batch replayed its journal
    evolved = pl.read_parquet(lay.evolved)
    assert evolved["id"].n_unique() == evolved.height
