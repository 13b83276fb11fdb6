"""pass@k by the unbiased estimator and Wilson intervals (tasks/eval/scoring.py), against brute force and
published values; the held-out split of the own benchmark is the PPO stage's."""

from __future__ import annotations

import itertools
import math

import pytest

from evolforge.config.settings import Settings
from evolforge.storage.ppo import read_evolved
from evolforge.storage.synthesis_sets import read_kept_tasks
from evolforge.tasks.eval.scoring import pass_at_k, table, wilson
from evolforge.tasks.ppo.data import build_prompt_rows
from evolforge.tasks.problems.benchmarks import gsm8k_answer, held_out_seeds, humaneval_problems, own_problems
from evolforge.testing.eval_inputs import write_eval_inputs


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 5, 3), (6, 2, 1), (6, 2, 3), (7, 3, 5), (10, 1, 10), (4, 3, 2)])
def test_pass_at_k_is_the_chance_a_k_subset_holds_a_correct_sample(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in ((3, 4, 1), (3, 1, 4), (3, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_wilson_interval_matches_published_values():
    # Wilson (1927) / Newcombe (1998): 0.5 over 10 -> [0.2366, 0.7634]; 0 of 10 -> [0, 0.2775]; 9 of 10 -> [0.5958, 0.9821]
    assert wilson(0.5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0.0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(0.9, 10) == pytest.approx((0.5958, 0.9821), abs=1e-4)
    low, high = wilson(0.3, 1000)
    assert high - low == pytest.approx(2 * 1.96 * math.sqrt(0.3 * 0.7 / 1000), rel=0.01)  # large n: the normal one


def test_table_per_benchmark_and_domain():
    results = [{"benchmark": "own", "domain": d, "problem_id": f"{d}{i}", "sample": s, "passed": ok}
               for d, i, s, ok in [("code", 0, 0, True), ("code", 0, 1, False), ("code", 1, 0, False),
                                   ("code", 1, 1, False), ("math", 0, 0, True), ("math", 0, 1, True)]]
    rows = {(r["benchmark"], r["domain"]): r for r in table(results, [1, 2])}
    assert set(rows) == {("own", "all"), ("own", "code"), ("own", "math")}
    assert rows[("own", "code")]["pass@1"] == pytest.approx(0.25) and rows[("own", "code")]["pass@2"] == 0.5
    assert rows[("own", "all")]["pass@1"] == pytest.approx((0.5 + 0 + 1) / 3, abs=1e-4)
    assert rows[("own", "math")]["pass@1_ci95"] == [round(x, 4) for x in wilson(1.0, 1)]
    one = table([r for r in results if r["domain"] == "code"], [1])
    assert [(r["benchmark"], r["domain"]) for r in one] == [("own", "all")]  # one domain: no duplicate row


def test_own_benchmark_holds_exactly_the_ppo_test_lineages(tmp_path):
    run, synth = write_eval_inputs(tmp_path)
    evolved, tasks = read_evolved(run / "dataset" / "evolved.parquet"), read_kept_tasks(synth)
    ppo = Settings().ppo
    held = held_out_seeds(evolved, tasks, ppo)
    _, test, _ = build_prompt_rows(evolved, ppo.test_fraction, ppo.split_seed, tasks=tasks)
    assert held == {r["extra_info"]["lineage"]["seed_id"] for r in test} and 0 < len(held) < 6
    own = own_problems(tasks, held)
    assert {p.id[1:] for p in own} == {s[1:] for s in held} and len(own) == 3 * len(held)
    assert {p.check.get("answer") for p in own if p.domain == "math"} == {"42", "12"}


def test_humaneval_and_gsm8k_formats():
    problems = humaneval_problems()
    assert len(problems) == 164 and problems[0].id == "HumanEval/0" and "def check" in problems[0].check["test"]
    assert gsm8k_answer("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 1,072") == "1072"
    assert gsm8k_answer("no marker") is None
