"""Module-DAG reasoning (DeCoRL): graph checks at load, scheduling per dependency, schema re-asks, truncation,
contributions, resume, PRM rows, the flow on a real Prefect server, the CLI, the reward-stage plug."""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.config.settings import ConfigError, load_settings
from evolforge.storage import module_sets as store
from evolforge.storage.journal import CallJournal
from evolforge.storage.reward_sets import PRM_COLUMNS
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.modules.batch import run_modules_batch
from evolforge.tasks.modules.graph import ModuleGraph
from evolforge.tasks.modules.run import solve_item, step_row
from evolforge.tasks.reward.prm import label_answer
from evolforge.testing.scripted_server import ScriptedServer
from evolforge.testing.settings import make_settings

QUESTION = {"id": "q1", "question": "What is 40 plus 2?"}
NON_EXIT = ["parse", "semantic", "entity", "factcheck", "compute", "verify", "style", "quality"]


@pytest.fixture
def fast_server():
    """The scripted server without the ~40 ms Nagle / delayed-ACK stall per call (timings mean something)."""
    with ScriptedServer(hang_seconds=3.0, nodelay=True) as srv:
        yield srv


def gateway(server, **modules):
    settings = make_settings(server.base_url, modules=modules,
                             gateway={"backoff_base_seconds": 0.0, "timeout_seconds": 5.0, "concurrency": 32})
    return Gateway(settings, base_url=server.base_url, run_id="r"), settings


def recording(gw):
    """Every (messages, kwargs) the gateway is asked for, in order."""
    calls, chat = [], gw.chat

    def rec(stage, messages, **kw):
        calls.append((stage, messages, kw))
        return chat(stage, messages, **kw)

    gw.chat = rec
    return calls


def by_id(item):
    return {m["id"]: m for m in item["modules"]}


# ---------------------------------------------------------------------------------------- graph at load
def module(id, deps=(), output="steps", exit=False):
    return {"id": id, "role": f"the {id} role", "output": "final" if exit else output, "dependencies": list(deps),
            "exit": exit}


@pytest.mark.parametrize("graph,problem,names", [
    ([module("a", ["c"]), module("b", ["a"]), module("c", ["b"]), module("z", ["c"], exit=True)],
     "dependency cycle", ["a -> c -> b -> a"]),
    ([module("a", ["a"]), module("z", ["a"], exit=True)], "dependency cycle", ["a -> a"]),
    ([module("a", ["ghost"]), module("z", ["a"], exit=True)], "unknown dependencies", ["a -> ghost"]),
    ([module("a"), module("b", ["a"])], "no exit module", ["b"]),
    ([module("a"), module("y", ["a"], exit=True), module("z", ["a"], exit=True)], "multiple exit modules", ["y, z"]),
    ([module("a"), module("z", ["a"], exit=True), module("b", ["z"])], "is a dependency of", ["z", "b"]),
    ([module("a"), module("a"), module("z", ["a"], exit=True)], "duplicate module ids", ["a"]),
])
def test_graph_problems_fail_at_load_naming_the_modules(graph, problem, names):
    with pytest.raises(ConfigError) as ei:
        load_settings(overrides={"modules": {"graph": graph}}, environ={})
    msg = str(ei.value)
    assert "modules" in msg and problem in msg and all(n in msg for n in names), msg


def test_default_graph_is_the_published_nine():
    s = load_settings(environ={})
    g = ModuleGraph.from_settings(s.modules)
    deps = {m: g.deps(m) for m in g.order}
    assert deps == {"parse": [], "semantic": [], "style": [], "quality": [], "entity": ["semantic"],
                    "compute": ["parse"], "factcheck": ["entity"], "verify": ["compute", "factcheck"],
                    "integrate": ["verify", "style", "quality"]}
    assert g.exit == "integrate" and list(g.non_exit) == ["parse", "semantic", "style", "quality", "entity",
                                                          "compute", "factcheck", "verify"]
    assert g.chain_length == 5 and g.recompute_calls == 17  # semantic-entity-factcheck-verify-integrate
    assert len({m.output for m in s.modules.graph}) == 7  # every output type is used


