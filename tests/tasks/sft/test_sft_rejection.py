"""Rejection sampling for SFT (tasks/sft/rejection.py): the policy's own answers to the training tasks, kept only
when verified; the held-out lineages are never sampled; the rows are of source rejection_sampled. The last test runs
the real path (LocalPolicy generation with a tiny Llama, then the SFT data build) end to end."""

from __future__ import annotations

import pytest

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.config.sections.sft import SFTSettings
from evolforge.storage.sft_sets import SFTFolder, read_rows
from evolforge.tasks.sft import data, job, rejection
from evolforge.tasks.sft.stage import SFTParams
from evolforge.testing.arithmetic_tasks import problems, write_task_folder
from evolforge.testing.ppo_models import one_torch_thread  # noqa: F401 (autouse fixture)
from evolforge.testing.tiny_policy import build_tiny_policy


class Scripted:
    """A policy whose samples are given per prompt (the verdict logic is what is tested here)."""

    def __init__(self, answers: dict[str, list[str]]):
        self.answers, self.seen = answers, []

    def generate(self, prompts, n, on_batch=None):
        out = []
        for p in prompts:
            self.seen.append(p["chat"][-1]["content"])
            key = next(k for k in self.answers if k in p["chat"][-1]["content"])
            out.append(self.answers[key][:n])
        return out


def _task(tid, statement, answer, kind="math", seed=None):
    return {"task_id": tid, "seed_id": seed or tid, "kind": kind, "statement": statement, "answer": answer,
            "tests": None, "entry_point": None, "solution": None}


GOOD = "Step 1: 3 + 4 = 7.\nStep 2: So Ava has 7.\nThe answer is: 7"
GOOD2 = "Step 1: Ava starts with 3 and gets 4.\nStep 2: 3 + 4 = 7.\nThe answer is: 7"
WRONG = "Step 1: 3 + 4 = 8.\nStep 2: So 8.\nThe answer is: 8"
NO_STEPS = "The answer is: 7"


def test_only_verified_step_form_answers_are_kept_up_to_the_limit():
    tasks = [_task("t1", "Ava has 3 and gets 4. How many?", "7"), _task("t2", "Ben has 9 and loses 9. How many?", "0")]
    policy = Scripted({"Ava": [WRONG, GOOD, NO_STEPS, GOOD, GOOD2], "Ben": [WRONG, WRONG, NO_STEPS, WRONG, WRONG]})
    cfg = SFTSettings(rejection_samples=5, rejection_keep=2)
    rows, kept = rejection.sample(tasks, policy, cfg, SandboxSettings())
    assert len(rows) == 10 and sum(r["verified"] for r in rows) == 3
    assert kept == {"t1": sorted([GOOD, GOOD2], key=len)}  # distinct, the shortest first, at most 2, none for t2
    reasons = {r["reason"] for r in rows if not r["verified"]}
    assert any("not the verified 7" in r for r in reasons) and any("not step form" in r for r in reasons)
    assert "Step 1" in policy.seen[0]  # the step-by-step prompt of the SFT and PPO data


def test_held_out_lineages_are_never_sampled_and_rows_carry_their_source():
    tasks = [_task("t1", "Ava has 3 and gets 4. How many?", "7"), _task("t2", "Ava x", "7", seed="held")]
    todo = rejection.training_tasks(tasks, held_out={"held"})
    assert [t["task_id"] for t in todo] == ["t1"]
    built = data.build([], tasks, [], {"held"}, SFTSettings(decontaminate="off"), None, sampled={"t1": [GOOD, GOOD2]})
    assert sorted((r["id"], r["source"]) for r in built.rows) == [("t1/rs0", "rejection_sampled"),
                                                                  ("t1/rs1", "rejection_sampled")]
    assert all(r["completion"][0]["content"] in (GOOD, GOOD2) for r in built.rows)
    assert {s["id"]: s["reason"] for s in built.skipped}["t2"].startswith("held-out lineage")


def test_a_task_without_a_verified_sample_is_skipped_with_that_reason():
    tasks = [_task("t1", "Ava has 3 and gets 4. How many?", "7")]
    built = data.build([], tasks, [], set(), SFTSettings(decontaminate="off"), None, sampled={})
    assert not built.rows and built.skipped[0]["reason"].startswith("no verified sample")
    built = data.build([], tasks, [], set(), SFTSettings(decontaminate="off"), None, sampled=None)
    assert built.skipped[0]["reason"].startswith("no stored worked solution")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "policy")


@pytest.mark.long("rejection sampling and the SFT data build with a real tiny policy (~16 s CPU on a loaded machine)")
def test_prepare_samples_the_base_policy_and_records_every_sample(tmp_path, tiny):
    rows = [{**p, "answer": str(p["generator_answer"]), "verified": "test"} for p in problems(12, seed=3)]
    write_task_folder(tmp_path / "tasks", rows)
    params = SFTParams(tasks=str(tmp_path / "tasks"), out=str(tmp_path / "sft"), base_model=str(tiny),
                       overrides={"sft": {"rejection_samples": 2, "rejection_max_new_tokens": 8, "decontaminate": "off"},
                                  "ppo": {"test_fraction": 0.25}})
    settings = params.settings()
    folder = SFTFolder(params.out).ensure()
    prepared = job.prepare(params, settings, folder)
    samples = read_rows(folder.rejection_samples)
    held = prepared["held_out_seeds"]
    assert 0 < held < 12
    counted = prepared["rejection_sampling"]
    assert counted["tasks"] == 12 - held and counted["samples"] == 2 * (12 - held) == len(samples)
    # a random-weight policy answers nothing right: no row is kept, and every task says why
    assert counted["verified_samples"] == 0 and prepared["rows"] == 0
    assert all(not s["verified"] and s["reason"] for s in samples)
    assert prepared["skipped_by_reason"]["no verified sample"] == 12 - held
