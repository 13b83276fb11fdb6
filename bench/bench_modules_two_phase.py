"""DeCoRL's training half, at the scale of this machine: two-phase training of a small policy on module outputs.

    flock /tmp/bench.lock .venv/bin/python bench/bench_modules_two_phase.py [--train 64] [--eval 48] [--samples 4]
        [--max-new-tokens 64] [--epochs 2] [--out runs/modules-two-phase]

The policy is SmolLM2-135M-Instruct, the embedded model converted to transformers (the SFT stage's base policy,
tasks/core/policy.py), on the CPU. The problems are the learning run's arithmetic word problems
(testing/arithmetic_tasks.split_problems): training problems come from 11 template families, and the held-out
evaluation problems come from the other 5 families, which are never trained on. No evaluation problem shares its
numbers and answer with a training problem. Every answer is computed twice (the generator's formula, and a program
written from the text).

The graph is two modules. The 135M model fails the modules stage's JSON schema (docs/modules.md), so they answer
in plain text:
  compute (steps)   the question -> the calculation as equations, one per line ("3 * 4 = 12");
  answer  (final)   the question + compute's output in context -> "The answer is: N".
The judge gives 10 when the answer's final number equals the verified answer, else 0. It is exact, not an LLM
judge: the 135M model cannot judge. compute's contribution = judge(answer with compute) - judge(answer re-run with
"[module compute removed]" in compute's place); this is the recompute ablation. compute's local reward comes from
tasks/modules/local_reward.py: schema = 1 when it wrote at least one line, own = its stated arithmetic re-done
(1 all right / 0 any wrong / null none stated), weight 0.5.

  phase 1  sample --samples compute outputs per training problem (temperature --temperature) and run the answer
           module (greedy) on each. A sample is kept with weight 0.5 * local_reward + 0.5 * max(contribution, 0)
           / 10 when its own arithmetic check is 1 or its contribution is positive. Then reward-weighted SFT (loss on
           the completion tokens, scaled by the weight) of the compute prompt -> output.
  phase 2  with the phase-1 model: compute greedy per training problem, then --samples answers at the temperature
           with compute's output in context. Answers judged 10 are kept (weight 1), and the model is fine-tuned on
           the answer prompt -> answer.
  eval     on the held-out problems, greedy: single-shot (the project's step prompt, tasks/problems/prompts.py, on
           the base model), the modules on the base model, after phase 1, and after phase 2. For each: the judged
           score (share judged 10) with its Wilson 95% interval, and compute's mean local reward and contribution.

Writes bench/results/modules_two_phase.json: settings, command, the split (ids and families), every held-out
item's raw result per arm (texts, numbers, judged score, local reward parts, contribution), the training rows'
counts, timings and `uptime` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]

from evolforge.tasks.eval.scoring import wilson  # noqa: E402
from evolforge.tasks.modules.local_reward import local_reward  # noqa: E402
from evolforge.tasks.problems.prompts import task_messages  # noqa: E402
from evolforge.tasks.text.answers import extract_answer, parse_number, same_number  # noqa: E402
from evolforge.testing.arithmetic_tasks import split_problems  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "modules_two_phase.json"
REMOVED = "[module compute removed]"
COMPUTE = ("You are the compute module. Write the calculation that answers the question as equations, one per "
           "line, like '3 * 4 = 12'.\n\nQuestion: {q}")
ANSWER = ("You are the answer module. Use the compute module's output to answer the question. End with 'The answer "
          "is: N'.\n\nQuestion: {q}\n\n[compute] {c}")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def chat(text: str) -> dict:
    return {"chat": [{"role": "user", "content": text}]}


def judged(text: str, truth) -> float:
    """10 when the final answer (else the last number) equals the verified answer, else 0."""
    got = parse_number(extract_answer(text, fallback_last_number=True))
    return 10.0 if same_number(got, float(truth)) else 0.0


def compute_record(text: str) -> dict:
    """compute's plain-text output as a module record for tasks/modules/local_reward.py."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    ok = bool(lines)
    return {"id": "compute", "output_type": "steps", "status": "ok" if ok else "invalid",
            "reason": None if ok else "empty output",
            "output": json.dumps({"type": "steps", "content": lines, "confidence": 1.0}) if ok else None}


class Policy:
    """Greedy or sampled generation of a transformers folder (tasks/core/policy.LocalPolicy)."""

    def __init__(self, folder: Path, a, temperature: float = 0.0):
        from evolforge.tasks.core.policy import LocalPolicy

        self.a = a
        self.pol = LocalPolicy(folder, SimpleNamespace(threads=a.threads, batch_size=a.batch, max_new_tokens=a.max_new_tokens,
                                                       temperature=temperature or 1.0, top_p=0.95, seed=a.seed))

    def greedy(self, prompts: list[str]) -> list[str]:
        return [o[0].strip() for o in self.pol.generate([chat(p) for p in prompts], 1)]

    def sample(self, prompts: list[str], n: int, temperature: float) -> list[list[str]]:
        self.pol.cfg.temperature = temperature
        return [[t.strip() for t in o] for o in self.pol.generate([chat(p) for p in prompts], n)]


