"""Local rewards wired into a modules run (issue 39): every stored module row carries its local reward beside its
contribution, with the parts it is recomputed from; a module whose stated arithmetic is wrong gets 0 although the
judge's contribution says it helped. A real batch through the scripted OpenAI-compatible server."""

from __future__ import annotations

import json

import pytest

from evolforge.storage import module_sets as store
from evolforge.tasks.modules.batch import assemble, run_modules_batch
from evolforge.tasks.modules.local_reward import recompute
from evolforge.tasks.modules.report import summary_markdown
from evolforge.testing import scripted_server
from evolforge.testing.scripted_server import ScriptedServer
from evolforge.testing.settings import make_settings


@pytest.fixture
def server():
    with ScriptedServer(hang_seconds=3.0, nodelay=True) as srv:
        yield srv


def run(server, tmp_path, weight):
    settings = make_settings(server.base_url, modules={"local_reward_weight": weight, "batch_size": 4},
                             gateway={"backoff_base_seconds": 0.0, "timeout_seconds": 5.0, "concurrency": 32})
    src = tmp_path / "q.csv"
    src.write_text("question\nWhat is 3 times 4?\nWhat is 40 plus 2?\n")
    lay = store.ModulesLayout(tmp_path / f"out-{weight}").ensure()
    store.build_input(src, lay.input, 4)
    run_modules_batch(lay.root, 0, settings, server.base_url, "r")
    summary = assemble(lay.root, settings)
    return store.read_items(lay.items).to_dicts(), summary


def test_wrong_arithmetic_gets_zero_local_reward_despite_positive_contribution(server, tmp_path, monkeypatch):
    # the parse module (steps) states a wrong product, compute (result) a right sum; the judge does not check them
    monkeypatch.setitem(scripted_server.MODULE_CONTENT, "steps", ["Multiply: 3 * 4 = 13", "Then 13 + 0 = 13"])
    monkeypatch.setitem(scripted_server.MODULE_CONTENT, "result", "40 + 2 = 42")
    items, summary = run(server, tmp_path, weight=1.0)
    assert [it["status"] for it in items] == ["ok", "ok"]
    for it in items:
        mods = {m["id"]: m for m in it["modules"]}
        parse, compute = mods["parse"], mods["compute"]
        assert parse["contribution"] > 0 and parse["local_reward"] == 0.0
        assert parse["local_parts"]["own"] == 0.0 and "3 * 4 = 13" in parse["local_parts"]["own_reason"]
        assert compute["local_parts"]["own"] == 1.0 and compute["local_reward"] == 1.0
        assert mods["semantic"]["local_parts"]["own"] is None and mods["semantic"]["local_reward"] == 1.0
        assert mods["verify"]["local_parts"]["own_reason"] == "ground truth unknown"
    stats = {s["id"]: s for s in summary["modules"]}
    assert stats["parse"]["local_zero_positive_contribution"] == 2 and stats["parse"]["own_failed"] == 2
    assert stats["compute"]["mean_local_reward"] == 1.0
    assert summary["local_reward"]["zero_with_positive_contribution"] == 2
    assert summary["local_reward"]["weight"] == 1.0
    md = summary_markdown(summary)
    assert "mean local reward" in md and "2 got 0 despite a positive contribution" in md


@pytest.mark.parametrize("weight", [0.5, 0.3])
def test_stored_local_reward_equals_a_recompute_from_its_stored_parts(server, tmp_path, monkeypatch, weight):
    monkeypatch.setitem(scripted_server.MODULE_CONTENT, "steps", ["Multiply: 3 * 4 = 13"])
    monkeypatch.setitem(scripted_server.MODULE_CONTENT, "result", "40 + 2 = 42")
    server.module_fault_rate = 0.5  # some outputs stay invalid: schema 0, reward 0
    items, _ = run(server, tmp_path, weight)
    rows = [m for it in items for m in it["modules"]]
    assert rows and all(m["local_parts"]["weight"] == weight for m in rows)
    for m in rows:
        assert m["local_reward"] == recompute(m["local_parts"], m["local_parts"]["weight"])
        assert (m["local_parts"]["schema"] == 1.0) == (m["status"] == "ok")
        if m["status"] != "ok":
            assert m["local_reward"] == 0.0 and m["local_parts"]["schema_reason"] == m["reason"]
    parse = [m for m in rows if m["id"] == "parse" and m["status"] == "ok"]
    assert all(m["local_reward"] == pytest.approx(1 - weight) for m in parse)
    stored = {json.dumps(m["local_parts"], sort_keys=True) for m in rows}
    assert len(stored) > 1
