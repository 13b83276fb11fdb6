"""Dataset cards of the PPO, trajectories and module-DAG stages: each flow, run on its smallest fixture, ends with
a README.md whose YAML header lists every table as a config with its features and sizes, and
`datasets.load_dataset(folder, config)` loads each with as many rows as its file. No secret reaches a card."""

from __future__ import annotations

import json
import time

import httpx
import polars as pl
import pytest

from evolforge.storage.cards import read_card
from evolforge.testing.lazy import lazy_module
from evolforge.testing.scripted_server import ScriptedServer

datasets = lazy_module("datasets")  # imported by the tests that load a dataset, not at collection


def load_dataset(*args, **kwargs):
    return datasets.load_dataset(*args, **kwargs)

openai = lazy_module("openai")

pytestmark = pytest.mark.usefixtures("prefect_harness")
SECRET = "sk-evolforge-card-secret-0123456789"
FAST = {"gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 5.0}}


def assert_card(folder, configs: dict[str, dict[str, int]]) -> tuple[dict, str]:
    """The card lists exactly `configs` (name -> {split: rows}); each config's features are its file's columns,
    its sizes the files' row counts, and it loads with datasets split by split."""
    header, body = read_card(folder)
    assert [c["config_name"] for c in header["configs"]] == list(configs)
    infos = {i["config_name"]: i for i in header["dataset_info"]}
    for c in header["configs"]:
        name = c["config_name"]
        files = {f["split"]: folder / f["path"] for f in c["data_files"]}
        assert {s: pl.read_parquet(p).height for s, p in files.items()} == configs[name]
        columns = pl.read_parquet(next(iter(files.values()))).columns
        assert [f["name"] for f in infos[name]["features"]] == columns
        assert {s["name"]: s["num_examples"] for s in infos[name]["splits"]} == configs[name]
        assert infos[name]["dataset_size"] > 0
        ds = load_dataset(str(folder), name)
        assert {s: d.num_rows for s, d in ds.items()} == configs[name]
        assert all(d.column_names == columns for d in ds.values())
    assert header["size_categories"] == ["n<1K"]
    assert {"models", "cost", "generation", "lineage"} <= set(header["evolforge"])
    for heading in ("## Load it", "## Tables", "## Lineage", "## Generation settings", "## Models used", "## Cost"):
        assert heading in body
    assert SECRET not in (folder / "README.md").read_text()
    return header, body


def assert_data_dir_loads(folder, config: str) -> None:
    """`load_dataset("parquet", data_dir=folder)` ignores the card: it loads the folder's main table (the card's
    default config `config`) as split "train", and nothing else of the folder (side tables, checkpoints, models,
    plots), with every row and column of the config's file."""
    header, _ = read_card(folder)
    entry = next(c for c in header["configs"] if c["config_name"] == config)
    assert entry.get("default") is True and entry["data_files"] == [
        {"split": "train", "path": "data/train-00000-of-00001.parquet"}]
    table = pl.read_parquet(folder / "data" / "train-00000-of-00001.parquet")
    by_dir = load_dataset("parquet", data_dir=str(folder))
    assert list(by_dir) == ["train"]
    assert by_dir["train"].num_rows == table.height > 0 and by_dir["train"].column_names == table.columns


# ------------------------------------------------------------------------------------------------- modules
def test_modules_card_lists_items_prm_steps_and_comparison(tmp_path, monkeypatch):
    from evolforge.flows.modules import ModulesParams, modules_flow

    monkeypatch.setenv("EVOLFORGE_API_KEY", SECRET)  # sent to the endpoint, never written to the card
    src = tmp_path / "questions.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"m{i}", "question": f"What is {i} times 3?"}) for i in range(2)) + "\n")
    with ScriptedServer(hang_seconds=3.0, nodelay=True) as srv:
        summary = modules_flow(ModulesParams(input=str(src), out=str(tmp_path / "out"), base_url=srv.base_url,
                                             compare=True, overrides={"modules": {"batch_size": 2}, **FAST}))
    out = tmp_path / "out"
    items, prm = pl.read_parquet(out / "data" / "train-00000-of-00001.parquet"), pl.read_parquet(out / "prm_steps.parquet")
    rejected = pl.read_parquet(out / "prm_rejected.parquet").height
    configs = {"items": {"train": items.height}, "prm_steps": {"train": prm.height},
               **({"prm_rejected": {"train": rejected}} if rejected else {}),
               "comparison": {"train": pl.read_parquet(out / "comparison.parquet").height}}
    header, body = assert_card(out, configs)
    assert_data_dir_loads(out, "items")
    assert items.height == 2 and summary["card"] == str(out / "README.md")
    facts = header["evolforge"]
    assert facts["stage"] == "modules" and facts["lineage"]["items"] == 2
    assert facts["lineage"]["comparison"]["n"] == 2
    assert {m["stage"] for m in facts["models"]} >= {"modules"}  # the ledger's stages and models
    assert facts["cost"]["attempts"] == summary["cost"]["attempts"] > 0
    assert len(facts["generation"]["modules"]["graph"]) == 9 and "| compute | result | parse |" in body
    assert "gateway" not in json.dumps(facts) and srv.base_url not in (out / "README.md").read_text()


# -------------------------------------------------------------------------------------------------- trajectories
def test_trajectories_card_lists_the_parquet_tables_and_points_at_sft_jsonl(tmp_path):
    from evolforge.flows.trajectories import TrajectoriesParams, trajectories_flow
    from evolforge.storage.proxy_sets import ProxyLayout, iter_records
    from evolforge.tasks.proxy.server import running_proxy
    from evolforge.testing.agent_upstream import AgentUpstream
    from evolforge.testing.settings import make_settings

    rec = tmp_path / "rec"
    with AgentUpstream() as up, running_proxy(make_settings(), up.base_url, str(rec)) as url:
        for session, question in (("a", "Plan a picnic for four people"), ("b", "Name three rivers in Africa"),
                                  ("c", "Plan a picnic for four people")):  # c duplicates a's prompt
            client = openai.OpenAI(base_url=f"{url}/s/{session}/v1", api_key=SECRET, max_retries=0)
            msgs = [{"role": "user", "content": question}]
            reply = client.chat.completions.create(model="agent-model", messages=msgs)
            msgs += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "And then?"}]
            client.chat.completions.create(model="agent-model", messages=msgs)
        client = openai.OpenAI(base_url=f"{url}/s/open/v1", api_key=SECRET, max_retries=0)
        client.chat.completions.create(model="agent-model", messages=[{"role": "user", "content": "unfinished"}])
        with httpx.Client(base_url=url, timeout=10) as h:
            assert h.post("/s/a/reward", json={"reward": 1.0}).status_code == 200
            for session in ("a", "b", "c"):
                assert h.post(f"/s/{session}/finish").status_code == 200
        deadline = time.time() + 10
        while len(list(iter_records(ProxyLayout(rec)))) < 7 and time.time() < deadline:
            time.sleep(0.05)
    out = tmp_path / "out"
    summary = trajectories_flow(TrajectoriesParams(proxy_out=str(rec), out=str(out)))
    trans = pl.read_parquet(out / "data" / "train-00000-of-00001.parquet")
    assert summary["duplicates"]["dropped"] >= 1 and summary["sessions"]["skipped_unfinished"] == 1
    assert json.loads((out / "summary.json").read_text())["card"] == summary["card"] == str(out / "README.md")
    configs = {"transitions": {"train": trans.height},
               "tokens": {"train": pl.read_parquet(out / "tokens.parquet").height},
               "duplicates": {"train": pl.read_parquet(out / "duplicates.parquet").height},
               "skipped": {"train": pl.read_parquet(out / "skipped.parquet").height}}
    assert trans.height == 4 and configs["skipped"]["train"] >= 1
    header, body = assert_card(out, configs)
    assert_data_dir_loads(out, "transitions")
    facts = header["evolforge"]
    assert facts["models"] == [{"stage": "agent (recorded)", "model": "agent-model", "calls": 4}]
    assert facts["cost"]["prompt_tokens"] == trans["prompt_tokens"].sum() > 0
    # sft.jsonl is no config (a card's configs share one format) but the card says how to load it
    assert "sft.jsonl" in body and 'load_dataset("json"' in body
    sft = load_dataset("json", data_files=str(out / "sft.jsonl"), split="train")
    assert sft.num_rows == summary["conversations"]["exported"] == 2


