"""Integration: a real flow run against the embedded SmolLM2-135M (llama.cpp server on loopback)."""

from __future__ import annotations

import json

import httpx
import polars as pl
import pytest

from evolforge.cli.services import preflight
from evolforge.config.settings import load_settings
from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import read_ledger
from evolforge.tasks.core.embedded_model import embedded_server
from evolforge.tasks.core.gateway import model_roles

pytestmark = pytest.mark.embedded


def test_preflight_against_embedded_model(tmp_path):
    settings = load_settings(environ={})
    with embedded_server(settings.embedded, tmp_path) as url:
        report = preflight(settings, url, embedded=True)
    assert len(report) == 1 and report[0]["ok"]
    assert report[0]["stages"] == list(model_roles())  # every [models] role, in the section's order
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/models", timeout=2)  # stopped with the context


@pytest.mark.usefixtures("prefect_harness")
def test_flow_run_on_embedded_model(tmp_path):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps({"instruction": t}) for t in [
        "A farmer has 12 cows and buys 5 more. How many cows does he have?",
        "Write a Python function that returns the largest of three numbers.",
        "Explain why leaves change colour in autumn.",
    ]) + "\n")
    summary = evolve_flow(EvolveParams(seeds=str(seeds), out=str(tmp_path / "out"), rounds=1,
                                       overrides={"evol_instruct": {"batch_size": 2},
                                                  "embedded": {"max_new_tokens": 64}}))
    lay = RunLayout(tmp_path / "out")
    lineage = pl.read_parquet(lay.lineage)
    assert lineage.height == 3 and set(lineage["status"]) <= {"accepted", "eliminated"}
    assert all(len(t) > 0 for t in lineage["instruction"])  # real text from the real model
    ledger = read_ledger(lay.root)
    assert ledger.height >= 3 and set(ledger["outcome"]) == {"ok"}
    assert set(ledger["price_source"]) == {"embedded model (free)"} and ledger["cost_usd"].sum() == 0.0
    assert ledger["completion_tokens"].sum() > 0
    assert summary["endpoint"].startswith("embedded") and summary["cost"]["cost_usd"] == 0.0
    assert (lay.logs_dir / "embedded-model.log").exists()
