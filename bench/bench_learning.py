"""The learning run: does verified data forged by evolforge teach the embedded policy, on template families it never
trained on? base -> SFT (rejection sampling) -> SFT+GRPO, greedy pass@1 on held-out families.

    .venv/bin/python bench/bench_learning.py [--out runs/learning] [--train-problems 320] [--eval-problems 300]
        [--samples 8] [--grpo-steps 24] [--grpo-generations 8] ...      (the defaults are the full run)
    .venv/bin/python bench/bench_learning.py --table          # BENCHMARKS.md's learning table from learning.json

On this 2-core CPU machine, SmolLM2-135M-Instruct (the embedded model, its GGUF converted to transformers) is the
policy. Steps, each through the pipeline's own stages where one exists:
  1. tasks      16 template families of arithmetic word problems (testing/arithmetic_tasks.py); 5 families are held
                out whole for evaluation (ppo.held_out_seeds, so SFT, GRPO and eval share the split), no evaluation
                problem shares its numbers and answer with a training problem; each answer computed twice (the
                generator's formula, and a program written from the text, run in evolforge's sandbox) and kept only
                when both agree
  2. speed      greedy tokens/s of the base policy on one stream (batch 1) and batched (left padding)
  3. sft        `evolforge sft --tasks` with rejection sampling (--samples answers of the base policy per training
                task at --temperature, kept only when the final answer is the verified one and in step form)
  4. eval       `evolforge eval --policy BASE|SFT --tasks --benchmarks own`: greedy pass@1 on the held-out families
  5. grpo       TRL GRPOTrainer from the SFT model on training prompts whose base pass rate in step 3 lies within
                --grpo-pass-rate (reward spread inside a group), reward = the verified answer check alone; groups of
                --grpo-generations at --grpo-temperature; reward, its spread inside groups and KL logged per step
  6. eval rl    the same eval for the GRPO policy
  7. compare    `evolforge compare base=... sft=... rl=... --goal sft=5 --goal rl=3`: pass@1 with Wilson intervals,
                each change with a paired Newcombe interval and the exact McNemar p
Writes bench/results/learning.json: problems (every problem: id, template, split, numbers, answer), results (each
policy's greedy verdict on every eval problem), the format share (answers with a parseable final line), command,
seeds, settings, timings and the load (`uptime`) at every step; and bench/results/learning_reward.png (the GRPO
reward curve per step). A run below the full settings is labelled "scale": "scaled-down" in the file and the table.
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
PLOT = ROOT / "bench" / "results" / "learning_reward.png"
CLI = [sys.executable, "-m", "evolforge.cli"]
FULL = {"eval_problems": 300, "samples": 8, "grpo_generations": 8, "grpo_steps": 20}  # the bar for "full"
TABLE_START, TABLE_END = "<!-- learning-table:start -->", "<!-- learning-table:end -->"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def sh(cmd: list[str], log: Path) -> float:
    """Run a CLI command (its output to `log`); return wall seconds; stop the bench on failure."""
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}) after {seconds:.0f}s: {' '.join(cmd)}; see {log}")
    return round(seconds, 1)


def write_config(path: Path, a, held_out: list[str]) -> None:
    path.write_text(f"""
[ppo]
held_out_seeds = {json.dumps(held_out)}
split_seed = 42

[eval]
benchmarks = ["own"]
math_template = "evolforge_steps"
max_new_tokens = {a.max_new_tokens}
batch_size = {a.eval_batch}
threads = {a.threads}
seed = {a.seed}