# ------------------------------------------------------------------------------------------------------- PPO
def test_ppo_card_lists_the_prompts_with_train_and_test_splits(tmp_path):
    from evolforge.flows.ppo import PPOParams, ppo_flow
    from evolforge.testing.ppo_models import shared_reward_models, write_evolved

    evolved = write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=6)
    out = tmp_path / "ppo"
    summary = ppo_flow(PPOParams(evolved=str(evolved), reward_dir=str(shared_reward_models()), out=str(out),
                                 local_steps=0, overrides={"ppo": {
                                     "policy_path": "/cluster/models/sft", "ray_env_vars": {"WANDB_PROJECT": "job-env-value"}}}))
    data = out / "data"
    header, body = assert_card(data, {"prompts": {"train": summary["data"]["train"], "test": summary["data"]["test"]}})
    by_dir = load_dataset("parquet", data_dir=str(data))  # the verl files are named for their splits
    assert {s: d.num_rows for s, d in by_dir.items()} == {"train": summary["data"]["train"], "test": summary["data"]["test"]}
    assert summary["data"]["train"] > 0 and summary["data"]["test"] > 0
    assert summary["card"] == str(data / "README.md")
    facts = header["evolforge"]
    assert facts["lineage"]["train"] == summary["data"]["train"] and facts["generation"]["ppo"]["kl_coef"] == 0.05
    assert "job-env-value" not in (data / "README.md").read_text() and "/cluster/models/sft" in body
    assert facts["models"][1] == {"stage": "reward (IRM)", "model": str(shared_reward_models() / "models" / "irm"), "calls": 0}
    # the verl data files are the card's files
    assert [f["path"] for f in header["configs"][0]["data_files"]] == ["train.parquet", "test.parquet"]


