"""Own outputs are inputs (issue 34): every stage reads the tables other stages write. One real evolve run, a
synthesis run on its evolved table and a dedup run on it (the scripted endpoint, once per module); then each pair
below runs the consumer on the producer's real output, through the consumer's own input check and reader:

    consumer     input            producer's table
    dedup        --input          evolve's evolved / lineage / final_pool, dedup's kept / dropped, synthesize's tasks
    evolve       --seeds          evolve's final_pool / evolved, dedup's kept
    synthesize   --seeds          evolve's evolved / final_pool, dedup's kept
    modules      --input          evolve's evolved, dedup's kept
    reward-data  --evolve-out     evolve's folder
    sft          --evolve-out, --tasks   evolve's folder, synthesize's folder (the training rows, no training)
    ppo          --evolved, --tasks      evolve's evolved, dedup's kept, synthesize's tasks (the prompt data)
    eval         --tasks, --evolve-out   synthesize's folder, evolve's folder (the problems)

A pair passes when the consumer accepts the table, reads every row it should (none rejected as unreadable) and
writes its own output.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from evolforge.storage.layout import RunLayout

pytestmark = pytest.mark.usefixtures("prefect_harness")

SEEDS = [
    {"id": "c1", "instruction": "Write a function that adds two numbers.", "domain": "code"},
    {"id": "m1", "instruction": "A shop sells 3 boxes of 4 apples each. How many apples in total?", "domain": "math"},
    {"id": "m2", "instruction": "Compute 5 plus 12 and explain the result.", "domain": "math"},
    {"id": "m3", "instruction": "Compute 5 plus 12 and explain the result.", "domain": "math"},  # dedup drops it
]
FAST = {"gateway": {"backoff_base_seconds": 0.0, "timeout_seconds": 5.0}}
EXACT = {"dedup": {"minhash": False, "embedding": False}}
SYNTH = {**FAST, "synthesis": {"budget_usd_per_task": 0, "prune_jaccard": 1.0}}


@pytest.fixture(scope="module")
def produced(tmp_path_factory):
    """{name: path} of the producers' real outputs, and the scripted server they ran against."""
    from evolforge.flows.dedup import DedupParams, dedup_flow
    from evolforge.flows.evolve import EvolveParams, evolve_flow
    from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow
    from evolforge.testing.scripted_server import ScriptedServer

    tmp = tmp_path_factory.mktemp("own_outputs")
    seeds = tmp / "seeds.jsonl"
    seeds.write_text("".join(json.dumps(r) + "\n" for r in SEEDS))
    with ScriptedServer() as srv:
        evolve_flow(EvolveParams(seeds=str(seeds), out=str(tmp / "evolve"), rounds=1, base_url=srv.base_url,
                                 model="scripted", overrides=FAST))
        lay = RunLayout(tmp / "evolve")
        synthesize_flow(SynthesizeParams(seeds=str(lay.evolved), out=str(tmp / "synth"), base_url=srv.base_url,
                                         model="scripted", overrides=SYNTH))
        # the final pool into an index, then the evolved table against it: the pool's rows are dropped, with the
        # evolved table's own dedup_similarity beside the dedup's reasons
        for table, out in ((lay.final_pool, "dedup_pool"), (lay.evolved, "dedup")):
            dedup_flow(DedupParams(input=str(table), out=str(tmp / out), id_field="id", index=str(tmp / "index"),
                                   overrides=EXACT))
        paths = {"evolve": lay.root, "evolved": lay.evolved, "lineage": lay.lineage, "final_pool": lay.final_pool,
                 "synth": tmp / "synth", "tasks": tmp / "synth" / "data" / "train-00000-of-00001.parquet",
                 "kept": tmp / "dedup" / "kept.parquet", "dropped": tmp / "dedup" / "dropped.parquet"}
        yield paths, srv


def rows(path) -> int:
    return pl.read_parquet(path).height


@pytest.mark.long("carries the module's producers: an evolve run, a synthesis run and two dedup runs (~11 s CPU)")
def test_the_producers_wrote_real_tables(produced):
    paths, _ = produced
    assert rows(paths["evolved"]) == 6 and rows(paths["tasks"]) > 0 and rows(paths["kept"]) == 3
    dropped = pl.read_parquet(paths["dropped"])  # the final pool's rows, already in the index
    assert dropped.height == 3 and {"input_dedup_similarity", "dedup_similarity"} <= set(dropped.columns)


DEDUP_PAIRS = [("evolved", "instruction", "id"), ("lineage", "instruction", "id"), ("final_pool", "instruction", "id"),
               ("kept", "instruction", "id"), ("dropped", "instruction", "id"), ("tasks", "statement", "task_id")]