[sft]
rejection_samples = {a.samples}
rejection_keep = {a.keep}
rejection_temperature = {a.temperature}
rejection_top_p = 1.0
rejection_max_new_tokens = {a.max_new_tokens}
rejection_batch_size = {a.sample_batch}
# the held-out families share no template with training, but every problem shares phrases like "How many ... does":
# the n-gram check reports those overlaps instead of dropping rows
decontaminate = "report"
epochs = {a.epochs}
learning_rate = {a.lr}
warmup_ratio = 0.03
batch_size = {a.sft_batch}
max_length = 384
threads = {a.threads}
save_steps = 200
seed = {a.seed}
""".lstrip())


def throughput(policy_dir: Path, prompts: list[dict], a) -> dict:
    """Greedy new tokens per second of one stream (batch 1) and of one batched generate call (left padding)."""
    from types import SimpleNamespace

    from evolforge.tasks.core.policy import LocalPolicy

    out = {}
    for name, batch, n in (("one_stream", 1, a.speed_single), ("batched", a.eval_batch, a.eval_batch)):
        cfg = SimpleNamespace(threads=a.threads, seed=a.seed, batch_size=batch, max_new_tokens=a.max_new_tokens,
                              temperature=1.0, top_p=1.0)
        pol = LocalPolicy(policy_dir, cfg)
        pol.generate(prompts[:n], 1)
        out[name] = {"batch_size": batch, "prompts": n, "new_tokens": pol.stats["new_tokens"],
                     "seconds": round(pol.stats["seconds"], 2), "tokens_per_second": round(pol.tokens_per_second(), 2)}
    out["speedup"] = round(out["batched"]["tokens_per_second"] / max(1e-9, out["one_stream"]["tokens_per_second"]), 2)
    return out


def pass_rates(sft_dir: Path) -> dict[str, float]:
    """task_id -> share of the base policy's rejection samples that were verified."""
    from evolforge.storage.sft_sets import SFTFolder, read_rows

    rows = read_rows(SFTFolder(sft_dir).rejection_samples) or []
    per: dict[str, list[int]] = {}
    for r in rows:
        per.setdefault(r["task_id"], []).append(bool(r["verified"]))
    return {k: sum(v) / len(v) for k, v in per.items()}


