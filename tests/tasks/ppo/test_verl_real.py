"""The PPO stage's verl outputs checked by verl's own code (verl installed in its own environment,
evolforge.testing.verl_env): the generated Hydra overrides composed onto verl's ppo_trainer config and run through
verl's validate_config (what verl.trainer.main_ppo does before Ray); the prompt parquet read by verl's RLHFDataset;
the reward file loaded by verl's custom-reward loader and called by verl's reward loop worker on rows from that
dataset (a verified math answer, a code task whose tests run in the project's sandbox, a row without ground truth).
Nothing here needs a GPU; verl's trainer, rollout (vLLM/SGLang) and FSDP workers are not run."""

from __future__ import annotations

import json
import os
import shlex
import typing
from pathlib import Path

import pytest

from evolforge.config.settings import load_settings
from evolforge.storage.ppo import PPOLayout, read_evolved, write_prompt_parquet
from evolforge.tasks.ppo import verl as ppo_verl
from evolforge.tasks.ppo import verl_schema
from evolforge.tasks.ppo.data import build_prompt_rows
from evolforge.tasks.ppo.reward import load_reward
from evolforge.testing.ppo_models import shared_reward_models, write_evolved
from evolforge.testing.verl_env import VerlEnvUnavailable, ensure_verl_env

needs_bwrap = pytest.mark.skipif(not os.access("/usr/bin/bwrap", os.X_OK),
                                 reason="bubblewrap not installed (apt-get install -y bubblewrap): code rows run in it")

MATH_Q = "A box holds 3 rows of 4 eggs. How many eggs are in the box?"
CODE_Q = "Write add(a, b) returning the sum of two integers."
POEM_Q = "Write a short poem about autumn leaves."
TESTS = "from solution import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\ndef test_zero():\n    assert add(0, 0) == 0\n"
RESPONSES = [  # (question, response, expected `correct` of the reward)
    (MATH_Q, "Step 1: 3 * 4 = 12.\nThe answer is: 12", True),
    (MATH_Q, "Step 1: 3 + 4 = 7.\nThe answer is: 7", False),
    (CODE_Q, "Step 1: add them.\n```python\ndef add(a, b):\n    return a + b\n```", True),
    (CODE_Q, "Step 1: subtract.\n```python\ndef add(a, b):\n    return a - b\n```", False),
    # hostile: leave the interpreter with status 0 before any test runs
    (CODE_Q, "```python\nimport os\nos._exit(0)\ndef add(a, b):\n    return a + b\n```", False),
    (POEM_Q, "Step 1: Leaves fall.\nStep 2: They rest.\nThe answer is: 3", None),
]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="session")
def verl_env():
    try:
        return ensure_verl_env()
    except VerlEnvUnavailable as e:
        if e.offline:
            pytest.skip(f"verl's environment cannot be installed (package index unreachable): {e}")
        raise


def build_policy_folder(dest: Path) -> Path:
    """A model folder verl can read without a GPU or a hub: a byte-level BPE tokenizer trained here on a few
    lines (it round-trips any text, code included, as a real policy's does), a chat template, and the config
    of a tiny Llama (verl reads the config; no weights are needed before training)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [MATH_Q, CODE_Q, POEM_Q, TESTS, "Step 1: The answer is: user: assistant:"]
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(dest)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """A PPO stage's verl inputs: policy folder, reward models, train/test parquet from evolved records and tasks."""
    root = tmp_path_factory.mktemp("verl-stage")
    records = read_evolved(write_evolved(root / "evolved.parquet", n_seeds=3))
    tasks = [{"task_id": "t-math", "seed_id": "s-math", "kind": "math", "status": "kept", "statement": MATH_Q,
              "answer": "3*4"},
             {"task_id": "t-code", "seed_id": "s-code", "kind": "code", "status": "kept", "statement": CODE_Q,
              "entry_point": "add", "tests": TESTS, "solution": "def add(a, b):\n    return a + b\n"}]
    records.append({"id": "poem", "parent_id": None, "seed_id": "s-poem", "round": 0, "operation": "seed",
                    "status": "seed", "instruction": POEM_Q, "answer": "Leaves fall.", "domain": "general"})
    train, test, counts = build_prompt_rows(records, test_fraction=0.3, split_seed=7, tasks=tasks)
    lay = PPOLayout(root / "ppo").ensure()
    write_prompt_parquet(train, lay.train)
    write_prompt_parquet(test, lay.test)
    models = shared_reward_models() / "models"
    return {"policy": build_policy_folder(root / "policy"), "irm": models / "irm", "prm": models / "prm",
            "train": lay.train, "test": lay.test, "rows": train + test}