def test_graph_from_a_file(tmp_path):
    toml = tmp_path / "g.toml"
    toml.write_text('[[modules]]\nid = "think"\nrole = "think"\noutput = "steps"\n\n'
                    '[[modules]]\nid = "answer"\nrole = "answer"\noutput = "final"\ndependencies = ["think"]\n'
                    'exit = true\nmodel = "answer"\n')
    s = load_settings(overrides={"modules": {"file": str(toml)}}, environ={})
    assert [m.id for m in s.modules.graph] == ["think", "answer"] and s.modules.graph_source == str(toml)
    again = type(s).model_validate_json(s.model_dump_json())  # how a batch task receives them: no file read
    assert [m.id for m in again.modules.graph] == ["think", "answer"] and again.modules.file == ""
    js = tmp_path / "g.json"
    js.write_text(json.dumps([module("a"), module("b", ["a"], exit=True), module("c", ["b"])]))
    with pytest.raises(ConfigError, match="exit module b is a dependency of c"):
        load_settings(overrides={"modules": {"file": str(js)}}, environ={})
    with pytest.raises(ConfigError, match="not both"):
        load_settings(overrides={"modules": {"file": str(toml), "graph": [module("z", exit=True)]}}, environ={})
    with pytest.raises(ConfigError, match="not found"):
        load_settings(overrides={"modules": {"file": str(tmp_path / "nope.json")}}, environ={})


# ------------------------------------------------------------------------------------------- scheduling
def test_a_module_starts_when_its_own_dependencies_finish(fast_server):
    gw, settings = gateway(fast_server)
    solve_item({"id": "warm", "question": "Warm up?"}, gw, settings)  # connections, price lookups: once per process
    fast_server.latency = 0.05
    fast_server.module_latency = {"parse": 0.3, "entity": 0.3}  # one slow module in two different levels
    item = solve_item(QUESTION, gw, settings)
    m = by_id(item)
    assert item["status"] == "ok"
    # entity starts when semantic is done, not when the slow parse (same level as semantic) is
    assert m["entity"]["started_s"] >= m["semantic"]["finished_s"] - 0.01
    assert m["entity"]["started_s"] < m["parse"]["finished_s"] - 0.15
    assert m["compute"]["started_s"] >= m["parse"]["finished_s"] - 0.01
    for name, mod in m.items():  # and nothing starts before its dependencies are done
        assert all(mod["started_s"] >= m[d]["finished_s"] - 0.01 for d in settings.modules.graph[[
            x.id for x in settings.modules.graph].index(name)].dependencies)
    # longest chain: semantic .05 + entity .35 + factcheck + verify + integrate = 0.55 s; lock-step levels: 0.85 s
    timing = {k: item[k] for k in ("forward_s", "chain_s", "levels_s")}
    assert item["forward_s"] <= item["chain_s"] + 0.2 and item["levels_s"] > item["forward_s"] + 0.1, timing


# ------------------------------------------------------------------------------- schema re-asks, truncation
def test_schema_faults_are_reasked_with_the_validation_error(fast_server):
    fast_server.module_fault_rate = 1.0  # every module reply is faulty
    gw, settings = gateway(fast_server)
    calls = recording(gw)
    item = solve_item(QUESTION, gw, settings)
    assert item["status"] == "failed" and "exit module integrate invalid" in item["reason"]
    assert item["judge_calls"] == 0 and item["module_calls"] == 9 * 3  # first call + 2 re-asks each
    for mod in item["modules"]:
        assert mod["status"] == "invalid" and mod["reasks"] == 2 and len(mod["errors"]) == 3
        assert mod["reason"].startswith("no valid output after 2 re-asks: ") and mod["output"] is None
    parse = [msgs for stage, msgs, kw in calls if kw["task_id"] == "mod-q1-parse"]
    assert [len(msgs) for msgs in parse] == [1, 3, 5]  # the bad reply stays in the conversation
    first_error = by_id(item)["parse"]["errors"][0]
    assert f"Your reply was not valid: {first_error}" in parse[1][-1]["content"]
    # dependants saw the failure with its reason in place of the output
    compute = next(msgs for stage, msgs, kw in calls if kw["task_id"] == "mod-q1-compute")
    assert "[parse] [module parse failed: no valid output after 2 re-asks" in compute[0]["content"]


