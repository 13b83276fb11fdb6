"""What a finished stage leaves to look at and to load: PNG plots in OUT/plots/ and on the Prefect run (a
markdown artifact with the images inline), dataset cards whose configs `datasets.load_dataset` reads, and the
SFT view of the evolved dataset in the form TRL's SFTTrainer reads. Real flows on the scripted endpoint."""

from __future__ import annotations

import base64
import json

import matplotlib.image
import polars as pl
import pytest

from evolforge.flows.evolve import EvolveParams, evolve_flow
from evolforge.flows.reward_data import RewardDataParams, reward_data_flow
from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow
from evolforge.flows.train_reward import TrainRewardParams, train_reward_flow
from evolforge.storage.cards import read_card
from evolforge.storage.layout import RunLayout
from evolforge.storage.ledger import read_ledger
from evolforge.tasks.evolve import report as evolve_report
from evolforge.tasks.report import plots
from evolforge.tasks.synthesis import report as synthesis_report
from evolforge.testing.evolved_runs import TINY_TRAINING, evolve_folder
from evolforge.testing.lazy import lazy_module

datasets = lazy_module("datasets")  # imported by the tests that load a dataset, not at collection


def load_dataset(*args, **kwargs):
    return datasets.load_dataset(*args, **kwargs)

pytestmark = pytest.mark.usefixtures("prefect_harness")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SECRET = "sk-evolforge-test-secret-0123456789"
FAST = {"gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 2.0}}


def artifact_markdown(key: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key!r}"
    return sorted(found, key=lambda a: a.created)[-1].data


def assert_plots(folder, names: set[str], key: str, in_folder: set[str] = frozenset()) -> None:
    """Exactly these PNGs (plus `in_folder`, an earlier stage's) in FOLDER/plots, each a readable image, each
    inline in the artifact `key`."""
    files = {p.stem: p for p in (folder / "plots").glob("*.png")}
    assert set(files) == names | in_folder
    md = artifact_markdown(key)
    for name, path in files.items():
        if name not in names:
            continue
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC)
        height, width = matplotlib.image.imread(path).shape[:2]
        assert 150 < height < 1500 and 500 < width < 1800, (name, width, height)
        assert f"![{name}](data:image/png;base64,{base64.b64encode(data).decode()})" in md


def assert_card_loads(folder, configs: list[str]) -> dict:
    """The card's YAML lists these configs with their features; each loads with datasets, as many rows as its file."""
    header, body = read_card(folder)
    assert [c["config_name"] for c in header["configs"]] == configs
    infos = {i["config_name"]: i for i in header["dataset_info"]}
    for c in header["configs"]:
        path = folder / c["data_files"][0]["path"]
        table = pl.read_parquet(path)
        assert [f["name"] for f in infos[c["config_name"]]["features"]] == table.columns
        assert infos[c["config_name"]]["splits"][0]["num_examples"] == table.height
        ds = load_dataset(str(folder), c["config_name"], split="train")
        assert ds.num_rows == table.height and ds.column_names == table.columns
    assert {"models", "cost", "generation", "lineage"} <= set(header["evolforge"])
    assert "## Models used" in body and "## Cost" in body
    return header


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


