"""Reward health during the GRPO run: the share of rA < 0.5 over the first steps and the reward drift, with the
reward stage's warn / stop policy. Hostile cases: rewards that collapse, rewards that stop varying."""

from __future__ import annotations

import json

import pytest

from evolforge.config.settings import Settings
from evolforge.tasks.core.health import RewardHealthError, enforce
from evolforge.tasks.ppo.training_health import TrainingHealth

# 30% of these are under 0.5: inside the healthy 20%-40% band, with a healthy spread
HEALTHY = [0.2, 0.7, 0.8, 0.9, 0.3, 0.75, 0.85, 0.6, 0.95, 0.4]


def _health(policy="warn", min_samples=8, steps=200):
    s = Settings()
    ppo = s.ppo.model_copy(update={"health_min_samples": min_samples, "health_steps": steps})
    return TrainingHealth(ppo, s.reward.model_copy(update={"health_policy": policy}), "min", 0.5)


def _rows(values, r_i=0.8, correct=None):
    return [{"r_i": r_i, "step_scores": [v], "correct": correct, "reward": r_i * v} for v in values]


def _feed(h, per_step, steps):
    """Feed `steps` steps of 4 completions, per_step(step) giving their PRM scores; returns the step a stop came at."""
    for step in range(1, steps + 1):
        h.observe(_rows(per_step(step)))
        h.end_step(step)
        if h.should_stop():
            return step
    return None


def _cycle(step):
    return [HEALTHY[(4 * (step - 1) + i) % len(HEALTHY)] for i in range(4)]


def test_healthy_rewards_pass_and_never_stop():
    h = _health("stop")
    assert _feed(h, _cycle, 10) is None
    report = h.report()
    assert report["passed"] and report["r_a"]["share_below_half"] == pytest.approx(0.3)
    assert {c["check"] for c in report["checks"]} == {"r_a_low_share", "reward_mean_drift", "reward_std_drift"}
    assert enforce(report, "stop") is None


@pytest.mark.parametrize("policy", ["warn", "stop"])
def test_collapsing_rewards_warn_or_stop_per_policy(policy):
    h = _health(policy)
    collapse = lambda step: _cycle(step) if step <= 4 else [0.01] * 4  # noqa: E731
    stopped = _feed(h, collapse, 12)
    report = h.report()
    assert not report["passed"]
    if policy == "stop":
        # steps 1-4 are healthy (16 completions), the first collapsed step already breaks the rA band
        assert stopped == 5 and report["stopped_at_step"] == 5
        with pytest.raises(RewardHealthError, match="rA are under 0.5"):
            enforce(report, policy)
    else:
        assert stopped is None and report["steps_watched"] == 12 and report["stopped_at_step"] is None
        failed = {c["check"] for c in report["checks"] if not c["passed"]}
        assert failed == {"r_a_low_share", "reward_mean_drift", "reward_std_drift"}
        assert report["drift"]["mean_change"] < -0.2 and report["drift"]["std_ratio"] == 0.0
        warning = enforce(report, policy)
        assert "collapsing" in warning and "no longer separates" in warning


def test_a_reward_that_does_not_tell_answers_apart_fails():
    h = _health("warn")
    _feed(h, lambda step: [0.93, 0.97, 0.95, 0.96], 6)
    report = h.report()
    low = next(c for c in report["checks"] if c["check"] == "r_a_low_share")
    assert not low["passed"] and "does not tell answers apart" in low["message"]


def test_rising_rewards_are_reported_not_failed():
    h = _health("stop")
    # the same 30% low share throughout, every score lifted in the later steps: training doing its job
    rising = lambda step: [min(1.0, v + (0.2 if step > 3 and v >= 0.5 else 0.0)) for v in _cycle(step)]  # noqa: E731
    assert _feed(h, rising, 8) is None
    report = h.report()
    assert report["passed"] and report["drift"]["mean_change"] >= 0


def test_only_the_first_steps_are_watched():
    h = _health("stop", steps=4)
    late_collapse = lambda step: _cycle(step) if step <= 4 else [0.0] * 4  # noqa: E731
    assert _feed(h, late_collapse, 8) is None
    report = h.report()
    assert report["passed"] and report["completions"] == 16 and report["steps_watched"] == 4


def test_ra_blends_the_answer_check_like_the_reward():
    h = _health("warn")
    h.observe([{"r_i": 0.5, "step_scores": [0.6, 0.9], "correct": False, "reward": 0.15}])
    assert h.r_a == [pytest.approx(0.5 * 0.6 + 0.5 * 0.0)] and h.rewards == [0.15]


# ---------------------------------------------------------------- inside the real GRPO trainer

