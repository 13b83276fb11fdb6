"""The gateway against a scripted OpenAI-compatible server on loopback: retries, errors, ledger, JSON."""

from __future__ import annotations

import socket

import pytest

from evolforge.storage.journal import CallJournal
from evolforge.storage.ledger import LedgerWriter, read_ledger, totals
from evolforge.tasks.core.gateway import EndpointDown, Gateway, GatewayError, mask_secret
from evolforge.tasks.core.json_parse import JSONParseFailure, extract_json
from evolforge.testing.settings import make_settings

MSG = [{"role": "user", "content": "Say hi"}]


def make_gateway(server, tmp_path, sleeps=None, api_key="sk-test-key-123456789", **gw):
    cfg = {"max_retries": 3, "backoff_base_seconds": 0.01, "backoff_max_seconds": 0.05, "timeout_seconds": 1.0}
    cfg.update(gw)
    settings = make_settings(server.base_url, gateway=cfg)
    ledger = LedgerWriter(tmp_path / "ledger", "run-test")
    recorder = sleeps if sleeps is not None else []
    return Gateway(settings, base_url=server.base_url, run_id="run-test", ledger=ledger, api_key=api_key,
                   sleep=recorder.append)


def ledger_rows(tmp_path):
    return read_ledger(tmp_path).sort("ts")


def test_429_then_success_is_retried_and_ledgered(server, tmp_path):
    server.script("429", "ok")
    gw = make_gateway(server, tmp_path)
    res = gw.chat("evolve", MSG, task_id="t1")
    assert res.attempts == 2 and res.text
    rows = ledger_rows(tmp_path)
    assert rows["outcome"].to_list() == ["http_429", "ok"]
    assert rows["attempt"].to_list() == [1, 2]
    assert len(server.posts()) == rows.height == 2


def test_retry_after_header_is_honoured(server, tmp_path):
    sleeps: list[float] = []
    server.script("429ra:7", "ok")
    gw = make_gateway(server, tmp_path, sleeps=sleeps, backoff_max_seconds=5.0)
    gw.chat("evolve", MSG, task_id="t1")
    assert sleeps == [7.0]


def test_backoff_is_exponential_with_jitter(server, tmp_path):
    sleeps: list[float] = []
    server.script("503", "503", "503", "ok")
    gw = make_gateway(server, tmp_path, sleeps=sleeps, backoff_base_seconds=1.0, backoff_max_seconds=100.0)
    gw.chat("evolve", MSG, task_id="t1")
    assert len(sleeps) == 3
    for i, s in enumerate(sleeps):
        assert 2**i / 2 <= s <= 2**i


def test_500_storm_exhausts_retries_with_clear_error(server, tmp_path):
    server.script(*["500"] * 10)
    gw = make_gateway(server, tmp_path, max_retries=3)
    with pytest.raises(GatewayError) as ei:
        gw.chat("judge", MSG, task_id="t1")
    assert ei.value.retryable and "4 attempts" in str(ei.value) and server.base_url in str(ei.value)
    assert len(server.posts()) == 4 == ledger_rows(tmp_path).height
    assert set(ledger_rows(tmp_path)["outcome"]) == {"http_500"}


def test_timeout_is_retried(server, tmp_path):
    server.script("hang", "ok")
    gw = make_gateway(server, tmp_path, timeout_seconds=0.5)
    res = gw.chat("evolve", MSG, task_id="t1")
    assert res.attempts == 2
    assert ledger_rows(tmp_path)["outcome"].to_list() == ["timeout", "ok"]


@pytest.mark.parametrize("fault,outcome", [("malformed", "malformed_response"), ("truncated", "connection_error"),
                                           ("close", "connection_error")])
def test_broken_bodies_are_retried(server, tmp_path, fault, outcome):
    server.script(fault, "ok")
    gw = make_gateway(server, tmp_path)
    res = gw.chat("evolve", MSG, task_id="t1")
    assert res.attempts == 2 and res.text
    assert ledger_rows(tmp_path)["outcome"].to_list() == [outcome, "ok"]