@pytest.mark.parametrize("table,text,ident", DEDUP_PAIRS, ids=[p[0] for p in DEDUP_PAIRS])
def test_dedup_reads(produced, tmp_path, table, text, ident):
    from evolforge.flows.dedup import DedupParams, dedup_flow

    paths, _ = produced
    summary = dedup_flow(DedupParams(input=str(paths[table]), out=str(tmp_path / "d"), text_field=text,
                                     id_field=ident, overrides=EXACT))
    assert summary["kept"] + summary["dropped"] == rows(paths[table]) and summary["kept"] > 0
    kept = pl.read_parquet(tmp_path / "d" / "kept.parquet")
    assert kept.height == summary["kept"] and kept.columns == pl.read_parquet(paths[table]).columns
    if table == "dropped":  # the input's own reasons (and its input's) keep their names under input_ prefixes
        assert {"input_input_dedup_similarity", "input_dedup_similarity", "input_dedup_method", "dedup_method"} <= set(
            pl.read_parquet(tmp_path / "d" / "dropped.parquet").columns)


@pytest.mark.parametrize("table", ["final_pool", "evolved", "kept"])
def test_evolve_seeds_from(produced, tmp_path, table):
    from evolforge.flows.evolve import EvolveParams, evolve_flow

    paths, srv = produced
    summary = evolve_flow(EvolveParams(seeds=str(paths[table]), out=str(tmp_path / "e"), rounds=1,
                                       base_url=srv.base_url, model="scripted", overrides=FAST))
    lay = RunLayout(tmp_path / "e")
    assert not lay.rejects.exists() or lay.rejects.read_text() == ""  # every row read as a seed
    assert summary["rounds"][0]["attempts"] == pl.read_parquet(paths[table])["instruction"].n_unique()


@pytest.mark.parametrize("table", ["evolved", "final_pool", "kept"])
def test_synthesize_seeds_from(produced, tmp_path, table):
    from evolforge.flows.synthesize import SynthesizeParams, synthesize_flow

    paths, srv = produced
    summary = synthesize_flow(SynthesizeParams(seeds=str(paths[table]), out=str(tmp_path / "s"),
                                               base_url=srv.base_url, model="scripted", overrides=SYNTH))
    assert summary["proposed"] == rows(paths[table]) and summary["kept"] > 0
    assert (tmp_path / "s" / "rejects.jsonl").read_text() == ""  # every row read as a seed


@pytest.mark.parametrize("table", ["evolved", "kept"])
def test_modules_questions_from(produced, tmp_path, table):
    from evolforge.flows.modules import ModulesParams, modules_flow

    paths, srv = produced
    summary = modules_flow(ModulesParams(input=str(paths[table]), out=str(tmp_path / "m"), base_url=srv.base_url,
                                         model="scripted", max_items=2, overrides=FAST))
    assert summary["items"] == 2 and summary["by_status"] == {"ok": 2}


def test_reward_data_on_the_evolve_run(produced, tmp_path):
    from evolforge.flows.reward_data import RewardDataParams, reward_data_flow

    paths, srv = produced
    summary = reward_data_flow(RewardDataParams(evolve_out=str(paths["evolve"]), out=str(tmp_path / "r"),
                                                base_url=srv.base_url, model="scripted", overrides=FAST))
    assert summary["irm_pairs"] > 0 and summary["prm_rows"] > 0


def test_sft_rows_from_the_evolve_run_and_synthesis(produced, tmp_path):
    from evolforge.config.settings import load_settings
    from evolforge.storage.sft_sets import SFTFolder
    from evolforge.tasks.sft.job import prepare
    from evolforge.tasks.sft.stage import SFTParams

    paths, _ = produced
    params = SFTParams(evolve_out=str(paths["evolve"]), tasks=str(paths["synth"]), out=str(tmp_path / "sft"))
    counts = prepare(params, load_settings(), SFTFolder(tmp_path / "sft").ensure())
    # rows from both producers (a held-out lineage is kept out of training; the rest are read, none unreadable)
    assert counts["rows"] > 0 and counts["by_source"]["synthesis_code"] > 0 and counts["by_source"]["evolved"] > 0
    assert rows(tmp_path / "sft" / "data" / "train.parquet") == counts["rows"]


@pytest.mark.parametrize("evolved", ["evolved", "kept"])
def test_ppo_prompt_data_from(produced, tmp_path, evolved):
    from evolforge.config.settings import load_settings
    from evolforge.storage.ppo import PPOLayout
    from evolforge.tasks.ppo.job import prompt_data

    paths, _ = produced
    settings = load_settings()
    out = prompt_data(str(paths[evolved]), PPOLayout(tmp_path / "ppo"), settings.ppo, str(paths["synth"]),
                      settings.eval, None, settings.reward)
    assert out["records"] == rows(paths[evolved]) and out["tasks"] == rows(paths["tasks"])
    assert out["train"] > 0 and out["dropped"] == {"status": 0, "empty": 0, "duplicate": 0}


def test_eval_problems_from_synthesis_and_evolve(produced):
    from evolforge.config.settings import load_settings
    from evolforge.tasks.eval.run import problems
    from evolforge.tasks.eval.stage import EvalParams

    paths, _ = produced
    found, skipped = problems(EvalParams(tasks=str(paths["synth"]), evolve_out=str(paths["evolve"]),
                                         benchmarks=["own"]), load_settings())
    assert found["own"] and not skipped  # the held-out lineages' verified tasks