def test_evolve_plots_card_and_sft_view(tmp_path, server, monkeypatch):
    monkeypatch.setenv("EVOLFORGE_API_KEY", SECRET)  # must reach neither the card nor the artifacts
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps({"id": f"s{i}", "instruction": f"Compute {i} plus {i + 7} and explain "
                                           f"the result number {i}."}) for i in range(6)) + "\n")
    p = dict(seeds=str(seeds), out=str(tmp_path / "out"), base_url=server.base_url,
             overrides={"evol_instruct": {"batch_size": 3, "concurrency": 2}, **FAST})
    evolve_flow(EvolveParams(rounds=1, **p))
    server.judge_verdict = "Equal"  # round 2: every evolution eliminated (no information gain)
    summary = evolve_flow(EvolveParams(rounds=2, **p))
    lay = RunLayout(tmp_path / "out")
    assert [r["accepted"] for r in summary["rounds"]] == [6, 0]
    assert_plots(lay.root, {"survival_by_operation", "eliminations_by_rule", "cost_tokens_by_stage"}, "evolve-plots")
    assert summary["plots"]["eliminations_by_rule"] == str(lay.plots_dir / "eliminations_by_rule.png")

    header = assert_card_loads(lay.dataset_dir, ["sft", "evolved", "lineage", "final_pool"])
    assert next(c for c in header["configs"] if c["config_name"] == "sft")["default"] is True
    sft_features = next(i for i in header["dataset_info"] if i["config_name"] == "sft")["features"]
    assert {"name": "messages", "list": [{"name": "role", "dtype": "string"},
                                         {"name": "content", "dtype": "string"}]} in sft_features
    assert header["evolforge"]["lineage"]["rounds"] == [1, 2]
    assert {m["stage"] for m in header["evolforge"]["models"]} >= {"evolve", "judge", "answer"}

    # the SFT view: every evolved record with an answer, as a user / assistant conversation TRL recognises
    from trl.data_utils import is_conversational

    evolved = pl.read_parquet(lay.evolved).filter(pl.col("answer").is_not_null())
    sft = load_dataset(str(lay.dataset_dir), split="train")  # the default config
    assert sft.num_rows == evolved.height == 6 and is_conversational(sft[0])
    by_id = {r["id"]: r for r in evolved.to_dicts()}
    for row in sft:
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
        assert row["messages"][0]["content"] == by_id[row["id"]]["instruction"]
        assert row["messages"][1]["content"] == by_id[row["id"]]["answer"]
    assert load_dataset("parquet", data_files=str(lay.sft), split="train").num_rows == 6
    # data_dir ignores the card: in dataset/ only the SFT view is named for a split, so that is what it reads
    by_dir = load_dataset("parquet", data_dir=str(lay.dataset_dir))
    assert list(by_dir) == ["train"] and by_dir["train"].num_rows == 6 and "messages" in by_dir["train"].column_names

    assert SECRET not in (lay.dataset_dir / "README.md").read_text()
    assert SECRET not in artifact_markdown("evolve-plots")


def test_synthesis_plots_and_card(tmp_path, server):
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps(r) for r in [
        {"id": "ok", "instruction": "Write a function that adds two numbers.", "domain": "code"},
        {"id": "hard", "instruction": "UNSOLVABLE: an adder nobody gets right.", "domain": "code"},
        {"id": "trivial", "instruction": "TRIVIAL: write an adder with tests.", "domain": "code"},
        {"id": "m1", "instruction": "A shop sells 3 boxes of 4 apples each. How many apples in total?",
         "domain": "math"}]) + "\n")
    price = {"overrides": {"smollm2-135m-instruct": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}}}
    summary = synthesize_flow(SynthesizeParams(seeds=str(seeds), out=str(tmp_path / "syn"), base_url=server.base_url,
                                               overrides={"synthesis": {"prune_jaccard": 1.0}, "pricing": price, **FAST}))
    out = tmp_path / "syn"
    assert_plots(out, {"task_difficulty", "cost_tokens_by_stage"}, "synthesis-plots")
    header = assert_card_loads(out, ["tasks", "rejected", "cost_per_task"])
    assert_data_dir_loads(out, "tasks")  # not rejected / cost_per_task / the parts / cost_per_task.csv
    assert header["evolforge"]["lineage"]["kept"] == summary["kept"] and summary["proposed"] > summary["kept"]
    # every call of the run, the pre-flight probe included (summary total_usd counts the tasks' calls only)
    assert header["evolforge"]["cost"]["usd"] == pytest.approx(read_ledger(out)["cost_usd"].sum())
    assert header["evolforge"]["cost"]["usd"] >= summary["total_usd"] > 0


def test_reward_plots_and_card(tmp_path, server):
    data = reward_data_flow(RewardDataParams(
        evolve_out=str(evolve_folder(tmp_path)), out=str(tmp_path / "reward"), base_url=server.base_url,
        overrides={"reward": {"batch_size": 4, "concurrency": 2}, **FAST}))
    out = tmp_path / "reward"
    assert_plots(out, {"reward_data_scores", "cost_tokens_by_stage"}, "reward-data-plots")
    assert_card_loads(out, ["irm_pairs", "irm_groups", "prm_steps", "prm_rejected"])
    assert data["card"] == str(out / "README.md")

    train_reward_flow(TrainRewardParams(data=str(out), overrides={"reward": TINY_TRAINING}))
    assert_plots(out, {"reward_model_scores"}, "reward-model-plots", {"reward_data_scores", "cost_tokens_by_stage"})
    # the pairs, and not models/*/training_args.bin (a file datasets' split rules would take for "train")
    assert (out / "models" / "irm" / "training_args.bin").exists()
    assert_data_dir_loads(out, "irm_pairs")
    assert load_dataset(str(out), "prm_steps", split="train").num_rows == pl.read_parquet(out / "prm_steps.parquet").height
    health = json.loads((out / "health.json").read_text())
    assert len(health["model"]["samples"]["irm"]) == health["model"]["irm"]["n"] > 0


