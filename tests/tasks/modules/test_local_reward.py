import json

from evolforge.tasks.modules.local_reward import arithmetic_check, local_reward, recompute


def rec(kind, content, status="ok", contribution=2.0):
    out = json.dumps({"type": kind, "content": content, "confidence": 0.9}) if status == "ok" else None
    return {"id": "m", "output_type": kind, "status": status, "reason": None if status == "ok" else "bad json",
            "output": out, "contribution": contribution}


def test_wrong_arithmetic_is_zero_even_with_positive_contribution():
    r = local_reward(rec("steps", ["3 * 4 = 13", "then 2 + 2 = 4"], contribution=3.0), weight=1.0)
    assert r["local_parts"]["own"] == 0.0 and r["local_reward"] == 0.0


def test_right_arithmetic_is_one():
    r = local_reward(rec("result", "12 / 4 = 3"), weight=0.5)
    assert r["local_parts"]["own"] == 1.0 and r["local_reward"] == 1.0


def test_code_injection_is_not_evaluated():
    score, reason = arithmetic_check("__import__('os').system('touch /tmp/pwn') = 0")
    assert score is None  # no arithmetic matched, nothing evaluated
    score, reason = arithmetic_check("(1).__class__ + 2 = 3")
    assert score in (None, 0.0)


def test_missing_output_is_zero_with_reason():
    r = local_reward(rec("steps", None, status="invalid"))
    assert r["local_reward"] == 0.0 and r["local_parts"]["schema_reason"] == "bad json"


def test_verdict_against_ground_truth_and_unknown():
    assert local_reward(rec("verdict", {"ok": True, "issues": []}), answer_correct=False)["local_parts"]["own"] == 0.0
    r = local_reward(rec("verdict", {"ok": True, "issues": []}))
    assert r["local_parts"]["own"] is None and r["local_parts"]["own_reason"] == "ground truth unknown"


def test_not_applicable_is_null_and_recompute_matches():
    for r in (local_reward(rec("concepts", ["a"])), local_reward(rec("steps", ["2 + 2 = 5"]), weight=0.3)):
        assert recompute(r["local_parts"], r["local_parts"]["weight"]) == r["local_reward"]
    assert local_reward(rec("concepts", ["a"]))["local_parts"]["own"] is None
