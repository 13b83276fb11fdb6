"""Unknown costs stay unknown; a key never travels over plain http off this machine; every flow checks the
models it is about to use with a real completion before any work."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.cli import main as cli_main
from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow
from evolforge.storage.ledger import totals
from evolforge.tasks.core.gateway import Gateway, GatewayError, InsecureKeyTransport
from evolforge.tasks.core.reporting import cost_summary
from evolforge.tasks.evolve.report import CostTally, markdown
from evolforge.tasks.synthesis.report import cost_per_task as synthesis_costs
from evolforge.tasks.synthesis.report import summarize
from evolforge.testing.settings import make_settings


def _ledger(rows: list[tuple[str, str, float | None]]) -> pl.DataFrame:
    return pl.DataFrame([{"task_id": t, "stage": st, "model": "m", "outcome": "ok", "prompt_tokens": 10,
                          "completion_tokens": 5, "cost_usd": c, "price_source": "x", "latency_s": 0.1}
                         for t, st, c in rows], schema_overrides={"cost_usd": pl.Float64})


# ------------------------------------------------------------------ unknown prices

def test_an_unpriced_call_makes_every_sum_over_it_unknown():
    led = _ledger([("a", "evolve", 0.001), ("a", "judge", None), ("b", "evolve", 0.002)])
    t = {r["task_id"]: r for r in totals(led, ["task_id"]).to_dicts()}
    assert t["a"]["cost_usd"] is None and t["a"]["unpriced_calls"] == 1 and t["b"]["cost_usd"] == 0.002
    s = cost_summary(led)
    assert s["cost_usd"] is None and s["unpriced_attempts"] == 1
    assert s["per_task"]["mean_cost_usd"] is None and s["per_task"]["median_cost_usd"] is None
    tally = CostTally().add(led)
    assert tally.cost_of(pl.Series(["a", "b"])) is None and tally.cost_of(pl.Series(["b"])) == 0.002


def test_the_run_report_never_shows_an_unknown_cost_as_zero():
    led = _ledger([("a", "evolve", None), ("b", "evolve", None)])
    summary = {"run_id": "r", "out_dir": "o", "endpoint": "e", "rounds": [], "cost": cost_summary(led),
               "datasets": {}}
    md = markdown(summary)
    assert "$0.000000" not in md and md.count("unknown (unpriced model)") >= 4  # total, mean, median, max


def test_synthesis_cost_per_task_keeps_unknown_costs_unknown():
    led = _ledger([("t1", "synthesize", 0.01), ("t1", "validate", None), ("t2", "synthesize", 0.02)])
    tasks = pl.DataFrame({"task_id": ["t1", "t2", "t3"], "kind": ["code"] * 3, "status": ["kept", "kept", "rejected"],
                          "reject_reason": [None, None, "x"], "difficulty": ["easy", "hard", None],
                          "repairs": [0, 0, 0], "wall_seconds": [1.0, 2.0, 0.5], "sandbox_seconds": [0.1, 0.2, 0.0]})
    costs = {r["task_id"]: r for r in synthesis_costs(led, tasks).to_dicts()}
    assert costs["t1"]["usd"] is None and costs["t1"]["validate_usd"] is None and costs["t1"]["proposal_usd"] == 0.01
    assert costs["t2"]["usd"] == 0.02 and costs["t2"]["validate_usd"] == 0.0  # no validator call: nothing spent
    assert costs["t3"]["usd"] == 0.0 and costs["t3"]["calls"] == 0  # a task without calls cost nothing
    s = summarize(tasks, synthesis_costs(led, tasks))
    assert s["total_usd"] is None and s["usd_per_kept_task"]["mean"] is None and s["unpriced_calls"] == 1
    assert s["usd_per_kept_task_all_in"] is None


# ------------------------------------------------------------------ keys and endpoints

@pytest.mark.parametrize("url", ["http://10.1.2.3:8000/v1", "http://gpu-box:8000/v1", "http://[fd00::1]:80/v1"])
def test_a_key_is_not_sent_over_plain_http_to_another_host(url):
    settings = make_settings(url)
    with pytest.raises(InsecureKeyTransport, match="allow_key_over_http"):
        Gateway(settings, base_url=url, run_id="r", api_key="sk-live-secret-123456")


@pytest.mark.parametrize("url", ["https://api.example.com/v1", "http://127.0.0.1:8000/v1", "http://localhost:1/v1",
                                 "http://[::1]:8000/v1"])
def test_a_key_goes_over_https_or_to_loopback(url):
    Gateway(make_settings(url), base_url=url, run_id="r", api_key="sk-live-secret-123456").close()


def test_plain_http_with_a_key_only_when_explicitly_allowed_or_without_a_key():
    url = "http://10.1.2.3:8000/v1"
    Gateway(make_settings(url, gateway={"allow_key_over_http": True}), base_url=url, run_id="r",
            api_key="sk-live-secret-123456").close()
    Gateway(make_settings(url), base_url=url, run_id="r", api_key=None).close()  # no key, nothing to protect


def test_preflight_command_refuses_a_key_over_http(monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-secret-123456")
    code = cli_main(["preflight", "--base-url", "http://10.1.2.3:8000/v1"])
    err = capsys.readouterr().err
    assert code == 2 and "allow_key_over_http" in err and "sk-live-secret-123456" not in err


@pytest.mark.usefixtures("prefect_harness")
def test_evolve_flow_stops_before_any_work_when_the_endpoint_refuses_completions(tmp_path, server):
    server.preflight_action = "401"  # GET /models answers 200: only a real completion shows the refused key
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Explain topic {i} in detail."}) + "\n"
                             for i in range(3)))
    from evolforge.tasks.core.checks import PreflightError

    with pytest.raises(PreflightError, match="pre-flight failed") as ei:  # a user error now (one line, exit 2)
        evolve_flow(EvolveParams(seeds=str(seeds), out=str(tmp_path / "out"), rounds=1, base_url=server.base_url,
                                 overrides={"gateway": {"backoff_base_seconds": 0.0}}))
    assert "401" in str(ei.value) and server.posts() == [] and len(server.probes) == 1
    assert not (tmp_path / "out").exists()  # the folder the run created is removed: nothing of it stays


@pytest.mark.usefixtures("prefect_harness")
def test_synthesis_flow_checks_its_solver_model_before_any_work(tmp_path, server):
    server.unknown_models = {"no-such-solver"}
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(json.dumps({"id": "a", "instruction": "Write a function that adds two numbers.",
                                 "domain": "code"}) + "\n")
    from evolforge.tasks.core.checks import InputError

    # the endpoint's model list names no such model: stopped before any work (no USD budget, so no price check)
    with pytest.raises((GatewayError, InputError), match="no-such-solver") as ei:
        synthesize_flow(SynthesizeParams(seeds=str(seeds), out=str(tmp_path / "out"), base_url=server.base_url,
                                         overrides={"models": {"solver": "no-such-solver"},
                                                    "synthesis": {"budget_usd_per_task": 0}}))
    assert "models.solver" in str(ei.value) and server.posts() == []
    assert "no-such-solver" not in {p["model"] for p in server.probes}  # refused before it was probed
