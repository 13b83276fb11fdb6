"""`evolforge publish`: a clear one-line error (exit 2, no traceback) without a token, offline, or when the Hub
cannot be reached, and the token never in the output. The command runs as a user runs it (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from evolforge.storage.cards import write_dataset_card
from evolforge.storage.layout import RunLayout
from evolforge.storage.rounds import write_sft_view
from evolforge.testing.evolved_runs import evolve_folder
from evolforge.testing.prefect_server import free_port

TOKEN = "hf_evolforgeTestToken0123456789abcdef"


@pytest.fixture
def run_folder(tmp_path):
    lay = RunLayout(evolve_folder(tmp_path))
    write_sft_view(lay.evolved, lay.sft)
    write_dataset_card(lay.dataset_dir, {"sft": lay.sft, "evolved": lay.evolved}, title="t", description="d",
                       sections={}, facts={"stage": "evolve"})
    return lay.root


def publish(out, tmp_path, **env):
    # offline switches other tests leave in this process's environment (TRANSFORMERS_OFFLINE makes
    # huggingface_hub offline too) must not reach the command
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "TRANSFORMERS_OFFLINE"}
    base.update(HF_HOME=str(tmp_path / "hf-home"), **env)  # no token stored from an earlier login
    return subprocess.run([sys.executable, "-m", "evolforge.cli", "publish", "--out", str(out), "--repo", "me/evolved"],
                          env=base, capture_output=True, text=True, timeout=120)


def assert_clear_error(res, *words):
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out and TOKEN not in out
    for w in words:
        assert w in res.stderr, res.stderr


def test_without_a_token(run_folder, tmp_path):
    assert_clear_error(publish(run_folder, tmp_path), "no Hugging Face token", "HF_TOKEN")


def test_unreachable_hub_never_shows_the_token(run_folder, tmp_path):
    res = publish(run_folder, tmp_path, HF_TOKEN=TOKEN, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    assert_clear_error(res, "could not publish", "me/evolved", "127.0.0.1")


def test_offline_mode(run_folder, tmp_path):
    assert_clear_error(publish(run_folder, tmp_path, HF_TOKEN=TOKEN, HF_HUB_OFFLINE="1"), "could not publish")


def test_folder_without_a_card(tmp_path):
    assert_clear_error(publish(tmp_path, tmp_path, HF_TOKEN=TOKEN), "no dataset card")


def test_publish_commits_the_card_and_its_tables_only(run_folder, tmp_path):
    """Against a scripted Hub (the real client, real HTTP): one commit of the card and the tables it names, no
    checkpoint or ledger file; the card's load example names the repo; the token goes in the header only."""
    from evolforge.testing.hub_server import HubServer

    lay = RunLayout(run_folder)
    (lay.dataset_dir / "notes.parquet").write_bytes(b"not in the card")
    with HubServer() as hub:
        res = publish(run_folder, tmp_path, HF_TOKEN=TOKEN, HF_ENDPOINT=hub.endpoint)
    assert res.returncode == 0, res.stderr
    assert TOKEN not in res.stdout + res.stderr and hub.auth == {f"Bearer {TOKEN}"}
    assert hub.repos == ["me/evolved"]
    assert set(hub.files) == {"README.md", "sft/train.parquet", "evolved.parquet"}
    assert hub.files["sft/train.parquet"] == lay.sft.read_bytes()
    card = hub.files["README.md"].decode()
    assert 'where = "me/evolved"' in card and str(lay.dataset_dir) not in card