def grpo(a, out: Path, tasks_dir: Path, sft_model: Path, held_out: list[str]) -> dict:
    """GRPO from the SFT model on training prompts within the pass-rate band; reward = the verified answer check."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from evolforge.storage.synthesis_sets import read_kept_tasks
    from evolforge.tasks.ppo.data import build_prompt_rows
    from evolforge.tasks.ppo.local import grpo_train, use_threads
    from evolforge.tasks.ppo.reward import PPOReward

    train, test, _ = build_prompt_rows([], 0.1, 42, tasks=read_kept_tasks(tasks_dir), held_out=held_out)
    assert not {r["extra_info"]["lineage"]["seed_id"] for r in train} & set(held_out)
    rates = pass_rates(out / "sft")
    lo, hi = a.grpo_pass_rate
    band = [r for r in train if lo <= rates.get(str(r["extra_info"]["lineage"]["id"]), -1) <= hi]
    rest = [r for r in train if r not in band]
    random.Random(a.seed).shuffle(band)
    random.Random(a.seed + 1).shuffle(rest)
    need = a.grpo_steps * a.grpo_prompts
    rows = (band + rest)[:max(need, len(band))] if len(band) < need else band
    rows_path = out / "grpo" / "train.parquet"
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), rows_path)
    use_threads(a.threads)
    reward = PPOReward(irm=lambda qs: [1.0] * len(qs), prm=lambda ps, steps: [[1.0] for _ in steps],
                       answer_weight=1.0)
    result = grpo_train(sft_model, rows_path, reward, out / "grpo", steps=a.grpo_steps,
                        prompts_per_step=a.grpo_prompts, num_generations=a.grpo_generations,
                        max_completion_length=a.max_new_tokens, learning_rate=a.grpo_lr, beta=a.grpo_beta,
                        clip_ratio=0.2, temperature=a.grpo_temperature, max_prompts=len(rows), seed=a.seed)
    return {"train_prompts": len(train), "prompts_in_pass_rate_band": len(band), "prompts_used": len(rows),
            "pass_rate_band": [lo, hi], **{k: v for k, v in result.items() if k != "health"}}


def reward_plot(steps: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [s["step"] for s in steps if "reward" in s]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(xs, [s["reward"] for s in steps if "reward" in s], marker="o", label="mean reward (answer correct)")
    ax.plot(xs, [s.get("reward_std", float("nan")) for s in steps if "reward" in s], marker=".",
            label="reward std inside groups")
    ax2 = ax.twinx()
    ax2.plot(xs, [s.get("kl", float("nan")) for s in steps if "reward" in s], color="grey", ls="--", label="KL")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax2.set_ylabel("KL to the SFT policy")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    ax.set_title("GRPO from the SFT policy: reward per step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def verdicts(eval_dir: Path) -> tuple[dict[str, bool], float]:
    """problem_id -> greedy verdict, and the share of answers with a parseable final line ('The answer is ...')."""
    from evolforge.storage import eval_sets as store
    from evolforge.tasks.text.answers import extract_answer

    rows = store.read_rows(store.EvalFolder(eval_dir).results("own")) or []
    out = {str(r["problem_id"]): bool(r["passed"]) for r in rows if r["sample"] == 0}
    parse = [extract_answer(r["completion"]) is not None for r in rows if r["sample"] == 0]
    return out, (sum(parse) / len(parse) if parse else 0.0)


def scale_of(a) -> str:
    full = (a.eval_problems >= FULL["eval_problems"] and a.samples >= FULL["samples"]
            and a.grpo_generations >= FULL["grpo_generations"] and a.grpo_steps >= FULL["grpo_steps"])
    return "full" if full else "scaled-down"


def table(result: dict) -> str:
    """BENCHMARKS.md's learning table, from learning.json alone."""
    cmp_ = result["compare"]
    n = len(next(iter(result["results"].values())))
    fmt = result.get("format_share", {})
    lines = [f"Scale: **{result['scale']}** ({result['settings']['eval_problems']} eval problems from "
             f"{len(result['held_out_families'])} held-out families; rejection samples k = {result['settings']['samples']}; "
             f"GRPO {result['settings']['grpo_steps']} steps x {result['settings']['grpo_prompts']} prompts x "
             f"{result['settings']['grpo_generations']} completions). Command: `{result['command']}`.", "",
             "| policy | pass@1 (greedy, n = %d) | 95%% interval (Wilson) | parseable final line |" % n,
             "|---|---:|---|---:|"]
    for r in cmp_["rows"]:
        lo, hi = r["pass@1_ci95"]
        lines.append(f"| {r['policy']} | {100 * r['pass@1']:.1f}% | {100 * lo:.1f} to {100 * hi:.1f} | "
                     f"{100 * fmt.get(r['policy'], 0):.0f}% |")
    lines += ["", "| change | points | paired 95% interval (Newcombe) | exact McNemar p | wins / losses | goal | met |",
              "|---|---:|---|---:|---|---:|---|"]
    goals = {(g["from"], g["to"]): g for g in cmp_.get("goals", [])}
    for c in cmp_["changes"]:
        g = goals.get((c["from"], c["to"]))
        lo, hi = c["ci95_points"]
        lines.append(f"| {c['from']} -> {c['to']} | {c['points']:+.1f} | {lo:+.1f} to {hi:+.1f} | "
                     f"{c['mcnemar_p']:.3g} | {c['wins']} / {c['losses']} | "
                     f"{'+%g' % g['goal_points'] if g else ''} | {('yes' if g['met'] else 'no') if g else ''} |")
    t = result["timings_s"]
    lines += ["", "Timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in t.items()) +
              f"; total {result['total_min']} min. Load at each step: " +
              "; ".join(f"{k}: {v.split('load average:')[-1].strip()}" for k, v in result["uptime"].items()) + "."]
    sp = result.get("throughput")
    if sp:
        lines.append(f"Greedy generation of the base policy: {sp['one_stream']['tokens_per_second']} tokens/s on one "
                     f"stream, {sp['batched']['tokens_per_second']} tokens/s batched ({sp['batched']['batch_size']} "
                     f"prompts, left padding): {sp['speedup']}x.")
    return "\n".join(lines) + "\n"