def modules_pass(pol: Policy, problems: list[dict]) -> list[dict]:
    """compute -> answer (greedy), and the answer without compute; judged score, local reward, contribution."""
    qs = [p["statement"] for p in problems]
    comp = pol.greedy([COMPUTE.format(q=q) for q in qs])
    full = pol.greedy([ANSWER.format(q=q, c=c) for q, c in zip(qs, comp)])
    without = pol.greedy([ANSWER.format(q=q, c=REMOVED) for q in qs])
    out = []
    for p, c, f, w in zip(problems, comp, full, without):
        s_full, s_without = judged(f, p["generator_answer"]), judged(w, p["generator_answer"])
        out.append({"id": p["id"], "family": p["family"], "truth": p["generator_answer"], "compute": c, "answer": f,
                    "answer_without_compute": w, "score": s_full, "score_without": s_without,
                    "contribution": s_full - s_without, **local_reward(compute_record(c), None, 0.5)})
    return out


def single_shot(pol: Policy, problems: list[dict]) -> list[dict]:
    msgs = [task_messages("math", p["statement"])[0]["content"] for p in problems]
    outs = pol.greedy(msgs)
    return [{"id": p["id"], "family": p["family"], "truth": p["generator_answer"], "answer": o,
             "score": judged(o, p["generator_answer"])} for p, o in zip(problems, outs)]


def summary_of(rows: list[dict]) -> dict:
    n = len(rows)
    k = sum(1 for r in rows if r["score"] == 10.0)
    lo, hi = wilson(k / n, n) if n else (None, None)
    out = {"n": n, "judged_10": k, "share": round(k / n, 4) if n else None,
           "ci95": [round(lo, 4), round(hi, 4)] if n else None,
           "mean_score": round(sum(r["score"] for r in rows) / n, 3) if n else None}
    if rows and "local_reward" in rows[0]:
        out["compute_mean_local_reward"] = round(sum(r["local_reward"] for r in rows) / n, 4)
        own = [r["local_parts"]["own"] for r in rows if r["local_parts"]["own"] is not None]
        out["compute_own_checked"] = len(own)
        out["compute_own_right"] = sum(1 for o in own if o == 1.0)
        out["compute_mean_contribution"] = round(sum(r["contribution"] for r in rows) / n, 3)
    return out