@pytest.mark.parametrize("draw", [
    lambda: evolve_report.survival_by_operation([]),
    lambda: evolve_report.eliminations_by_rule([{"round": 1, "by_rule": {}}]),
    lambda: plots.cost_and_tokens_by_stage([]),
    lambda: synthesis_report.task_difficulty([{"kind": "code", "status": "rejected", "difficulty": None}]),
    lambda: plots.score_histograms({"IRM": [], "PRM": [None, 1.0]}, (0.4, 0.7), "scores"),
    # hostile-ish content: model-made names with markup and very long text, unknown costs, null counts
    lambda: evolve_report.eliminations_by_rule([{"round": 3, "by_rule": {"<script>alert(1)</script>" * 3: 2,
                                                                          None: 1}}]),
    lambda: plots.cost_and_tokens_by_stage([{"stage": "judge", "model": "m", "prompt_tokens": None,
                                             "completion_tokens": None, "cost_usd": None, "unpriced_calls": 3}]),
])
def test_every_plot_draws_on_empty_or_odd_data(draw):
    assert draw().startswith(PNG_MAGIC)


def test_card_yaml_is_safe_for_any_text(tmp_path):
    """A model-made value with YAML syntax in it stays a string in the header (no injected keys)."""
    from evolforge.storage.cards import write_dataset_card

    table = tmp_path / "t.parquet"
    pl.DataFrame({"instruction": ["---\nconfigs: []\n---"]}).write_parquet(table)
    write_dataset_card(tmp_path, {"t": table}, title="x: y\n---", description="d", sections={"S": ["a"]},
                       facts={"note": "---\nevil: true"})
    header, _ = read_card(tmp_path)
    assert header["pretty_name"] == "x: y\n---" and header["evolforge"] == {"note": "---\nevil: true"}
    assert [c["config_name"] for c in header["configs"]] == ["t"]
    # and as the Hub's own card parser reads it
    from huggingface_hub import DatasetCard

    data = DatasetCard.load(tmp_path / "README.md").data.to_dict()
    assert data["pretty_name"] == "x: y\n---" and data["configs"][0]["config_name"] == "t"


def test_an_empty_table_is_no_config(tmp_path):
    """datasets cannot load an empty parquet file: the card leaves it out and says so."""
    from evolforge.storage.cards import write_dataset_card

    pl.DataFrame({"a": [1]}).write_parquet(tmp_path / "full.parquet")
    pl.DataFrame({"a": []}, schema={"a": pl.Int64}).write_parquet(tmp_path / "empty.parquet")
    write_dataset_card(tmp_path, {"full": tmp_path / "full.parquet", "empty": tmp_path / "empty.parquet",
                                  "missing": tmp_path / "missing.parquet"}, title="t", description="d", sections={},
                       facts={})
    header, body = read_card(tmp_path)
    assert [c["config_name"] for c in header["configs"]] == ["full"] and "not a config: empty" in body
    assert load_dataset(str(tmp_path), split="train").num_rows == 1


def test_pipeline_shows_every_stage_plots(tmp_path, server):
    from evolforge.flows.pipeline import PipelineParams, pipeline_flow

    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps(r) for r in [
        {"id": "c1", "instruction": "Write a function that adds two numbers.", "domain": "code"},
        {"id": "m1", "instruction": "A shop sells 3 boxes of 4 apples each. How many apples?", "domain": "math"}]) + "\n")
    price = {"overrides": {"smollm2-135m-instruct": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}}}
    done = pipeline_flow(PipelineParams(seeds=str(seeds), out=str(tmp_path / "p"), rounds=1, reward=False,
                                        base_url=server.base_url, overrides={"pricing": price, **FAST}))
    assert set(done) == {"evolve", "synthesize"}
    assert_plots(tmp_path / "p", {"cost_tokens_by_stage", "evolve_survival_by_operation",
                                  "evolve_eliminations_by_rule", "synthesize_task_difficulty"}, "pipeline-plots")
    # the stages' own plots are the same images
    assert (tmp_path / "p" / "plots" / "synthesize_task_difficulty.png").read_bytes() == \
        (tmp_path / "p" / "synthesize" / "plots" / "task_difficulty.png").read_bytes()