def write_table(result_path: Path = RESULTS, doc: Path = ROOT / "BENCHMARKS.md") -> None:
    text = doc.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        sys.exit(f"{doc} has no {TABLE_START} ... {TABLE_END} block")
    body = table(json.loads(result_path.read_text()))
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    doc.write_text(head + TABLE_START + "\n" + body + TABLE_END + tail)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", action="store_true", help="only write BENCHMARKS.md's learning table from "
                    "bench/results/learning.json")
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("--train-problems", type=int, default=320)
    ap.add_argument("--eval-problems", type=int, default=300)
    ap.add_argument("--samples", type=int, default=8, help="rejection samples per training task")
    ap.add_argument("--keep", type=int, default=2, help="verified samples kept per task")
    ap.add_argument("--temperature", type=float, default=0.5, help="rejection sampling temperature (at 1.0 the 135M policy verified 2 of 128 samples)")
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--epochs", type=float, default=3)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--sft-batch", type=int, default=8)
    ap.add_argument("--sample-batch", type=int, default=4, help="tasks per batched generate call (each x --samples)")
    ap.add_argument("--eval-batch", type=int, default=32)
    ap.add_argument("--speed-single", type=int, default=2, help="prompts of the one-stream speed measurement")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the machine's 2 cores)")
    ap.add_argument("--grpo-steps", type=int, default=24)
    ap.add_argument("--grpo-prompts", type=int, default=1)
    ap.add_argument("--grpo-generations", type=int, default=8)
    ap.add_argument("--grpo-temperature", type=float, default=1.0)
    ap.add_argument("--grpo-lr", type=float, default=1e-5)
    ap.add_argument("--grpo-beta", type=float, default=0.04)
    ap.add_argument("--grpo-pass-rate", type=float, nargs=2, default=[0.1, 0.9], metavar=("LOW", "HIGH"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="go on over an --out a stopped run left (same settings): "
                    "finished steps are kept (their timings from timings.json)")
    a = ap.parse_args()
    if a.table:
        write_table()
        return 0
    out = (ROOT / a.out).resolve()
    if out.exists() and any(out.iterdir()) and not a.resume:
        sys.exit(f"{out} is not empty: choose another --out (or --resume)")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    from evolforge.config.settings import load_settings
    from evolforge.tasks.core.policy import find_policy_gguf, prepare_policy
    from evolforge.tasks.problems.prompts import task_messages
    from evolforge.testing import arithmetic_tasks as gen

    held_out = [f"family/{f}" for f in gen.HELD_OUT]
    write_config(out / "config.toml", a, held_out)
    cfg = ["--config", str(out / "config.toml")]
    parts = out / "timings.json"
    done = json.loads(parts.read_text()) if a.resume and parts.exists() else {"timings": {}, "uptime": {}}
    timings, loads = done["timings"], {**done["uptime"], f"start{'_resumed' if a.resume else ''}": uptime()}
    t_start = time.perf_counter()

    def step(name: str, seconds: float) -> None:
        timings[name] = round(seconds, 1)
        loads[f"after_{name}"] = uptime()
        parts.write_text(json.dumps({"timings": timings, "uptime": loads}))
        print(f"{name}: {timings[name]}s; {loads[f'after_{name}']}", flush=True)

    def todo(name: str, marker: Path) -> bool:
        return not (a.resume and name in timings and marker.exists())

    t0 = time.perf_counter()
    train, evals = gen.split_problems(a.train_problems, a.eval_problems, a.seed)
    kept = gen.verify(train + evals, load_settings(str(out / "config.toml")).sandbox)
    gen.write_task_folder(out / "tasks", kept, lineage="family")
    kept_ids = {r["id"] for r in kept}
    step("tasks", time.perf_counter() - t0)
    print(f"tasks: {len(kept)} of {len(train) + len(evals)} verified in the sandbox", flush=True)
    tasks = ["--tasks", str(out / "tasks")]

    t0 = time.perf_counter()
    base = prepare_policy(find_policy_gguf(), out / "base_policy")
    if todo("speed", out / "speed.json"):
        speed = throughput(base, [{"chat": task_messages("math", r["statement"]), "stop": []} for r in evals], a)
        (out / "speed.json").write_text(json.dumps(speed))
        step("speed", time.perf_counter() - t0)
    speed = json.loads((out / "speed.json").read_text())

    if todo("sft", out / "sft" / "summary.json"):
        step("sft", sh(CLI + ["sft", *tasks, "--base-model", str(base), "--out", str(out / "sft"), *cfg],
                       logs / "sft.log"))
    for name, policy in (("base", base), ("sft", out / "sft" / "model")):
        if todo(f"eval_{name}", out / f"eval-{name}" / "data" / "own.parquet"):
            step(f"eval_{name}", sh(CLI + ["eval", "--policy", str(policy), *tasks, "--out",
                                           str(out / f"eval-{name}"), *cfg], logs / f"eval-{name}.log"))
    t0 = time.perf_counter()
    if todo("grpo", out / "grpo" / "result.json"):
        rl = grpo(a, out, out / "tasks", out / "sft" / "model", held_out)
        (out / "grpo" / "result.json").write_text(json.dumps(rl, default=str))
        step("grpo", time.perf_counter() - t0)
    rl = json.loads((out / "grpo" / "result.json").read_text())
    reward_plot(rl["steps"], PLOT)
    if todo("eval_rl", out / "eval-rl" / "data" / "own.parquet"):
        step("eval_rl", sh(CLI + ["eval", "--policy", rl["policy_dir"], *tasks, "--out", str(out / "eval-rl"),
                                  *cfg], logs / "eval-rl.log"))
    runs = [f"base={out / 'eval-base'}", f"sft={out / 'eval-sft'}", f"rl={out / 'eval-rl'}"]
    sh(CLI + ["compare", *runs, "--reference", "base", "--goal", "sft=5", "--goal", "rl=3", "--out",
              str(out / "compare")], logs / "compare.log")
    compare = json.loads((out / "compare" / "compare.json").read_text())
    sft_summary = json.loads((out / "sft" / "summary.json").read_text())
    results, fmt = {}, {}
    for name in ("base", "sft", "rl"):
        results[name], fmt[name] = verdicts(out / f"eval-{name}")
    split_of = {r["id"]: "eval" for r in evals} | {r["id"]: "train" for r in train}
    total = round(sum(timings.values()), 1)
    result = {
        "scale": scale_of(a), "full_scale_means": FULL,
        "command": "python bench/bench_learning.py " + " ".join(sys.argv[1:]),
        "seeds": {"problems": a.seed, "eval_problems": a.seed + 1, "split_seed": 42, "sft": a.seed,
                  "eval": a.seed, "grpo": a.seed},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": vars(a), "held_out_families": list(gen.HELD_OUT),
        "trained_families": [f.name for f in gen.FAMILIES if f.name not in gen.HELD_OUT],
        "problems": [{"id": r["id"], "template": r["family"], "split": split_of[r["id"]], "numbers": r["numbers"],
                      "answer": r["generator_answer"], "verified": r["id"] in kept_ids} for r in train + evals],
        "results": results, "format_share": {k: round(v, 4) for k, v in fmt.items()},
        "throughput": speed,
        "sft_data": sft_summary.get("data"),
        "sft_training": {k: (sft_summary.get("training") or {}).get(k)
                         for k in ("rows", "steps", "epochs", "train_loss", "train_seconds")},
        "grpo": {k: v for k, v in rl.items() if k != "steps"}, "grpo_steps": rl["steps"],
        "compare": compare, "timings_s": timings, "total_s": total, "total_min": round(total / 60, 1),
        "wall_s": round(time.perf_counter() - t_start, 1), "uptime": loads,
    }
    RESULTS.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(table(result))
    print(f"results: {RESULTS}; reward curve: {PLOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