@pytest.mark.parametrize("status,hint", [(401, "EVOLFORGE_API_KEY"), (404, "no model"), (400, "rejected the request")])
def test_client_errors_fail_at_once_with_a_fix(server, tmp_path, status, hint):
    server.script(str(status))
    gw = make_gateway(server, tmp_path)
    with pytest.raises(GatewayError) as ei:
        gw.chat("evolve", MSG, task_id="t1", model="my-model")
    msg = str(ei.value)
    assert f"HTTP {status}" in msg and server.base_url in msg and "my-model" in msg and hint in msg
    assert not ei.value.retryable
    assert len(server.posts()) == 1 == ledger_rows(tmp_path).height


def test_endpoint_down_fails_fast(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    settings = make_settings(url, gateway={"max_retries": 1, "backoff_base_seconds": 0.0, "fail_fast_after": 2})
    gw = Gateway(settings, base_url=url, run_id="r", sleep=lambda s: None)
    with pytest.raises(EndpointDown):
        gw.check_reachable()
    for _ in range(2):
        with pytest.raises(GatewayError):
            gw.chat("evolve", MSG, task_id="t")
    with pytest.raises(EndpointDown) as ei:
        gw.chat("evolve", MSG, task_id="t")
    assert "is down" in str(ei.value) and "resume" in str(ei.value)


def test_journal_replays_finished_calls(server, tmp_path):
    gw = make_gateway(server, tmp_path)
    with CallJournal(tmp_path / "j.jsonl") as j:
        first = gw.chat("evolve", MSG, task_id="t1", journal=j)
    # a new process: new gateway, journal reloaded from disk
    gw2 = make_gateway(server, tmp_path)
    with CallJournal(tmp_path / "j.jsonl") as j:
        again = gw2.chat("evolve", MSG, task_id="t1", journal=j)
        other = gw2.chat("evolve", MSG, task_id="t2", journal=j)
    assert again.replayed and again.text == first.text and not other.replayed
    assert len(server.posts()) == 2


def test_journal_survives_a_torn_last_line(tmp_path):
    p = tmp_path / "j.jsonl"
    with CallJournal(p) as j:
        j.put("a", {"x": 1})
    with open(p, "ab") as fh:
        fh.write(b'{"key": "b", "val')  # killed mid-write
    with CallJournal(p) as j:
        assert j.get("a") == {"x": 1} and j.get("b") is None and j.torn_lines == 1
        j.put("c", {"x": 3})
    with CallJournal(p) as j:
        assert j.get("c") == {"x": 3}


def test_api_key_never_reaches_ledger_or_journal(server, tmp_path):
    key = "sk-live-SECRET-abcdef1234567890"
    server.script("401")
    gw = make_gateway(server, tmp_path, api_key=key)
    with pytest.raises(GatewayError) as ei:
        gw.chat("evolve", MSG, task_id="t1")
    with CallJournal(tmp_path / "j.jsonl") as j:
        gw.chat("evolve", MSG, task_id="t2", journal=j)
    assert server.posts()[0]["auth"] == f"Bearer {key}"  # it was sent to the endpoint...
    blobs = "".join(p.read_text() for p in tmp_path.rglob("*.jsonl"))
    assert key not in blobs and key not in str(ei.value)  # ...and nowhere else
    assert key not in gw.describe() and mask_secret(key).startswith("sk-")


def test_ledger_totals_per_stage_and_task(server, tmp_path):
    server.script("429")
    gw = make_gateway(server, tmp_path)
    gw.chat("evolve", MSG, task_id="a")
    gw.chat("judge", MSG, task_id="a")
    gw.chat("judge", MSG, task_id="b")
    df = read_ledger(tmp_path)
    by_stage = {r["stage"]: r for r in totals(df, ["stage"]).to_dicts()}
    assert by_stage["evolve"]["calls"] == 2 and by_stage["evolve"]["failed_attempts"] == 1
    assert by_stage["judge"]["calls"] == 2
    by_task = {r["task_id"]: r["calls"] for r in totals(df, ["task_id"]).to_dicts()}
    assert by_task == {"a": 3, "b": 1}
    # unknown model: cost is null (never a silent 0), and the total says so
    assert df["cost_usd"].null_count() == df.height
    assert by_stage["judge"]["cost_usd"] is None and by_stage["judge"]["unpriced_calls"] == 2


def test_prices_from_database_override_and_embedded(server, tmp_path):
    settings = make_settings(server.base_url, pricing={"overrides": {"my-llama": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}})
    ledger = LedgerWriter(tmp_path / "ledger", "r")
    gw = Gateway(settings, base_url=server.base_url, run_id="r", ledger=ledger, embedded_models={"tiny-local"})
    gw.chat("evolve", MSG, task_id="t", model="gpt-4o-mini")
    gw.chat("evolve", MSG, task_id="t", model="my-llama")
    gw.chat("evolve", MSG, task_id="t", model="tiny-local")
    rows = {r["model"]: r for r in read_ledger(tmp_path).to_dicts()}
    g = rows["gpt-4o-mini"]
    assert g["price_source"] == "genai-prices"
    assert g["cost_usd"] == pytest.approx(g["prompt_tokens"] * 0.15e-6 + g["completion_tokens"] * 0.6e-6)
    m = rows["my-llama"]
    assert m["price_source"] == "config override"
    assert m["cost_usd"] == pytest.approx((m["prompt_tokens"] * 1.0 + m["completion_tokens"] * 2.0) / 1e6)
    assert rows["tiny-local"]["cost_usd"] == 0.0 and rows["tiny-local"]["price_source"] == "embedded model (free)"


def test_json_mode_recovers_wrapped_json_and_counts_failures(server, tmp_path):
    gw = make_gateway(server, tmp_path)
    parsed, _ = gw.chat_json("judge", MSG, task_id="t")
    assert parsed["ok"] is True  # the scripted server wraps JSON in a ```json fence
    server.script("text:I cannot produce JSON today.")
    parsed, res = gw.chat_json("judge", MSG, task_id="t2")
    assert parsed is None and gw.stats.json_failures == 1
    assert server.posts()[0]["key"]  # both calls reached the server


@pytest.mark.parametrize("text,expected", [
    ('{"a": 1}', {"a": 1}),
    ('```json\n{"a": [1, 2]}\n```', {"a": [1, 2]}),
    ('Sure! Here it is: {"rank": [2, 1], "why": "a } in a string"} Hope it helps.', {"rank": [2, 1], "why": "a } in a string"}),
    ('{"a": 1,}', {"a": 1}),
    ('noise [1, 2, 3] tail', [1, 2, 3]),
])
def test_extract_json_tolerant(text, expected):
    assert extract_json(text) == expected


@pytest.mark.parametrize("text", ["", "no json here", "{broken: ", "```json\n{\"a\": \n```"])
def test_extract_json_failure_is_explicit(text):
    with pytest.raises(JSONParseFailure):
        extract_json(text)


def test_embedded_model_gets_at_most_its_concurrent_calls(server, tmp_path):
    """llama.cpp serves one call at a time: the gateway caps calls in flight to embedded.max_concurrent_calls."""
    from concurrent.futures import ThreadPoolExecutor

    server.latency = 0.3
    settings = make_settings(server.base_url, gateway={"concurrency": 8, "timeout_seconds": 10.0},
                             embedded={"max_concurrent_calls": 2})
    gw = Gateway(settings, base_url=server.base_url, run_id="r", ledger=LedgerWriter(tmp_path / "ledger", "r"),
                 embedded_models={"tiny-local"})
    assert gw.max_in_flight == 2
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: gw.chat("evolve", [{"role": "user", "content": f"hi {i}"}], task_id=str(i),
                                        model="tiny-local"), range(6)))
    starts = sorted(e["t"] for e in server.posts())
    assert len(starts) == 6
    # each call holds its slot for >= 0.3 s, so no three calls can start within 0.25 s of each other
    assert max(sum(1 for t in starts if s <= t < s + 0.25) for s in starts) <= 2
    remote = Gateway(settings, base_url=server.base_url, run_id="r2", ledger=LedgerWriter(tmp_path / "l2", "r2"))
    assert remote.max_in_flight == 8  # a real endpoint keeps gateway.concurrency