def overrides(stage, **ppo) -> dict:
    cfg = load_settings(None, {"ppo": ppo}, environ={}).ppo
    return ppo_verl.verl_overrides(cfg, train_files=str(stage["train"]), val_files=str(stage["test"]),
                                   policy_path=str(stage["policy"]), irm_dir=str(stage["irm"]),
                                   prm_dir=str(stage["prm"]), checkpoint_dir=str(stage["train"].parent.parent / "verl" / "checkpoints"))


# ------------------------------------------------------------------ the configuration

def test_generated_config_composes_and_validates_in_verl(verl_env, stage):
    good = overrides(stage)
    # user-chosen strings reach Hydra verbatim: quotes, spaces, commas, '=' and an interpolation must stay text
    good["trainer.experiment_name"] = "it's a run, lr=1e-6 [x] ${oc.env:HOME} \\${x} end\\"
    good["trainer.project_name"] = "2024"  # text, not a number
    pkg = overrides(stage, reward_function_path="pkg://evolforge.tasks.ppo.reward")
    bad = {
        "mistyped key": {**good, "actor_rollout_ref.actor.clip_ration": 0.3},
        "misplaced key": {**good, "critic.clip_ratio": 0.2},
        "'+' on a declared key": {**{k: v for k, v in good.items() if k != "algorithm.gamma"}, "+algorithm.gamma": 1.0},
        "batch not a multiple of the GPUs": {**good, "data.train_batch_size": 68},
        "text for a number": {**good, "data.train_batch_size": "lots"},
    }
    results = ppo_verl.check_many_with_verl([good, pkg, *bad.values()], python=verl_env.python,
                                            env=verl_env.environ())
    for config, ok in zip((good, pkg), results):
        assert ok["verl"] == verl_env.version and ok["problems"] == [], ok["problems"]
        expected = {k.lstrip("+"): list(v) if isinstance(v, tuple) else v for k, v in config.items()}
        assert ok["values"] == expected  # every generated key arrives in verl's config with its value
    for (name, config), result in zip(bad.items(), results[2:]):
        assert result["problems"], f"verl accepted a config with a {name}"
    assert "clip_ration" in results[2]["problems"][0] and "clip_ratio" in results[3]["problems"][0]
    assert "divisible" in results[5]["problems"][0]


def test_offline_schema_rejects_what_verl_rejects(stage):
    """The pydantic schema (no verl needed) catches the same unknown keys and batch arithmetic."""
    from pydantic import ValidationError

    good = overrides(stage)
    ppo_verl.validate_config(good)
    for bad in ({**good, "actor_rollout_ref.actor.clip_ration": 0.3}, {**good, "critic.clip_ratio": 0.2},
                {**good, "data.train_batch_size": 68}, {**good, "data.train_batch_size": "lots"}):
        with pytest.raises(ValidationError):
            ppo_verl.validate_config(bad)


# ------------------------------------------------------------------ data and reward through verl's code

