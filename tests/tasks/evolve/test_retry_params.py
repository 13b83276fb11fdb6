"""A retry's parameters (tasks/evolve/stage.py run_to_retry): the run's seeds and result-changing settings come
from its run.json; the endpoint, key handling, index, runner, sandbox, embedded server binary and every other
setting come from the user. The folder's record never sets them, and where it disagrees the retry stops naming
both (an InputError: one line, exit 2 at the command line)."""

from __future__ import annotations

import json

import pytest

from evolforge.config.settings import load_settings
from evolforge.storage.layout import RunLayout
from evolforge.tasks.core.checks import InputError
from evolforge.tasks.evolve.stage import EvolveParams, index_of, run_to_retry

ENDPOINT = "https://models.example.org/v1"
PLANTED = {
    "gateway": {"base_url": ENDPOINT, "allow_key_over_http": True, "timeout_seconds": 1.0},
    "embedded": {"server_binary": "/tmp/evil-llama-server", "model_path": "/tmp/evil.gguf", "alias": "m", "n_ctx": 512},
    "runner": {"kind": "ray", "address": "ray://attacker:10001"},
    "sandbox": {"mode": "rlimits-only"},
    "dedup": {"shard_dir": "/tmp/evil-shards", "embedding_model": "/tmp/evil-model", "cosine_threshold": 0.77},
    "models": {"default": "their-model", "judge": "their-judge"},
    "evol_instruct": {"temperature": 0.5, "rounds": 3, "batch_size": 4},
    "input": {"instruction_field": "prompt"},
}


def plant(out, settings: dict = PLANTED, indexes: list | None = None) -> RunLayout:
    lay = RunLayout(out)
    lay.root.mkdir(parents=True)
    recorded = load_settings(overrides=settings, environ={}).fingerprint()
    lay.run_info.write_text(json.dumps({"run_id": "r", "seeds": str(out / "seeds.jsonl"), "settings": recorded}))
    if indexes is not None:
        lay.dedup_run.write_text(json.dumps({"run": "tag", "source": str(lay.root), "indexes": indexes}))
    return lay


def test_only_the_runs_result_settings_come_from_the_folder(tmp_path):
    lay = plant(tmp_path / "run")
    params = run_to_retry(EvolveParams(out=str(lay.root), base_url=ENDPOINT, retry=True))
    s, default = params.settings(), load_settings()
    # the run's own: what its batches are redone with
    assert params.seeds == str(tmp_path / "run" / "seeds.jsonl") and s.evol_instruct.rounds == 3
    assert (s.evol_instruct.temperature, s.evol_instruct.batch_size, s.input.instruction_field) == (0.5, 4, "prompt")
    assert (s.models.evolve, s.models.judge, s.models.answer) == ("their-model", "their-judge", "their-model")
    assert s.dedup.cosine_threshold == 0.77 and (s.embedded.alias, s.embedded.n_ctx) == ("m", 512)
    # the user's: where the key goes and how, what runs where, what is loaded from where
    assert s.gateway.base_url == ENDPOINT  # named by the flag, not taken from the folder
    assert s.gateway.allow_key_over_http is False and s.gateway.timeout_seconds == default.gateway.timeout_seconds
    assert s.embedded.server_binary == default.embedded.server_binary
    assert s.embedded.model_path == default.embedded.model_path
    assert s.runner == default.runner and s.sandbox == default.sandbox
    assert s.dedup.shard_dir == default.dedup.shard_dir and s.dedup.embedding_model == default.dedup.embedding_model


def test_a_recorded_endpoint_other_than_the_users_stops_the_retry(tmp_path, monkeypatch):
    lay = plant(tmp_path / "run")
    with pytest.raises(InputError) as err:
        run_to_retry(EvolveParams(out=str(lay.root), retry=True))
    message = str(err.value)
    assert ENDPOINT in message and "embedded model" in message and "--base-url" in message
    assert "\n" not in message
    monkeypatch.setenv("EVOLFORGE__GATEWAY__BASE_URL", "https://mine.example.org/v1")
    with pytest.raises(InputError, match="mine.example.org.*--base-url"):
        run_to_retry(EvolveParams(out=str(lay.root), retry=True))
    monkeypatch.setenv("EVOLFORGE__GATEWAY__BASE_URL", ENDPOINT + "/")  # the same endpoint, the user's own
    assert run_to_retry(EvolveParams(out=str(lay.root), retry=True)).settings().gateway.base_url == ENDPOINT + "/"


def test_a_recorded_index_other_than_the_users_stops_the_retry(tmp_path):
    elsewhere = tmp_path / "someone-elses-index"
    lay = plant(tmp_path / "run", indexes=[str(elsewhere)])
    with pytest.raises(InputError) as err:
        run_to_retry(EvolveParams(out=str(lay.root), base_url=ENDPOINT, retry=True))
    message = str(err.value)
    assert str(elsewhere) in message and str(lay.dedup_index) in message and "--dedup-index" in message
    assert "\n" not in message
    other = tmp_path / "mine"
    with pytest.raises(InputError, match=f"{elsewhere}.*{other}"):
        run_to_retry(EvolveParams(out=str(lay.root), base_url=ENDPOINT, dedup_index=str(other), retry=True))
    # named by the user, it is used (a nightly run's shared index)
    params = run_to_retry(EvolveParams(out=str(lay.root), base_url=ENDPOINT, dedup_index=str(elsewhere), retry=True))
    assert index_of(params) == str(elsewhere)
    # the default index is fine when it is the one the run used
    lay2 = plant(tmp_path / "run2", indexes=[str(tmp_path / "run2" / "dedup_index")])
    assert index_of(run_to_retry(EvolveParams(out=str(lay2.root), base_url=ENDPOINT, retry=True))) == str(lay2.dedup_index)


def test_a_resumed_run_naming_another_index_than_its_own_stops_at_the_check(tmp_path):
    from evolforge.tasks.evolve.stage import STAGE

    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text('{"id": "s0", "instruction": "Explain tides to a child."}\n')
    shared = tmp_path / "dataset" / "dedup_index"
    lay = plant(tmp_path / "night", indexes=[str(shared)])
    params = EvolveParams(seeds=str(seeds), out=str(lay.root))  # `evolforge run --out NIGHT` without the index
    with pytest.raises(InputError, match=f"{shared}.*{lay.dedup_index}.*--dedup-index"):
        STAGE.check(params, params.settings())