class _CollapsingPRM:
    """Healthy step scores for the first `healthy_calls` reward batches, then 0.01 for everything."""

    def __init__(self, healthy_calls: int):
        self.healthy_calls, self.calls, self.n = healthy_calls, 0, 0

    def __call__(self, prompts, steps):
        self.calls += 1
        out = []
        for s in steps:
            v = HEALTHY[self.n % len(HEALTHY)] if self.calls <= self.healthy_calls else 0.01
            self.n += 1
            out.append([v] * max(1, len(s)))
        return out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    import torch

    from evolforge.storage import ppo as store
    from evolforge.tasks.ppo.data import build_prompt_rows
    from evolforge.testing.ppo_models import write_evolved
    from evolforge.testing.tiny_policy import build_tiny_policy

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("grpo-health")
    train, _, _ = build_prompt_rows(store.read_evolved(write_evolved(root / "evolved.parquet")), 0.1, 42, True)
    store.write_prompt_parquet(train, root / "train.parquet")
    return root, build_tiny_policy(root / "policy")


@pytest.mark.parametrize("policy", ["warn", "stop"])
def test_grpo_trainer_callback_stops_on_collapse_per_policy(tiny_run, tmp_path, policy):
    from evolforge.tasks.ppo import local
    from evolforge.tasks.ppo.reward import PPOReward

    root, policy_dir = tiny_run
    reward = PPOReward(lambda qs: [0.8] * len(qs), _CollapsingPRM(healthy_calls=2))
    health = _health(policy, min_samples=8)
    run = local.grpo_train(policy_dir, root / "train.parquet", reward, tmp_path, steps=6, prompts_per_step=2,
                           num_generations=2, max_completion_length=8, learning_rate=1e-4, beta=0.05,
                           clip_ratio=0.2, temperature=1.0, max_prompts=8, seed=0, health=health)
    steps = [s["step"] for s in run["steps"]]
    report = run["health"]
    assert not report["passed"] and json.dumps(report)  # JSON-ready for the summary
    # the trainer's own logged reward shows the collapse the watch saw
    assert run["steps"][0]["reward"] > 0.3 and run["steps"][2]["reward"] == pytest.approx(0.008, abs=1e-6)
    if policy == "stop":
        assert steps == [1, 2, 3] and run["stopped_early"] and report["stopped_at_step"] == 3
    else:
        assert steps == [1, 2, 3, 4, 5, 6] and not run["stopped_early"] and report["completions"] == 24
        assert not next(c for c in report["checks"] if c["check"] == "reward_mean_drift")["passed"]


# ---------------------------------------------------------------- the PPO flow

def _collapsed_reward_models(root):
    """The tiny reward models with a PRM that scores every step ~0 (its head pinned to the 'incorrect' label)."""
    import torch
    from transformers import AutoModelForTokenClassification

    from evolforge.testing.ppo_models import build_reward_models

    build_reward_models(root)
    prm_dir = root / "models" / "prm"
    prm = AutoModelForTokenClassification.from_pretrained(prm_dir)
    with torch.no_grad():
        prm.classifier.weight.zero_()
        prm.classifier.bias.copy_(torch.tensor([10.0, -10.0]))
    prm.save_pretrained(prm_dir)
    return root


@pytest.mark.usefixtures("prefect_harness")
def test_flow_reports_then_stops_on_collapsed_rewards(tmp_path, tiny_run, monkeypatch):
    """Policy stop: the GRPO run ends at its first step, summary.json and the Prefect artifacts carry the figures,
    then the flow fails with the health problem."""
    import shutil

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    from evolforge.flows.ppo import PPOParams, ppo_flow
    from evolforge.storage.ppo import PPOLayout, read_jsonl
    from evolforge.testing.ppo_models import write_evolved

    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "ppo"
    lay = PPOLayout(out)
    shutil.copytree(tiny_run[1], lay.base_policy)  # reused by the flow instead of converting the GGUF
    state = ppo_flow(PPOParams(
        evolved=str(write_evolved(tmp_path / "evolved.parquet")), reward_dir=str(_collapsed_reward_models(tmp_path / "rm")),
        out=str(out), local_steps=3,
        overrides={"reward": {"health_policy": "stop"},
                   "ppo": {"health_min_samples": 4, "local_max_completion_length": 8, "local_eval_max_new_tokens": 8}}),
        return_state=True)
    assert state.is_failed()
    with pytest.raises(RewardHealthError, match="100% of rA are under 0.5.*collapsed"):
        state.result()
    summary = json.loads(lay.summary.read_text())
    health = summary["training_health"]
    assert health["stopped_at_step"] == 1 and health["r_a"]["share_below_half"] == 1.0 and not health["passed"]
    assert summary["local_grpo"]["stopped_early"] and summary["local_grpo"]["comparison"] is None
    assert [s["step"] for s in read_jsonl(lay.metrics)] == [1]
    assert json.loads(lay.local_health.read_text()) == health
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["ppo-training-health", "ppo-summary"]),
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    by_key = {a.key: a.data for a in arts}
    table = by_key["ppo-training-health"]
    table = table if isinstance(table, list) else json.loads(table)
    assert {"check": "r_a_low_share", "passed": False} in [{k: r[k] for k in ("check", "passed")} for r in table]
    assert "training stopped at step 1" in by_key["ppo-summary"] and "GRPO smoke run" in by_key["ppo-summary"]