PROBE = r"""
import json, os, sys
import torch
request = json.load(sys.stdin)


class HideEvolforge:  # a cluster node without evolforge installed
    active = True

    def find_spec(self, name, path=None, target=None):
        if self.active and (name == "evolforge" or name.startswith("evolforge.")):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


hide = HideEvolforge()
sys.meta_path.insert(0, hide)
from hydra import compose, initialize_config_dir
import verl.trainer.main_ppo as main_ppo
from verl import DataProto
from verl.experimental.reward_loop import RewardLoopWorker
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils import hf_tokenizer
from verl.utils.dataset.rl_dataset import collate_fn
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.workers.rollout.base import _ROLLOUT_REGISTRY

with initialize_config_dir(config_dir=os.path.join(os.path.dirname(main_ppo.__file__), "config"), version_base=None):
    config = compose(config_name="ppo_trainer", overrides=request["overrides"])
tokenizer = hf_tokenizer(config.actor_rollout_ref.model.path)


def chat_ids(messages):
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


splits = {}
for split, files in (("train", config.data.train_files), ("val", config.data.val_files)):
    dataset = create_rl_dataset(files, config.data, tokenizer, None, is_train=split == "train")
    splits[split] = [dataset[i] for i in range(len(dataset))]
out = {"rows": [{"split": split, "data_source": it["data_source"], "ability": it.get("ability"),
                 "reward_model": it["reward_model"], "extra_info": it["extra_info"],
                 "raw_prompt": list(it["raw_prompt"]), "prompt_tokens": len(chat_ids(it["raw_prompt"]))}
                for split, items in splits.items() for it in items]}
out["choices"] = {"adv_estimator": [e.value for e in AdvantageEstimator],
                  "rollout": sorted({name for name, _ in _ROLLOUT_REGISTRY})}
by_question = {it["extra_info"]["question"]: it for items in splits.values() for it in items}
samples = []
for question, response in request["responses"]:  # what the rollout would hand the reward loop
    it = dict(by_question[question])
    it["extra_info"] = dict(it["extra_info"])
    it["_prompt"], it["_response"] = chat_ids(it["raw_prompt"]), tokenizer(response, add_special_tokens=False)["input_ids"]
    samples.append(it)
P, R, pad = max(len(s["_prompt"]) for s in samples), max(len(s["_response"]) for s in samples), tokenizer.pad_token_id
for s in samples:
    p, r = s.pop("_prompt"), s.pop("_response")
    s["prompts"] = torch.tensor([pad] * (P - len(p)) + p)
    s["responses"] = torch.tensor(r + [pad] * (R - len(r)))
    s["attention_mask"] = torch.tensor([0] * (P - len(p)) + [1] * (len(p) + len(r)) + [0] * (R - len(r)))
    s["input_ids"] = torch.cat([s["prompts"], s["responses"]])
batch = DataProto.from_single_dict(collate_fn(samples))
for name, hidden in (("without_evolforge", True), ("with_evolforge", False)):
    hide.active = hidden
    worker = RewardLoopWorker(config)  # loads the custom reward function through verl's loader
    results = worker.loop.run_until_complete(worker.compute_score_batch(batch))
    out[name] = {"scores": [float(r["reward_score"]) for r in results], "evolforge_loaded": "evolforge" in sys.modules}
from verl.utils.import_utils import load_extern_object  # ppo.reward_function_path = "pkg://..." where installed
out["pkg_function"] = load_extern_object("pkg://evolforge.tasks.ppo.reward", "compute_score_async").__name__
print(json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def through_verl(verl_env, stage, tmp_path_factory):
    """One verl subprocess: read the parquet with RLHFDataset, score RESPONSES with verl's reward loop worker
    (first with evolforge hidden, as on a cluster node without it, then with it), and list verl's choices."""
    request = {"overrides": ppo_verl.hydra_args(overrides(stage)),
               "responses": [[q, r] for q, r, _ in RESPONSES]}
    cache = tmp_path_factory.mktemp("hf-datasets")  # RLHFDataset reads through `datasets`, which caches
    proc = verl_env.run(PROBE, input=json.dumps(request), timeout=900,
                        env={**os.environ, "HF_DATASETS_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_schema_choices_are_verls(through_verl):
    """Every value the offline schema allows for a choice is one verl knows."""
    fields = {"adv_estimator": verl_schema.Algorithm.model_fields["adv_estimator"],
              "rollout": verl_schema.Rollout.model_fields["name"]}
    for name, field in fields.items():
        allowed, known = set(typing.get_args(field.annotation)), set(through_verl["choices"][name])
        assert allowed <= known, f"{name}: {sorted(allowed - known)} unknown to verl"


def test_verl_dataset_reads_our_parquet(through_verl, stage):
    ours = {(r["extra_info"]["split"], r["extra_info"]["question"]): r for r in stage["rows"]}
    theirs = {("test" if r["split"] == "val" else "train", r["extra_info"]["question"]): r for r in through_verl["rows"]}
    assert theirs.keys() == ours.keys()  # no row dropped (overlong prompts would be) and no split swapped
    max_prompt = load_settings(None, {}, environ={}).ppo.max_prompt_length
    for key, mine in ours.items():
        row = theirs[key]
        assert row["data_source"] == mine["data_source"] and row["ability"] == mine["ability"]
        assert row["reward_model"] == mine["reward_model"]
        assert row["raw_prompt"] == mine["prompt"]  # the chat verl's rollout will template
        assert row["extra_info"]["question"] == mine["extra_info"]["question"]
        assert row["extra_info"]["lineage"] == mine["extra_info"]["lineage"]
        assert 0 < row["prompt_tokens"] <= max_prompt
    sources = {r["data_source"] for r in through_verl["rows"]}
    assert {"evolforge/math", "evolforge/code", "evolforge/general"} <= sources


def _expected(stage, *, with_evolforge: bool) -> tuple[list[float], list]:
    rows = {r["extra_info"]["question"]: r for r in stage["rows"]}
    reward = load_reward(str(stage["irm"]), str(stage["prm"]), "min", 0.5)
    questions = [q for q, _, _ in RESPONSES]
    sources = [rows[q]["data_source"] for q in questions]
    truths = [rows[q]["reward_model"]["ground_truth"] for q in questions]
    if not with_evolforge:  # the code rows' tests need the sandbox: PRM alone (no ground truth to check)
        truths = [None if s == "evolforge/code" else t for s, t in zip(sources, truths)]
    details = reward.details(questions, [r for _, r, _ in RESPONSES], truths, sources)
    return [d["reward"] for d in details], [d["correct"] for d in details]


@needs_bwrap
def test_verl_reward_loop_scores_with_our_reward(through_verl, stage):
    scores, correct = _expected(stage, with_evolforge=True)
    assert correct == [c for _, _, c in RESPONSES]  # answer checked, tests run in the sandbox, no ground truth
    assert through_verl["with_evolforge"]["evolforge_loaded"]
    assert through_verl["pkg_function"] == "compute_score_async"  # the pkg:// form loads through verl's loader too
    got = through_verl["with_evolforge"]["scores"]
    assert got == pytest.approx(scores, abs=1e-4)
    # the checks move the reward: a right answer / passing code scores above the wrong one for the same question
    assert got[0] > got[1] and got[2] > got[3] and got[2] > got[4]


def test_verl_reward_without_evolforge_installed(through_verl, stage):
    """Loaded by path where evolforge is not importable: the math answer is still checked (the reward file loads
    its helpers by file location); code rows fall back to the PRM alone."""
    scores, _ = _expected(stage, with_evolforge=False)
    assert not through_verl["without_evolforge"]["evolforge_loaded"]
    assert through_verl["without_evolforge"]["scores"] == pytest.approx(scores, abs=1e-4)


def test_the_stage_checks_its_config_with_verl_when_verl_python_is_set(verl_env, stage, tmp_path):
    """ppo.verl_python: the PPO stage runs verl's own compose + validate_config before it writes anything to submit."""
    from evolforge.tasks.ppo.job import verl_config

    wrapper = tmp_path / "verl-python"
    env = verl_env.environ()
    wrapper.write_text(f"#!/bin/sh\nexport PYTHONPATH={shlex.quote(env.get('PYTHONPATH', ''))}\n"
                       f"exec {shlex.quote(verl_env.python)} \"$@\"\n")
    wrapper.chmod(0o755)
    lay = PPOLayout(tmp_path / "ppo").ensure()
    cfg = load_settings(None, {"ppo": {"verl_python": str(wrapper)}}, environ={}).ppo
    done = verl_config(cfg, lay, str(stage["policy"]), stage["irm"], stage["prm"], "job-1")
    assert done["checked_by"].startswith(f"verl {verl_env.version}")
    # verl itself refuses what the project's schema cannot see: a policy folder that is not there
    with pytest.raises(ValueError, match="refuses the PPO configuration"):
        verl_config(cfg, PPOLayout(tmp_path / "ppo2").ensure(), str(tmp_path / "no-policy"), stage["irm"],
                    stage["prm"], "j")
