"""run.json: a run over an existing output folder is checked against the run's own seeds and settings
(storage/run_record.py), and `evolforge run --force-settings` accepts a change."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.cli import main as cli_main
from evolforge.storage.layout import RunLayout
from evolforge.storage.run_record import RunInputsChanged, open_run, result_settings
from evolforge.testing.settings import make_settings

URL = "http://127.0.0.1:9/v1"


def _started(tmp_path, seeds_text="a\nb\n", **sections):
    """A folder whose run started (record saved, round-1 pool present) from `seeds` with these settings."""
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(seeds_text)
    lay = RunLayout(tmp_path / "out").ensure()
    open_run(lay, str(seeds), make_settings(URL, **sections), "run-1").save()
    lay.round_input(1).parent.mkdir(parents=True, exist_ok=True)
    lay.round_input(1).write_bytes(b"pool")  # only its presence matters here
    return lay, seeds


def test_the_same_inputs_resume_and_the_history_grows(tmp_path):
    lay, seeds = _started(tmp_path)
    first = json.loads(lay.run_info.read_text())
    assert first["seeds_sha256"] and first["seeds_bytes"] == 4 and first["history"][0]["event"] == "start"
    rec = open_run(lay, str(seeds), make_settings(URL), "run-2")
    rec.save()
    info = json.loads(lay.run_info.read_text())
    assert info["run_id"] == "run-1" and [e["event"] for e in info["history"]] == ["start", "resume"]
    assert info["history"][0] == first["history"][0]


def test_the_same_seed_content_under_another_path_is_accepted_and_noted(tmp_path):
    lay, seeds = _started(tmp_path)
    moved = tmp_path / "moved.jsonl"
    moved.write_bytes(seeds.read_bytes())
    seeds.unlink()
    rec = open_run(lay, str(moved), make_settings(URL), "run-2")
    assert "same content" in rec.notes[0]
    assert rec.save()["seeds"] == str(moved)  # `evolforge retry` reads the seeds from here


def test_an_unreadable_seed_file_at_the_recorded_path_resumes_from_the_imported_pool(tmp_path):
    lay, seeds = _started(tmp_path)
    seeds.unlink()
    assert "cannot be read" in open_run(lay, str(seeds), make_settings(URL), "run-2").notes[0]


@pytest.mark.parametrize("change, key", [
    ({"models": {"default": "other-model"}}, "models.evolve 'smollm2-135m-instruct' -> 'other-model'"),
    ({"models": {"judge": "judge-model"}}, "models.judge"),
    ({"input": {"max_chars": 100}}, "input.max_chars 20000 -> 100"),
    ({"evol_instruct": {"seed": 7}}, "evol_instruct.seed 42 -> 7"),
    ({"dedup": {"jaccard_threshold": 0.5}}, "dedup.jaccard_threshold"),  # dedup_each_round is on by default
])
def test_result_settings_that_changed_are_named(tmp_path, change, key):
    lay, seeds = _started(tmp_path)
    with pytest.raises(RunInputsChanged, match=key.replace(".", r"\.").replace("(", r"\(")):
        open_run(lay, str(seeds), make_settings(URL, **change), "run-2")


@pytest.mark.parametrize("change", [
    {"gateway": {"base_url": "http://other:8000/v1", "concurrency": 64, "timeout_seconds": 5, "max_retries": 9}},
    {"evol_instruct": {"concurrency": 64, "batch_size": 7, "rounds": 9}},
    {"runner": {"kind": "dask", "max_workers": 8}, "storage": {"remote_log_flush_seconds": 0}},
    {"dedup": {"threads": 8, "chunk_records": 10, "batch_size": 8}},
    {"pricing": {"provider_id": "openai"}},
    {"embedded": {"model_path": "/other.gguf"}},  # the embedded model does not serve this run (base_url is set)
])
def test_settings_that_do_not_change_results_are_not_compared(tmp_path, change):
    lay, seeds = _started(tmp_path)
    settings = make_settings(change.get("gateway", {}).get("base_url", URL), **change)
    assert open_run(lay, str(seeds), settings, "run-2").event == "resume"


def test_dedup_settings_count_only_when_rounds_are_deduplicated(tmp_path):
    off = {"evol_instruct": {"dedup_each_round": False}}
    lay, seeds = _started(tmp_path, **off)
    assert "dedup.jaccard_threshold" not in result_settings(make_settings(URL, **off).fingerprint())
    changed = {**off, "dedup": {"jaccard_threshold": 0.5}}
    assert open_run(lay, str(seeds), make_settings(URL, **changed), "run-2").event == "resume"


def test_a_run_json_without_history_is_kept_as_the_first_record(tmp_path):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("a\n")
    lay = RunLayout(tmp_path / "out").ensure()
    legacy = {"seeds": str(seeds), "run_id": "old-run", "settings": make_settings(URL).fingerprint()}
    lay.run_info.write_text(json.dumps(legacy))
    lay.round_input(1).parent.mkdir(parents=True)
    lay.round_input(1).write_bytes(b"pool")
    with pytest.raises(RunInputsChanged, match="evol_instruct.temperature"):
        open_run(lay, str(seeds), make_settings(URL, evol_instruct={"temperature": 0.1}), "run-2")
    info = open_run(lay, str(seeds), make_settings(URL), "run-2").save()
    assert info["run_id"] == "old-run" and info["seeds_sha256"]  # the hash is taken now
    assert info["history"][0]["settings"] == legacy["settings"] and info["history"][1]["event"] == "resume"
    other = tmp_path / "other.jsonl"
    other.write_text("a\n")
    info = json.loads(lay.run_info.read_text())
    del info["seeds_sha256"]
    lay.run_info.write_text(json.dumps(info))
    with pytest.raises(RunInputsChanged, match="holds no hash"):  # without a hash, another path is a change
        open_run(lay, str(other), make_settings(URL), "run-3")


def test_a_folder_without_a_round_one_pool_starts_afresh(tmp_path):
    """A run that failed before importing its seeds holds nothing: the next run may use other inputs."""
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("a\n")
    lay = RunLayout(tmp_path / "out").ensure()
    open_run(lay, str(seeds), make_settings(URL), "run-1").save()
    other = tmp_path / "other.jsonl"
    other.write_text("b\n")
    rec = open_run(lay, str(other), make_settings(URL, evol_instruct={"temperature": 0.2}), "run-2")
    info = rec.save()
    assert rec.event == "start" and info["seeds"] == str(other) and len(info["history"]) == 2


def test_a_forced_change_is_recorded_and_the_run_then_stands_on_it(tmp_path):
    lay, seeds = _started(tmp_path, evol_instruct={"rounds": 3})
    seeds.write_text("c\n")  # other seeds and another setting, accepted at once
    changed = make_settings(URL, evol_instruct={"rounds": 1, "top_p": 0.5})
    rec = open_run(lay, str(seeds), changed, "run-2", force=True)
    info = rec.save()
    assert rec.event == "forced" and "accepted with force_settings" in rec.notes[0]
    assert info["settings"]["evol_instruct"]["top_p"] == 0.5
    assert info["settings"]["evol_instruct"]["rounds"] == 3  # the most rounds any run asked for (retry redoes them)
    entry = info["history"][-1]
    assert entry["changes"] == {"evol_instruct.top_p": [0.95, 0.5]}
    assert entry["seeds_changed"]["new"]["seeds_sha256"] == info["seeds_sha256"] != info["history"][0]["seeds_sha256"]
    assert entry["replaced"]["seeds_sha256"] == info["history"][0]["seeds_sha256"]
    assert open_run(lay, str(seeds), changed, "run-3").event == "resume"  # no force needed any more


@pytest.mark.usefixtures("prefect_harness")
def test_cli_run_names_the_change_and_force_settings_accepts_it(tmp_path, server, capsys):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps({"id": f"s{i}", "instruction": f"List {i + 2} rivers of country {i}."})
                               for i in range(4)) + "\n")

    def config(temperature: float) -> str:
        path = tmp_path / f"config-{temperature}.toml"
        path.write_text(f"[gateway]\nbackoff_base_seconds = 0.0\ntimeout_seconds = 2.0\n"
                        f"[evol_instruct]\nbatch_size = 2\nconcurrency = 2\ntemperature = {temperature}\n")
        return str(path)

    run = ["run", "--seeds", str(seeds), "--out", str(tmp_path / "out"), "--rounds", "1", "--base-url", server.base_url]
    assert cli_main([*run, "--config", config(0.9)]) == 0
    sent = len(server.posts())
    printed = capsys.readouterr().out  # the evolve stage's `present`
    assert "== evolforge run complete ==" in printed and "round 1: 4/4 accepted (survival 100%)" in printed
    assert f"summary:                               {tmp_path / 'out'}/summary.json" in printed
    assert f"per-stage costs: evolforge costs --out {tmp_path / 'out'} --by stage" in printed
    assert cli_main([*run, "--config", config(0.4)]) == 2
    err = capsys.readouterr().err
    assert "evol_instruct.temperature 0.9 -> 0.4" in err and "--force-settings" in err and "resume" not in err
    assert len(server.posts()) == sent
    server.script("400")  # one record of round 2 is rejected: an error row for `evolforge retry`
    assert cli_main([*run, "--config", config(0.4), "--rounds", "2", "--force-settings"]) == 0
    lay = RunLayout(tmp_path / "out")
    info = json.loads(lay.run_info.read_text())
    assert info["history"][-1]["changes"] == {"evol_instruct.temperature": [0.9, 0.4]}
    assert pl.read_parquet(lay.lineage).filter(pl.col("status") == "error").height == 1
    assert cli_main(["retry", "--out", str(lay.root), "--base-url", server.base_url]) == 0  # retry reuses the accepted settings: no mismatch
    assert set(pl.read_parquet(lay.lineage)["status"]) == {"accepted"}
    assert json.loads(lay.run_info.read_text())["history"][-1]["event"] == "resume"