def test_a_hostile_recorded_model_name_cannot_break_the_card(tmp_path):
    """Agent traffic is untrusted: a model name with a YAML end marker, pipes and newlines stays one value in the
    header and one row of the body's table; the card still parses and loads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from evolforge.storage.cards import column_counts, write_dataset_card
    from evolforge.tasks.trajectories.report import card as trajectories_card

    evil = "m|x\n---\nconfigs: []\n| injected | row |\n`"
    pq.write_table(pa.table({"model": [evil, evil, "plain"], "prompt_tokens": [3, 4, 5],
                             "completion_tokens": [1, 1, 1]}), tmp_path / "transitions.parquet")
    models = column_counts(tmp_path / "transitions.parquet", "model", ("prompt_tokens", "completion_tokens"))
    assert models[0] == {"model": evil, "rows": 2, "prompt_tokens": 7, "completion_tokens": 2}
    summary = {"out": str(tmp_path), "proxy_out": "rec", "sessions": {"total": 1, "exported": 1, "skipped_unfinished": 0},
               "rewards": {}, "conversations": {"exported": 1}, "transitions": {"exported": 3},
               "calls": {"failed_skipped": 0}, "duplicates": {}}
    write_dataset_card(tmp_path, {"transitions": tmp_path / "transitions.parquet"},
                       **trajectories_card(summary, {}, models))
    header, body = read_card(tmp_path)
    assert [c["config_name"] for c in header["configs"]] == ["transitions"]
    assert header["evolforge"]["models"][0]["model"] == evil  # the header keeps the exact value, quoted
    rows = [line for line in body.splitlines() if line.startswith("| `")]
    assert len(rows) == 2 and all(line.count(" | ") == 3 for line in rows)
    assert "| injected | row |" not in body
    assert load_dataset(str(tmp_path), "transitions", split="train").num_rows == 3
