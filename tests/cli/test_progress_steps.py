"""Live progress of the commands without batches (`trajectories`, `train-reward`, `ppo`): each long step is a
StepProgress (tasks/core/progress.py) on the same channel as the batched stages, so a non-terminal gets plain lines
with done / total counting up to the right total, and the Prefect progress artifact gets the same line."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from evolforge.cli import main
from evolforge.tasks.core.progress import StepProgress, progress_line
from evolforge.testing.lazy import lazy_module

openai = lazy_module("openai")

pytestmark = pytest.mark.usefixtures("prefect_harness")


def step_lines(out: str, what: str, unit: str) -> list[tuple[int, int, str]]:
    """(done, total, line) of every plain progress line of `what`."""
    found = []
    for line in out.splitlines():
        m = re.match(rf"{re.escape(what)}: (\d+)/(\d+) {unit} \(\d+%\), ", line)
        if m:
            found.append((int(m.group(1)), int(m.group(2)), line))
    return found


def assert_counts_up(lines: list[tuple[int, int, str]], total: int) -> None:
    assert lines, "no progress line"
    done = [d for d, _, _ in lines]
    assert {t for _, t, _ in lines} == {total}, lines
    assert done == sorted(done) and done[-1] == total and len(set(done)) >= 2, lines
    assert re.search(r", done in \dm\d\ds$", lines[-1][2]) and "ETA " in lines[0][2]
    assert all("\x1b[" not in ln for _, _, ln in lines)


def latest_artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert arts, f"no artifact {key}"
    return max(arts, key=lambda a: a.updated)


def test_step_progress_numbers_and_line():
    p = StepProgress("train irm", 40, "steps")
    p.started -= 10.0
    p.update(5, detail="loss 0.69")
    snap = p.snapshot()
    assert snap["records_done"] == 5 and snap["fraction"] == pytest.approx(0.125)
    assert snap["eta_s"] == pytest.approx(70, rel=0.05)  # 35 steps at 0.5 / s
    assert re.fullmatch(r"train irm: 5/40 steps \(12%\), 2\.0 s per step, loss 0\.69, ETA 1m1\ds", progress_line(snap))
    p.update(advance=35)
    p.finish()
    snap = p.snapshot()
    assert snap["finished"] and snap["fraction"] == 1.0 and snap["eta_s"] == 0.0
    assert progress_line(snap).startswith("train irm: 40/40 steps (100%), 4.00 steps/s, loss 0.69, done in 0m1")
    # an unknown total: no ETA, the count is the total once finished
    q = StepProgress("x", None, "sessions")
    q.update(3)
    assert progress_line(q.snapshot()).startswith("x: 3/? sessions (0%)") and q.snapshot()["eta_s"] is None
    q.finish()
    assert q.snapshot()["records_total"] == 3


def test_plain_view_prints_at_most_fifty_lines_for_many_steps():
    import io

    from evolforge.cli.progress import PlainProgress

    buf = io.StringIO()
    view = PlainProgress(buf)
    p = StepProgress("many", 10_000, "conversations")
    for i in range(10_001):
        view(p.snapshot() | {"records_done": i})
    p.done = 10_000
    p.finished = True
    view(p.snapshot())
    lines = buf.getvalue().splitlines()
    assert 50 <= len(lines) <= 52 and lines[-1].startswith("many: 10000/10000 conversations (100%)")


# ------------------------------------------------------------------------------------------- trajectories
@pytest.mark.long("the trajectories command with its real token sampling, measured at 17-18 s CPU")
def test_trajectories_command_shows_sessions_and_token_samples(tmp_path, capsys):
    from evolforge.storage.proxy_sets import ProxyLayout, iter_records
    from evolforge.tasks.proxy.server import running_proxy
    from evolforge.testing.agent_upstream import AgentUpstream
    from evolforge.testing.settings import make_settings

    rec = tmp_path / "rec"
    sessions = [f"s{i}" for i in range(6)]
    with AgentUpstream() as up, running_proxy(make_settings(), up.base_url, str(rec)) as url:
        for i, session in enumerate(sessions):
            client = openai.OpenAI(base_url=f"{url}/s/{session}/v1", api_key="sk-test", max_retries=0)
            client.chat.completions.create(model="agent-model",
                                           messages=[{"role": "user", "content": f"Name {i + 2} rivers in Asia"}])
        with httpx.Client(base_url=url, timeout=10) as h:
            for session in sessions:
                assert h.post(f"/s/{session}/finish").status_code == 200
        deadline = time.time() + 10
        while len(list(iter_records(ProxyLayout(rec)))) < len(sessions) and time.time() < deadline:
            time.sleep(0.05)
    out = tmp_path / "out"
    rc = main(["trajectories", "--proxy-out", str(rec), "--out", str(out), "--no-dedup"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert_counts_up(step_lines(captured.out, "trajectories sessions", "sessions"), 6)
    assert_counts_up(step_lines(captured.out, "trajectories token samples", "conversations"), 6)
    art = latest_artifact("trajectories-progress-trajectories-sessions")  # the same line, same snapshot
    assert art.data == 100 and art.description == step_lines(captured.out, "trajectories sessions", "sessions")[-1][2]
    assert art.description.startswith("trajectories sessions: 6/6 sessions (100%)") and "6 exported" in art.description


# ------------------------------------------------------------------------------------------- train-reward
def test_train_reward_command_shows_optimizer_steps(tmp_path, server, capsys):
    from evolforge.testing.evolved_runs import TINY_TRAINING, evolve_folder

    cfg = tmp_path / "config.toml"
    training = {**TINY_TRAINING, "irm_max_steps": 4}
    cfg.write_text("[reward]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in
                                          {"batch_size": 4, "concurrency": 2, **training}.items())
                   + "[gateway]\nbackoff_base_seconds = 0.0\ntimeout_seconds = 2.0\n")
    out = tmp_path / "reward"
    assert main(["reward-data", "--evolve-out", str(evolve_folder(tmp_path)), "--out", str(out),
                 "--base-url", server.base_url, "--config", str(cfg)]) == 0
    capsys.readouterr()
    rc = main(["train-reward", "--data", str(out), "--models", "irm", "--config", str(cfg)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    irm = step_lines(captured.out, "train irm", "steps")  # (the PRM goes through the same callback)
    assert_counts_up(irm, 4)
    assert re.search(r"train loss [\d.]+", irm[-1][2])
    art = latest_artifact("train-reward-progress-train-irm")
    assert art.data == 100 and art.description == irm[-1][2]
    assert art.description.startswith("train irm: 4/4 steps (100%)") and "train loss" in art.description


# ---------------------------------------------------------------------------------------------------- ppo
@pytest.mark.long("real GRPO steps through the ppo command: 6 to 12 s of CPU measured (load 2 to 4)")
def test_ppo_command_shows_grpo_steps(tmp_path, capsys):
    import torch

    from evolforge.storage.ppo import PPOLayout
    from evolforge.testing.ppo_models import shared_reward_models, write_evolved
    from evolforge.testing.tiny_policy import build_tiny_policy

    threads = torch.get_num_threads()
    evolved = write_evolved(tmp_path / "evolve" / "dataset" / "evolved.parquet", n_seeds=6)
    out = tmp_path / "ppo"
    build_tiny_policy(PPOLayout(out).base_policy)  # the base policy the flow reuses (no GGUF conversion)
    cfg = tmp_path / "config.toml"
    cfg.write_text("[ppo]\nlocal_max_completion_length = 8\nlocal_eval_max_new_tokens = 8\nlocal_torch_threads = 1\n")
    try:
        rc = main(["ppo", "--evolved", str(evolved), "--reward-dir", str(shared_reward_models()), "--out", str(out),
                   "--local-steps", "3", "--config", str(cfg)])
    finally:
        torch.set_num_threads(threads)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    grpo = step_lines(captured.out, "GRPO", "steps")
    assert_counts_up(grpo, 3)
    assert re.search(r"reward [\d.e-]+", grpo[-1][2]), grpo
    assert_counts_up(step_lines(captured.out, "GRPO held-out comparison", "policies"), 2)
    art = latest_artifact("ppo-progress-grpo")
    assert art.data == 100 and art.description.startswith("GRPO: 3/3 steps (100%)")


def test_rich_bar_of_a_stage_without_batches():
    import io

    from rich.console import Console

    from evolforge.cli.progress import live_progress
    from evolforge.tasks.core.progress import counting

    buf = io.StringIO()
    with live_progress(console=Console(file=buf, force_terminal=True, width=200, color_system="standard")):
        with counting("train prm", 4, "steps") as p:
            for i in range(1, 5):
                p.update(i, detail=f"loss {1 / i:.3f}")
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    assert re.search(r"train prm .*4/4 steps .*steps/s .*loss 0\.250 .*done \dm\d\ds", plain), plain[-1000:]
