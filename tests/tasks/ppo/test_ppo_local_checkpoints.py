"""The local GRPO run ends with a policy `evolforge eval` loads, and with save_steps writes resumable checkpoints."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evolforge.testing.ppo_models import one_torch_thread  # noqa: F401 (autouse fixture)


@pytest.mark.long("three real TRL GRPO steps with checkpoints of a tiny policy (~24 s CPU on a loaded machine)")
def test_grpo_saves_checkpoints_and_a_final_policy_eval_loads(tmp_path):
    from evolforge.storage import ppo as store
    from evolforge.tasks.core.policy import LocalPolicy
    from evolforge.tasks.ppo import local
    from evolforge.tasks.ppo.data import build_prompt_rows
    from evolforge.tasks.ppo.reward import PPOReward
    from evolforge.testing.ppo_models import write_evolved
    from evolforge.testing.tiny_policy import build_tiny_policy

    train, _, _ = build_prompt_rows(store.read_evolved(write_evolved(tmp_path / "evolved.parquet")), 0.1, 42, True)
    store.write_prompt_parquet(train, tmp_path / "train.parquet")
    policy = build_tiny_policy(tmp_path / "policy")
    reward = PPOReward(lambda qs: [1.0] * len(qs), lambda ps, steps: [[0.5] for _ in steps])
    run = local.grpo_train(policy, tmp_path / "train.parquet", reward, tmp_path / "out", steps=3, prompts_per_step=2,
                           num_generations=2, max_completion_length=6, learning_rate=1e-4, beta=0.05, clip_ratio=0.2,
                           temperature=1.0, max_prompts=4, seed=0, save_steps=1)
    names = sorted(p.rsplit("/", 1)[-1] for p in run["checkpoints"])
    assert names == ["checkpoint-2", "checkpoint-3"]  # every step, the last two kept
    last = tmp_path / "out" / "trainer" / "checkpoint-3"
    assert (last / "optimizer.pt").is_file() and (last / "trainer_state.json").is_file()  # resumable
    cfg = SimpleNamespace(threads=1, seed=0, batch_size=2, max_new_tokens=4, temperature=1.0, top_p=1.0)
    eval_policy = LocalPolicy(run["policy_dir"], cfg)  # the folder evolforge eval --policy reads
    out = eval_policy.generate([{"raw": "Step 1:", "stop": []}, {"raw": "x", "stop": []}], 1)
    assert len(out) == 2 and eval_policy.stats["sequences"] == 2 and eval_policy.stats["new_tokens"] > 0