def test_some_schema_faults_most_outputs_valid_within_two_reasks(fast_server):
    fast_server.module_fault_rate = 0.3
    gw, settings = gateway(fast_server)
    items = [solve_item({"id": f"q{i}", "question": f"What is {i} plus 2?"}, gw, settings) for i in range(4)]
    mods = [m for it in items for m in it["modules"]]
    assert any(m["reasks"] for m in mods) and sum(m["status"] == "ok" for m in mods) >= 0.9 * len(mods)
    for m in mods:
        assert m["calls"] == 1 + m["reasks"] and len(m["errors"]) == m["reasks"] + (m["status"] != "ok")
        assert (m["status"] == "ok") == (m["reason"] is None)


def test_truncated_replies_are_asked_again_with_a_larger_budget(fast_server):
    fast_server.module_truncate_below = 200
    gw, settings = gateway(fast_server, max_tokens=64)
    calls = recording(gw)
    item = solve_item(QUESTION, gw, settings)
    assert item["status"] == "ok"
    for mod in item["modules"]:
        assert (mod["status"], mod["truncations"], mod["calls"], mod["max_tokens"]) == ("ok", 2, 3, 256)
        assert "finish_reason length" in mod["errors"][0] and mod["reasks"] == 0
    budgets = [kw["max_tokens"] for stage, msgs, kw in calls if kw["task_id"] == "mod-q1-parse"]
    assert budgets == [64, 128, 256]
    gw2, capped = gateway(fast_server, max_tokens=64, max_tokens_cap=128)
    item = solve_item(QUESTION, gw2, capped)
    parse = by_id(item)["parse"]
    assert parse["status"] == "truncated" and "cannot grow" in parse["reason"] and "max_tokens_cap 128" in parse["reason"]
    assert item["status"] == "failed"


# --------------------------------------------------------------------------------------- contributions
def test_contributions_find_the_corrupted_module_with_1_plus_k_judge_calls(fast_server, tmp_path):
    fast_server.corrupt_module = "compute"
    gw, settings = gateway(fast_server)
    journal = CallJournal(tmp_path / "journal.jsonl")
    item = solve_item(QUESTION, gw, settings, journal)
    assert item["status"] == "ok" and item["judge_calls"] == 1 + 8 and item["module_calls"] == 9
    assert len(fast_server.posts()) == 9 + 9
    contrib = {m["id"]: m["contribution"] for m in item["modules"]}
    assert contrib.pop("integrate") is None
    assert min(contrib, key=contrib.get) == "compute" and contrib["compute"] < 0  # removing it helps
    assert all(c > 0 for k, c in contrib.items() if k != "compute")
    # mask: the judge saw the same final answer over a trace where only compute's line changed
    assert item["answer"].startswith("Final answer: The answer is 42.\n\nModule trace:\n[parse] (steps)")
    journal.close()
    again = solve_item(QUESTION, gw, settings, CallJournal(tmp_path / "journal.jsonl"))
    assert len(fast_server.posts()) == 18 and again["judge_full"] == item["judge_full"]  # all replayed

    row = step_row(item, margin=0.0)
    assert row["status"] == "ok" and row["method"] == "modules" and len(row["completions"]) == 8
    assert row["labels"] == [m != "compute" for m in ModuleGraph.from_settings(settings.modules).non_exit]
    assert row["completions"][5] == "[compute] (result) CORRUPTED 41" and row["raw_scores"][5] == -4.0
    assert row["scores"][5] == pytest.approx(0.3) and row["calls"] == 18


def test_recompute_reruns_the_dependants(fast_server):
    fast_server.corrupt_module = "compute"
    gw, settings = gateway(fast_server, ablation="recompute", aggregation="concat")
    calls = recording(gw)
    item = solve_item(QUESTION, gw, settings)
    # 9 modules + 17 re-runs of descendants (parse 3, semantic 4, entity 3, factcheck 2, compute 2, verify 1,
    # style 1, quality 1) + 1 + 8 judge calls
    assert item["module_calls"] == 9 + 17 and item["judge_calls"] == 9 and len(fast_server.posts()) == 35
    reruns = [kw["task_id"] for stage, msgs, kw in calls if stage == "modules" and "-without-compute" in kw["task_id"]]
    assert sorted(reruns) == ["mod-q1-integrate-without-compute", "mod-q1-verify-without-compute"]
    verify = next(msgs for stage, msgs, kw in calls if kw["task_id"] == "mod-q1-verify-without-compute")
    assert "[compute] [module compute removed]" in verify[0]["content"]
    contrib = {m["id"]: m["contribution"] for m in item["modules"] if m["contribution"] is not None}
    assert min(contrib, key=contrib.get) == "compute"
    assert item["answer"].splitlines()[-1] == "[integrate] (final) The answer is 42."  # concat: the exit's last