# ---------------------------------------------------------------- KL explosion (RLEIF: KL over 10 within 300 steps)

def _feed_kl(h, kls, per_step=_cycle):
    """Steps with healthy rewards, each followed by the trainer's log of its KL (as on_log comes after on_step_end)."""
    for step, kl in enumerate(kls, start=1):
        h.observe(_rows(per_step(step)))
        h.end_step(step)
        if h.should_stop():
            return step
        h.observe_log(step, {"loss": 0.0, "reward": 0.5, "kl": kl})
        if h.should_stop():
            return step
    return None


@pytest.mark.parametrize("policy", ["warn", "stop"])
def test_kl_explosion_warns_or_stops_per_policy(policy):
    h = _health(policy, min_samples=64)  # far more samples than seen: only the KL may stop this run
    stopped = _feed_kl(h, [0.01, 0.2, 0.5, 12.5, 30.0, 0.3])
    report = h.report()
    assert not report["passed"] and report["kl"]["max_step"] in (4, 5)
    kl_check = next(c for c in report["checks"] if c["check"] == "kl_explosion")
    assert not kl_check["passed"] and "KL reached 12.5 at step 4" in kl_check["message"]
    assert "lower the learning rate" in kl_check["message"] and "ppo.kl_coef" in kl_check["message"]
    if policy == "stop":
        assert stopped == 4 and report["stopped_at_step"] == 4 and report["kl"]["steps"] == 4
        with pytest.raises(RewardHealthError, match="KL exploded"):
            enforce(report, policy)
    else:
        assert stopped is None and report["kl"]["steps"] == 6 and report["kl"]["max"] == 30.0
        assert "KL exploded" in enforce(report, policy)


def test_kl_at_the_limit_passes_and_late_spikes_are_not_watched():
    h = _health("stop", min_samples=4)
    h.ppo = h.ppo.model_copy(update={"health_kl_steps": 3})
    assert _feed_kl(h, [1.0, 10.0, 9.9, 50.0, 80.0]) is None  # 10.0 is not above 10; steps 4-5 are past 300 (here 3)
    report = h.report()
    assert report["passed"] and report["kl"] == {"steps": 3, "max": 10.0, "max_step": 2, "last": 9.9, "limit": 10.0,
                                                 "within_steps": 3}


def test_no_logged_kl_no_kl_check():
    h = _health("stop")
    _feed(h, _cycle, 4)
    assert h.report()["kl"] is None and "kl_explosion" not in {c["check"] for c in h.report()["checks"]}


def _jolt(at_step: int, scale: float):
    """A TrainerCallback that scales the policy's output head after step `at_step`: the next step's rollouts come
    from a policy far from the reference one, so the KL the GRPO trainer computes and logs really spikes."""
    import torch
    from transformers import TrainerCallback

    class Jolt(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step == at_step:
                with torch.no_grad():
                    model.get_output_embeddings().weight.mul_(scale)

    return Jolt()


@pytest.mark.parametrize("policy", ["warn", "stop"])
def test_grpo_trainer_callback_acts_on_a_kl_spike_per_policy(tiny_run, tmp_path, policy):
    from evolforge.tasks.ppo import local
    from evolforge.tasks.ppo.reward import PPOReward

    root, policy_dir = tiny_run
    reward = PPOReward(lambda qs: [0.8] * len(qs), _CollapsingPRM(healthy_calls=10**6))  # healthy rewards throughout
    health = _health(policy, min_samples=64)  # the reward checks never get enough samples to stop anything
    health.ppo = health.ppo.model_copy(update={"health_max_kl": 2.0})  # the tiny policy's KL tops out near log(vocab)
    run = local.grpo_train(policy_dir, root / "train.parquet", reward, tmp_path, steps=5, prompts_per_step=2,
                           num_generations=2, max_completion_length=8, learning_rate=1e-6, beta=0.05,
                           clip_ratio=0.2, temperature=1.0, max_prompts=8, seed=0, health=health,
                           callbacks=[_jolt(at_step=2, scale=200.0)])
    kls = {s["step"]: s["kl"] for s in run["steps"]}
    assert kls[1] < 0.5 and kls[2] < 0.5 and kls[3] > 2.0  # the trainer's own logged KL spiked after the jolt
    report = run["health"]
    kl_check = next(c for c in report["checks"] if c["check"] == "kl_explosion")
    assert not report["passed"] and not kl_check["passed"] and "at step 3" in kl_check["message"]
    if policy == "stop":
        assert sorted(kls) == [1, 2, 3] and run["stopped_early"] and report["stopped_at_step"] == 3
    else:
        assert sorted(kls) == [1, 2, 3, 4, 5] and not run["stopped_early"] and report["stopped_at_step"] is None
