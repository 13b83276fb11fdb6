"""The A/B of eval runs (tasks/eval/compare.py, `evolforge compare`): per-policy pass@1 with Wilson intervals and
paired changes in points (Newcombe's interval for paired proportions); runs over other problems or templates refused."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from evolforge.storage import eval_sets as store
from evolforge.tasks.eval import compare
from evolforge.tasks.eval.scoring import wilson


def _run(folder, passed: list[bool], template="evolforge_steps", ids=None, samples=1):
    f = store.EvalFolder(folder).ensure()
    ids = ids or [f"p{i:03d}" for i in range(len(passed))]
    store.write_generations([{"benchmark": "own", "problem_id": i, "domain": "math", "template": template,
                              "prompt": "q", "samples": ["a"] * samples} for i in ids], f.generations("own"))
    store.write_results([{"benchmark": "own", "problem_id": i, "domain": "math", "sample": s, "passed": p,
                          "detail": None, "completion": "a"} for i, p in zip(ids, passed) for s in range(samples)],
                        f.results("own"))
    return str(folder)


def test_identical_policies_change_by_zero_with_an_interval_around_it():
    a = [(1, c) for c in [1, 0, 1, 0, 0, 0, 1, 0, 0, 0] * 5]  # 30%
    d = compare.paired_difference(a, a)
    assert d["difference"] == 0 and d["ci95"][0] < 0 < d["ci95"][1] and d["wins"] == d["losses"] == 0
    assert d["method"] == "newcombe_paired"


def test_a_policy_that_only_wins_has_an_interval_above_zero():
    a = [(1, 0)] * 70 + [(1, 1)] * 30
    b = [(1, 1)] * 20 + [(1, 0)] * 50 + [(1, 1)] * 30  # 20 wins, no loss
    d = compare.paired_difference(a, b)
    assert d["difference"] == pytest.approx(0.2) and d["ci95"][0] > 0 and d["ci95"][1] < 0.3
    assert (d["wins"], d["losses"]) == (20, 0)
    # the same change read the other way round
    r = compare.paired_difference(b, a)
    assert r["difference"] == pytest.approx(-0.2) and r["ci95"][1] < 0


def test_uncorrelated_pairs_reduce_to_newcombes_square_and_add_interval():
    # both=25, only_a=25, only_b=25, neither=25: phi = 0, so the interval is the unpaired method-10 one
    a = [(1, 1)] * 25 + [(1, 1)] * 25 + [(1, 0)] * 25 + [(1, 0)] * 25
    b = [(1, 1)] * 25 + [(1, 0)] * 25 + [(1, 1)] * 25 + [(1, 0)] * 25
    d = compare.paired_difference(a, b)
    l1, u1 = wilson(0.5, 100)
    assert d["ci95"][0] == pytest.approx(0 - math.sqrt((0.5 - l1) ** 2 + (u1 - 0.5) ** 2))
    assert d["ci95"][1] == pytest.approx(0 + math.sqrt((u1 - 0.5) ** 2 + (0.5 - l1) ** 2))


def test_pairing_narrows_the_interval_of_correlated_outcomes():
    # 40 both right, 50 both wrong, 10 only-b wins: strongly correlated, so narrower than the unpaired interval
    a = [(1, 1)] * 40 + [(1, 0)] * 60
    b = [(1, 1)] * 40 + [(1, 1)] * 10 + [(1, 0)] * 50
    d = compare.paired_difference(a, b)
    l1, u1 = wilson(0.5, 100)
    l2, u2 = wilson(0.4, 100)
    unpaired_low = 0.1 - math.sqrt((0.5 - l1) ** 2 + (u2 - 0.4) ** 2)
    assert d["ci95"][0] > unpaired_low and d["ci95"][0] > 0


def test_several_samples_use_the_mean_paired_difference():
    a = [(4, 1)] * 50
    b = [(4, 3)] * 50
    d = compare.paired_difference(a, b)
    assert d["method"] == "normal_paired_mean" and d["difference"] == pytest.approx(0.5)


def test_compare_runs_gives_one_table_and_the_rleif_bar(tmp_path):
    base = _run(tmp_path / "base", [False] * 80 + [True] * 20)
    sft = _run(tmp_path / "sft", [True] * 10 + [False] * 70 + [True] * 20)
    rl = _run(tmp_path / "rl", [True] * 14 + [False] * 66 + [True] * 20)
    res = compare.compare({"base": base, "sft": sft, "rl": rl})
    shares = {r["policy"]: r["pass@1"] for r in res["rows"]}
    assert shares == {"base": 0.2, "sft": 0.3, "rl": 0.34}
    pairs = {(c["from"], c["to"]): c for c in res["changes"]}
    assert set(pairs) == {("base", "sft"), ("sft", "rl"), ("base", "rl")}
    assert pairs[("base", "sft")]["points"] == 10.0 and pairs[("base", "sft")]["excludes_zero"]
    bar = res["rleif_bar"][0]
    assert (bar["from"], bar["to"], bar["points"], bar["at_or_above"]) == ("sft", "rl", 4.0, True)
    text = compare.markdown(res)
    assert "RLEIF's bar on own (rl over sft, +3 points of pass@1): measured +4.0 points" in text


def test_runs_over_other_problems_or_templates_are_refused(tmp_path):
    base = _run(tmp_path / "base", [True, False, True])
    other = _run(tmp_path / "other", [True, False, True], ids=["x1", "x2", "x3"])
    cot = _run(tmp_path / "cot", [True, False, True], template="wizardmath_cot")
    with pytest.raises(compare.NotComparable, match="different problems"):
        compare.compare({"base": base, "other": other})
    with pytest.raises(compare.NotComparable, match="template"):
        compare.compare({"base": base, "cot": cot})
    with pytest.raises(compare.NotComparable, match="at least two"):
        compare.compare({"base": base})


@pytest.mark.long("the compare command in fresh processes, its table and one-line refusals: ~10 s CPU measured")
def test_cli_prints_the_table_and_refuses_bad_runs_in_one_line(tmp_path):
    base = _run(tmp_path / "base", [False, True] * 20)
    sft = _run(tmp_path / "sft", [True, True] * 20)
    cli = [sys.executable, "-m", "evolforge.cli", "compare"]
    ok = subprocess.run(cli + [f"base={base}", f"sft={sft}", "--out", str(tmp_path / "cmp")], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
    assert "| own | base -> sft | +50.0 |" in ok.stdout
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["policies"] == ["base", "sft"]
    bad = subprocess.run(cli + [f"base={base}", "sft"], capture_output=True, text=True)
    assert bad.returncode == 2 and "NAME=EVAL_OUT" in bad.stderr and "Traceback" not in bad.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run(cli + [f"base={base}", f"e={empty}"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no finished benchmark" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("wins, losses, p", [
    (18, 8, 0.07550),  # the previous learning run's base -> SFT: 18 wins, 8 losses
    (12, 3, 576 / 32768 * 2),  # 2 * (C(15,0)+C(15,1)+C(15,2)+C(15,3)) / 2**15
    (5, 0, 0.0625), (6, 0, 0.03125), (0, 6, 0.03125), (10, 10, 1.0), (0, 0, 1.0)])
def test_exact_mcnemar_against_known_values(wins, losses, p):
    assert compare.mcnemar_exact(wins, losses) == pytest.approx(p, abs=5e-5)


def test_a_goal_is_met_only_with_the_point_estimate_and_p_below_005(tmp_path):
    base = _run(tmp_path / "base", [False] * 80 + [True] * 20)
    sft = _run(tmp_path / "sft", [True] * 10 + [False] * 70 + [True] * 20)  # +10: 10 wins, 0 losses
    rl = _run(tmp_path / "rl", [True] * 14 + [False] * 66 + [True] * 20)  # +4: 4 wins, 0 losses (p = 0.125)
    res = compare.compare({"base": base, "sft": sft, "rl": rl}, goals={"sft": 5, "rl": 3})
    goals = {g["to"]: g for g in res["goals"]}
    assert goals["sft"]["mcnemar_p"] == pytest.approx(2 / 1024) and goals["sft"]["met"]
    assert goals["rl"]["at_or_above"] and not goals["rl"]["significant"] and not goals["rl"]["met"]
    assert not res["rleif_bar"][0]["met"] and res["rleif_bar"][0]["mcnemar_p"] == pytest.approx(0.125)
    # significant but below the goal: not met either
    big = compare.compare({"base": base, "sft": sft}, goals={"sft": 12})["goals"][0]
    assert big["significant"] and not big["at_or_above"] and not big["met"]
    text = compare.markdown(res)
    assert "Goal on own (sft over base, +5 points of pass@1): measured +10.0 points" in text
    assert "exact McNemar p = 0.125); not met (point estimate at or above the goal, p >= 0.05)" in text
    with pytest.raises(compare.NotComparable, match="goal for"):
        compare.compare({"base": base, "sft": sft}, goals={"base": 1})


def test_cli_takes_goals(tmp_path):
    base = _run(tmp_path / "base", [False] * 30 + [True] * 10)
    sft = _run(tmp_path / "sft", [True] * 8 + [False] * 22 + [True] * 10)
    ok = subprocess.run([sys.executable, "-m", "evolforge.cli", "compare", f"base={base}", f"sft={sft}",
                         "--goal", "sft=5"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "exact McNemar p = 0.0078); met" in ok.stdout