def test_unscorable_judge_reply_is_kept_with_its_reason(fast_server):
    gw, settings = gateway(fast_server)
    chat = gw.chat

    def judge_says_nothing(stage, messages, **kw):
        res = chat(stage, messages, **kw)
        if kw.get("purpose") == "judge-without-style":
            res.text = '{"score": "excellent"}'
        return res

    gw.chat = judge_says_nothing
    item = solve_item(QUESTION, gw, settings)
    assert item["status"] == "judge_failed" and "judge-without-style: no score" in item["reason"]
    assert by_id(item)["style"]["contribution"] is None and by_id(item)["parse"]["contribution"] == 1.0
    assert step_row(item, 0.0)["status"] == "label_failed"


# ----------------------------------------------------------------------------------- batch, resume, plug
def test_batch_resume_sends_no_finished_call_again(fast_server, tmp_path):
    gw, settings = gateway(fast_server, batch_size=2)
    src = tmp_path / "q.csv"
    src.write_text("question,topic\nWhat is 1 plus 1?,math\nWhat is 2 plus 2?,math\nName a prime.,math\n")
    lay = store.ModulesLayout(tmp_path / "out").ensure()
    assert store.build_input(src, lay.input, 2) == 3 and store.batch_count(lay) == 2
    assert store.read_batch(lay, 1) == [{"id": "q00002", "question": "Name a prime."}]
    stats = run_modules_batch(lay.root, 0, settings, fast_server.base_url, "r1")
    assert stats["by_status"] == {"ok": 2} and len(fast_server.posts()) == 2 * 18
    assert run_modules_batch(lay.root, 0, settings, fast_server.base_url, "r1")["skipped"]
    lay.questions.part(0).unlink()  # a batch killed after its calls, before its part: every call replays
    again = run_modules_batch(lay.root, 0, settings, fast_server.base_url, "r1")
    assert len(fast_server.posts()) == 2 * 18 and again["replayed_calls"] == 2 * 18


def test_reward_stage_plug_labels_steps_by_module_contribution(fast_server):
    fast_server.corrupt_module = "factcheck"
    settings = make_settings(fast_server.base_url, reward={"step_label_method": "modules"},
                             gateway={"backoff_base_seconds": 0.0, "timeout_seconds": 5.0})
    gw = Gateway(settings, base_url=fast_server.base_url, run_id="r")
    out = label_answer({"id": "a1", "instruction": "What is 40 plus 2?", "answer": None, "domain": "math",
                        "reference_answer": None}, gw, settings)
    assert out["status"] == "ok" and out["method"] == "modules" and out["calls"] == 18
    assert len(out["completions"]) == 8 and out["labels"].count(False) == 1
    assert out["completions"][out["labels"].index(False)].startswith("[factcheck]")
    assert len(fast_server.posts()) == gw.stats.calls == 18
    # the existing DeCoRL step ablation is untouched
    decorl = make_settings(fast_server.base_url, reward={"step_label_method": "decorl"})
    out = label_answer({"id": "a2", "instruction": "What is 40 plus 2?", "domain": "math", "reference_answer": None,
                        "answer": "Step 1: Add 40 and 2.\nStep 2: So 42.\nThe answer is: 42"},
                       Gateway(decorl, base_url=fast_server.base_url, run_id="r"), decorl)
    assert out["method"] == "decorl" and out["calls"] == 3