def finetune(base: Path, rows: list[dict], dest: Path, a) -> dict:
    """Reward-weighted SFT: loss on the completion tokens only, each row's mean token loss times its weight."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    data = []
    for r in rows:
        prompt = tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                         add_generation_prompt=True)
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        c_ids = tok(r["completion"] + tok.eos_token, add_special_tokens=False)["input_ids"]
        data.append((p_ids, c_ids, float(r["weight"])))
    rng, log, t0 = random.Random(a.seed), [], time.perf_counter()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for epoch in range(a.epochs):
        order = list(range(len(data)))
        rng.shuffle(order)
        for i in range(0, len(order), a.train_batch):
            batch = [data[j] for j in order[i:i + a.train_batch]]
            width = max(len(p) + len(c) for p, c, _ in batch)
            ids = torch.full((len(batch), width), pad)
            labels = torch.full((len(batch), width), -100)
            att = torch.zeros((len(batch), width), dtype=torch.long)
            for b, (p, c, _) in enumerate(batch):
                seq = p + c
                ids[b, :len(seq)] = torch.tensor(seq)
                labels[b, len(p):len(seq)] = torch.tensor(c)
                att[b, :len(seq)] = 1
            logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
            tgt = labels[:, 1:]
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                                    ignore_index=-100, reduction="none").view(tgt.shape)
            mask = (tgt != -100).float()
            per_row = (nll * mask).sum(1) / mask.sum(1).clamp(min=1)
            w = torch.tensor([x for _, _, x in batch])
            loss = (per_row * w).sum() / w.sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            log.append({"epoch": epoch, "step": len(log) + 1, "loss": round(loss.item(), 4)})
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return {"rows": len(rows), "steps": len(log), "seconds": round(time.perf_counter() - t0, 1), "log": log}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/modules-two-phase")
    ap.add_argument("--train", type=int, default=64, help="training problems (trained families)")
    ap.add_argument("--eval", type=int, default=48, help="held-out problems (held-out families)")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16, help="generation batch")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default=str(RESULTS), help="where the JSON goes")
    a = ap.parse_args()
    out = (ROOT / a.out) if not Path(a.out).is_absolute() else Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start, timings = time.perf_counter(), {}
    report = {"command": "python " + " ".join(sys.argv), "settings": vars(a), "uptime_before": uptime(),
              "machine": {"cpus": os.cpu_count()}}

    def step(name: str, t0: float) -> None:
        timings[name] = round(time.perf_counter() - t0, 1)
        print(f"[{name}] {timings[name]} s (total {time.perf_counter() - t_start:.0f} s) {uptime()}", flush=True)

    from evolforge.tasks.core.policy import find_policy_gguf, prepare_policy

    t0 = time.perf_counter()
    base = prepare_policy(find_policy_gguf(), out / "base_policy")
    train, held = split_problems(a.train, a.eval, seed=a.seed)
    overlap = {p["statement"] for p in train} & {p["statement"] for p in held}
    report["split"] = {"train_families": sorted({p["family"] for p in train}),
                       "held_out_families": sorted({p["family"] for p in held}),
                       "train_ids": [p["id"] for p in train], "held_out_ids": [p["id"] for p in held],
                       "shared_statements": len(overlap),
                       "held_out": [{k: p[k] for k in ("id", "family", "statement", "generator_answer")} for p in held]}
    step("setup", t0)

    results: dict[str, list[dict]] = {}
    t0 = time.perf_counter()
    pol = Policy(base, a)
    results["single_shot_base"] = single_shot(pol, held)
    results["modules_base"] = modules_pass(pol, held)
    step("eval_base", t0)

    # phase 1: compute outputs, rewarded by local reward + contribution
    t0 = time.perf_counter()
    qs = [p["statement"] for p in train]
    samples = pol.sample([COMPUTE.format(q=q) for q in qs], a.samples, a.temperature)
    flat = [(p, c) for p, cs in zip(train, samples) for c in cs]
    answers = pol.greedy([ANSWER.format(q=p["statement"], c=c) for p, c in flat])
    without = pol.greedy([ANSWER.format(q=q, c=REMOVED) for q in qs])
    wo_score = {p["id"]: judged(w, p["generator_answer"]) for p, w in zip(train, without)}
    p1_rows, p1_stats = [], {"samples": len(flat), "own_right": 0, "own_wrong": 0, "own_none": 0,
                             "positive_contribution": 0, "kept": 0}
    for (p, c), ans in zip(flat, answers):
        lr = local_reward(compute_record(c), None, 0.5)
        own = lr["local_parts"]["own"]
        p1_stats["own_right" if own == 1.0 else "own_wrong" if own == 0.0 else "own_none"] += 1
        contrib = judged(ans, p["generator_answer"]) - wo_score[p["id"]]
        p1_stats["positive_contribution"] += contrib > 0
        if own == 1.0 or contrib > 0:
            w = 0.5 * lr["local_reward"] + 0.5 * max(contrib, 0.0) / 10.0
            p1_rows.append({"id": p["id"], "prompt": COMPUTE.format(q=p["statement"]), "completion": c, "weight": w,
                            "local_reward": lr["local_reward"], "contribution": contrib})
    p1_stats["kept"] = len(p1_rows)
    step("phase1_sample", t0)
    t0 = time.perf_counter()
    report["phase1"] = {"data": p1_stats, "rows": p1_rows}
    p1_dir = out / "phase1"
    report["phase1"]["train"] = finetune(base, p1_rows, p1_dir, a) if p1_rows else {"rows": 0, "skipped": True}
    step("phase1_train", t0)
    del pol

    t0 = time.perf_counter()
    p1_src = p1_dir if p1_rows else base
    pol1 = Policy(p1_src, a)
    results["modules_phase1"] = modules_pass(pol1, held)
    step("eval_phase1", t0)

    # phase 2: the final answer with the (phase-1) modules' output in context, kept when judged 10
    t0 = time.perf_counter()
    comp = pol1.greedy([COMPUTE.format(q=q) for q in qs])
    ans = pol1.sample([ANSWER.format(q=q, c=c) for q, c in zip(qs, comp)], a.samples, a.temperature)
    p2_rows = [{"id": p["id"], "prompt": ANSWER.format(q=p["statement"], c=c), "completion": t, "weight": 1.0}
               for p, c, ts in zip(train, comp, ans) for t in ts if judged(t, p["generator_answer"]) == 10.0]
    report["phase2"] = {"data": {"samples": len(train) * a.samples, "kept": len(p2_rows),
                                 "problems_with_a_kept_answer": len({r["id"] for r in p2_rows})}, "rows": p2_rows}
    step("phase2_sample", t0)
    del pol1
    t0 = time.perf_counter()
    p2_dir = out / "phase2"
    report["phase2"]["train"] = finetune(p1_src, p2_rows, p2_dir, a) if p2_rows else {"rows": 0, "skipped": True}
    step("phase2_train", t0)

    t0 = time.perf_counter()
    pol2 = Policy(p2_dir if p2_rows else p1_src, a)
    results["modules_phase2"] = modules_pass(pol2, held)
    step("eval_phase2", t0)

    report["summary"] = {arm: summary_of(rows) for arm, rows in results.items()}
    report["results"] = results
    report["timings_s"] = timings
    report["total_min"] = round((time.perf_counter() - t_start) / 60, 1)
    report["uptime_after"] = uptime()
    Path(a.results).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    for arm, s in report["summary"].items():
        print(arm, json.dumps(s))
    print("wrote", a.results, f"in {report['total_min']} min")


if __name__ == "__main__":
    main()
