"""The learning run: does verified data forged by evolforge teach the embedded policy? base -> SFT -> SFT+GRPO.

    .venv/bin/python bench/bench_learning.py [--out runs/learning] [--problems 400] [--test-fraction 0.4]
                                             [--samples 2] [--keep 1] [--epochs 3] [--grpo-steps 8]

On this 2-core CPU machine, SmolLM2-135M-Instruct (the embedded model, its GGUF converted to transformers) is the
policy. Steps, each through the pipeline's own stages where one exists:
  1. tasks      arithmetic word problems (testing/arithmetic_tasks.py), each answer computed twice (the generator, and
                its program run in evolforge's sandbox) and kept only when both agree: a synthesis task folder
  2. sft        `evolforge sft --tasks` with rejection sampling (sft.rejection_samples answers of the base policy per
                training task, kept only when the final answer is the verified one and the answer is in step form)
  3. eval base  `evolforge eval --policy BASE --tasks --benchmarks own`: greedy pass@1 on the held-out lineages
  4. eval sft   the same for the SFT model
  5. grpo       TRL GRPOTrainer from the SFT model on the training tasks, reward = the verified answer check alone
                (tasks/ppo/reward.py PPOReward with rI = 1 and answer_weight 1: no reward model is trained here)
  6. eval rl    the same eval for the GRPO policy
  7. compare    `evolforge compare base=... sft=... rl=...`: pass@1 with Wilson intervals, each change with a paired
                95% interval (Newcombe)
Writes bench/results/learning.json (figures, commands, timings, load) and OUT/compare/compare.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "learning.json"
CLI = [sys.executable, "-m", "evolforge.cli"]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def sh(cmd: list[str], log: Path) -> float:
    """Run a CLI command (its output to `log`); return wall seconds; stop the bench on failure."""
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}) after {seconds:.0f}s: {' '.join(cmd)}; see {log}")
    return round(seconds, 1)


def write_config(path: Path, a) -> None:
    path.write_text(f"""
[ppo]
test_fraction = {a.test_fraction}
split_seed = 42

[eval]
benchmarks = ["own"]
math_template = "evolforge_steps"
max_new_tokens = {a.max_new_tokens}
batch_size = {a.eval_batch}
threads = {a.threads}