# ------------------------------------------------------------------------------------ flow on Prefect, CLI
@pytest.mark.usefixtures("prefect_harness")
def test_flow_and_cli_on_a_prefect_server(fast_server, tmp_path):
    from evolforge.cli import main
    from evolforge.cli.status import stage_status
    from evolforge.flows.modules import ModulesParams, modules_flow

    fast_server.corrupt_module = "compute"
    src = tmp_path / "questions.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"m{i}", "question": f"What is {i} times 3?"}) for i in range(3)) + "\n")
    overrides = {"modules": {"batch_size": 2, "concurrency": 2},
                 "gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 5.0}}
    params = ModulesParams(input=str(src), out=str(tmp_path / "out"), base_url=fast_server.base_url,
                           overrides=overrides)
    summary = modules_flow(params)
    lay = store.ModulesLayout(tmp_path / "out")
    assert summary["by_status"] == {"ok": 3} and summary["batches"]["total"] == 2
    assert summary["calls"] == {"module": 27, "judge": 27, "judge_per_judged_item": 9.0}
    assert len(fast_server.posts()) == 54
    compute = next(m for m in summary["modules"] if m["id"] == "compute")
    assert compute["lowest_contribution_items"] == 3 and compute["mean_contribution"] == -4.0
    assert "flowchart TD" in summary["mermaid"] and "compute --> verify" in summary["mermaid"]
    assert "contribution -4.00" in lay.graph_md.read_text()
    items = pl.read_parquet(lay.items)
    assert items.height == 3 and items["modules"].list.len().to_list() == [9, 9, 9]
    prm = pl.read_parquet(lay.prm_steps)
    assert prm.columns == PRM_COLUMNS and prm.height == 3 and prm["completions"].list.len().to_list() == [8, 8, 8]
    assert set(prm["method"]) == {"modules"} and prm["labels"].to_list()[0].count(False) == 1
    assert json.loads(lay.summary.read_text())["prm"]["rows"] == 3
    # the stage runner's marker, and `evolforge status` reading the folder through it
    marker = json.loads(lay.marker.read_text())
    assert marker["kind"] == "modules" and marker["finished_at"]
    assert marker["counts"] == {"items": 3, "by_status": {"ok": 3}, "prm_rows": 3}
    st = stage_status(lay.root)
    assert st["kind"] == "modules" and st["finished"] and st["cost"]["calls"] == summary["cost"]["attempts"] > 54
    assert [(u["unit"], u["batches"], u["done"], u["records_done"], u["accepted"]) for u in st["units"]] == [
        ("questions", 2, 2, 3, 3)]

    # rerun over the folder: nothing is sent (the pre-flight probes are kept apart by the server)
    again = modules_flow(params)
    assert len(fast_server.posts()) == 54 and again["batches"]["skipped"] == 2

    # the CLI runs the same flow
    rc = main(["modules", "--input", str(src), "--out", str(tmp_path / "cli"), "--base-url", fast_server.base_url,
               "--max-items", "1", "--ablation", "recompute"])
    assert rc == 0 and len(fast_server.posts()) == 54 + 35
    assert pl.read_parquet(store.ModulesLayout(tmp_path / "cli").items)["ablation"].to_list() == ["recompute"]


# ------------------------------------------------------------------------------------ the embedded model
@pytest.mark.slow
@pytest.mark.embedded
@pytest.mark.usefixtures("prefect_harness")
def test_two_questions_end_to_end_on_the_embedded_model(tmp_path):
    from evolforge.flows.modules import ModulesParams, modules_flow

    src = tmp_path / "q.jsonl"
    src.write_text("\n".join(json.dumps({"question": q}) for q in [
        "A farmer has 12 cows and buys 5 more. How many cows does he have?",
        "Tom reads 10 pages a day. How many pages does he read in a week?"]) + "\n")
    summary = modules_flow(ModulesParams(input=str(src), out=str(tmp_path / "out"), overrides={
        "modules": {"max_reasks": 1, "max_tokens": 128}, "embedded": {"max_new_tokens": 128}}))
    lay = store.ModulesLayout(tmp_path / "out")
    for path in (lay.items, lay.prm_steps, lay.prm_rejected, lay.summary, lay.graph_md):
        assert path.exists()
    items = pl.read_parquet(lay.items)
    assert items.height == 2 and summary["items"] == 2
    for it in items.to_dicts():
        assert it["status"] in {"ok", "failed", "judge_failed"} and len(it["modules"]) == 9
        assert (it["status"] == "ok") == (it["reason"] is None)  # a failure keeps its reason
        for m in it["modules"]:
            assert m["calls"] >= 1 and (m["status"] == "ok") == (m["reason"] is None)
            assert len(m["errors"]) >= m["reasks"] + m["truncations"]
    # the calls ask for each module's schema (response_format json_schema): llama-server's grammar holds the 135M
    # model to it (0 of 18 outputs were valid with json_object; 53 of 54 in bench_structured_outputs)
    valid = sum(m["status"] == "ok" for it in items.to_dicts() for m in it["modules"])
    assert valid >= 15, f"{valid} of 18 module outputs valid"
    assert summary["endpoint"].startswith("embedded") and summary["cost"]["cost_usd"] == 0.0