[sft]
rejection_samples = {a.samples}
rejection_keep = {a.keep}
rejection_temperature = {a.temperature}
rejection_max_new_tokens = {a.max_new_tokens}
rejection_batch_size = {a.sample_batch}
# the generated problems share their templates' words with the held-out ones by construction (other names and
# numbers): an 8-gram check would flag every row, so it reports here instead of dropping
decontaminate = "report"
epochs = {a.epochs}
learning_rate = {a.lr}
warmup_ratio = 0.03
batch_size = {a.sft_batch}
max_length = 384
threads = {a.threads}
save_steps = 100
""".lstrip())


def grpo(a, out: Path, tasks_dir: Path, sft_model: Path) -> dict:
    """GRPO from the SFT model on the training tasks' verl rows, reward = the verified answer check."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from evolforge.config.settings import load_settings
    from evolforge.storage.synthesis_sets import read_kept_tasks
    from evolforge.tasks.ppo.data import build_prompt_rows
    from evolforge.tasks.ppo.local import grpo_train, use_threads
    from evolforge.tasks.ppo.reward import PPOReward

    settings = load_settings(str(out / "config.toml"))
    train, test, _ = build_prompt_rows([], settings.ppo.test_fraction, settings.ppo.split_seed,
                                       tasks=read_kept_tasks(tasks_dir))
    rows_path = out / "grpo" / "train.parquet"
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(train), rows_path)
    use_threads(a.threads)
    reward = PPOReward(irm=lambda qs: [1.0] * len(qs), prm=lambda ps, steps: [[1.0] for _ in steps],
                       answer_weight=1.0)
    result = grpo_train(sft_model, rows_path, reward, out / "grpo", steps=a.grpo_steps,
                        prompts_per_step=a.grpo_prompts, num_generations=a.grpo_generations,
                        max_completion_length=a.max_new_tokens, learning_rate=a.grpo_lr, beta=a.grpo_beta,
                        clip_ratio=0.2, temperature=a.temperature, max_prompts=len(train), seed=0)
    return {"train_prompts": len(train), "held_out_prompts": len(test),
            **{k: v for k, v in result.items() if k not in ("health",)}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("--problems", type=int, default=400)
    ap.add_argument("--test-fraction", type=float, default=0.4)
    ap.add_argument("--samples", type=int, default=2, help="rejection samples per training task")
    ap.add_argument("--keep", type=int, default=1, help="verified samples kept per task")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--sft-batch", type=int, default=8)
    ap.add_argument("--sample-batch", type=int, default=16)
    ap.add_argument("--eval-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--grpo-steps", type=int, default=8)
    ap.add_argument("--grpo-prompts", type=int, default=4)
    ap.add_argument("--grpo-generations", type=int, default=4)
    ap.add_argument("--grpo-lr", type=float, default=2e-6)
    ap.add_argument("--grpo-beta", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="go on over an --out a killed run left: the stages keep "
                    "what they finished (the SFT rows and rejection samples, finished evals); settings given now apply "
                    "to the steps still to run")
    a = ap.parse_args()
    out = (ROOT / a.out).resolve()
    if out.exists() and any(out.iterdir()) and not a.resume:
        sys.exit(f"{out} is not empty: choose another --out (or --resume)")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if a.resume and (out / "config.toml").exists():
        (out / f"config.before-resume-{int(time.time())}.toml").write_text((out / "config.toml").read_text())
    write_config(out / "config.toml", a)
    cfg = ["--config", str(out / "config.toml")]
    t_start, timings, loads = time.perf_counter(), {}, {"start": load()}

    from evolforge.config.settings import load_settings
    from evolforge.testing import arithmetic_tasks as gen

    t0 = time.perf_counter()
    if a.resume and (out / "result-parts.json").exists():
        timings.update(json.loads((out / "result-parts.json").read_text()).get("timings_s", {}))
    generated = gen.problems(a.problems, a.seed)
    kept = gen.verify(generated, load_settings(str(out / "config.toml")).sandbox)
    tasks_path = gen.write_task_folder(out / "tasks", kept)
    timings["tasks"] = round(time.perf_counter() - t0, 1)
    print(f"tasks: {len(kept)} of {len(generated)} verified in the sandbox ({timings['tasks']}s)", flush=True)

    tasks = ["--tasks", str(out / "tasks")]

    def keep(step: str, seconds: float) -> None:  # timings so far, for a resumed run
        timings[step] = round(timings.get(step, 0.0) + seconds, 1)
        (out / "result-parts.json").write_text(json.dumps({"timings_s": timings}))

    keep("sft", sh(CLI + ["sft", *tasks, "--out", str(out / "sft"), *cfg], logs / "sft.log"))
    loads["after_sft"] = load()
    print(f"sft: {timings['sft']}s", flush=True)
    evals = {"base": out / "sft" / "base_policy", "sft": out / "sft" / "model"}
    for name, policy in evals.items():
        keep(f"eval_{name}", sh(CLI + ["eval", "--policy", str(policy), *tasks, "--out", str(out / f"eval-{name}"),
                                       *cfg], logs / f"eval-{name}.log"))
        print(f"eval {name}: {timings[f'eval_{name}']}s", flush=True)
    t0 = time.perf_counter()
    done = out / "grpo" / "result.json"
    if done.exists():
        rl = json.loads(done.read_text())
    else:
        rl = grpo(a, out, out / "tasks", out / "sft" / "model") if a.grpo_steps else None
        done.write_text(json.dumps(rl, default=str)) if rl else None
        keep("grpo", time.perf_counter() - t0)
    loads["after_grpo"] = load()
    if rl:
        print(f"grpo: {timings['grpo']}s", flush=True)
        keep("eval_rl", sh(CLI + ["eval", "--policy", rl["policy_dir"], *tasks, "--out", str(out / "eval-rl"),
                                  *cfg], logs / "eval-rl.log"))
    runs = [f"base={out / 'eval-base'}", f"sft={out / 'eval-sft'}"] + ([f"rl={out / 'eval-rl'}"] if rl else [])
    sh(CLI + ["compare", *runs, "--reference", "base", "--out", str(out / "compare")], logs / "compare.log")
    total = round(sum(timings.values()), 1)  # the steps' own wall time (a resumed run adds its parts)
    loads["end"] = load()
    compare = json.loads((out / "compare" / "compare.json").read_text())
    sft_summary = json.loads((out / "sft" / "summary.json").read_text())
    result = {
        "command": "python bench/bench_learning.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": vars(a), "tasks": {"generated": len(generated), "verified": len(kept), "path": str(tasks_path)},
        "sft_data": sft_summary.get("data"),
        "sft_training": {k: (sft_summary.get("training") or {}).get(k)
                         for k in ("rows", "steps", "epochs", "train_loss", "train_seconds")},
        "grpo": {k: v for k, v in (rl or {}).items() if k != "steps"} | (
            {"last_steps": (rl or {}).get("steps", [])[-3:]} if rl else {}),
        "compare": compare, "timings_s": timings, "total_s": total, "total_min": round(total / 60, 1),
        "this_invocation_s": round(time.perf_counter() - t_start, 1), "resumed": a.resume, "load": loads,
    }
    RESULTS.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print((out / "compare" / "compare.md").read_text())
    print(f"total {total / 60:.1f} min; load {loads}; results: {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
