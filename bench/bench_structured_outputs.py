"""Structured outputs on the embedded model: how many replies of each JSON call kind are valid.

    flock /tmp/evolforge-bench.lock .venv/bin/python -u bench/bench_structured_outputs.py --label after \
        [--questions 6] [--n 40] [--kinds modules,equal,synthesis,irm,prm]

The embedded model (SmolLM2-135M-Instruct, started by the project: llama-server when built) with the default
settings (embedded.max_new_tokens 128) answers every call kind through the gateway, the stages' own prompts and
code:
  - modules: `solve_item` on `--questions` math seeds (nine modules each, modules.max_reasks 1, max_tokens 128: the
    settings of the slow test that gave 0 valid outputs of 18); a module output counts as schema-valid when the
    stage's `validate_reply` took it (within one re-ask), and also reported: valid at the first call; the
    module-graph judge's scores that parse;
  - equal: `evolve_record` (rewrite, then the Equal judge; the answer call off) on `--n` sample seeds x rounds; a
    verdict parses when it is Equal or Not Equal (not 'unparseable'); only rewrites that pass the cheap rules
    reach the judge, so also equal_direct: the judge's call (as evolution.py makes it) on `--equal-n` fixed pairs;
  - synthesis: the code and the math proposal calls (`--n` each, the sample seeds of that domain, the stage's
    temperature and token cap); a proposal parses when it passes synthesize.py's check (a JSON object whose keys
    the task needs are non-empty strings; math: the problem);
  - irm: `--n` rankings of 3 versions (a seed and two fixed rewrites) read by `parse_ranking`;
  - prm: `--n` step-label calls on 3-step answers read by `parse_step_labels`, and `--n` DeCoRL scores
    (`parse_score`).
It runs against whatever evolforge is on the path: the tree of this checkout, or an older one to measure the
behaviour before structured outputs (`git worktree add /tmp/before/evolforge COMMIT` and
`PYTHONPATH=/tmp/before`): a tree without tasks/core/structured.py gets the calls of its day (json_object, the
Equal judge as text). Writes bench/results/structured_outputs_<label>.json and prints it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
GOALS = {"modules_valid_share": 0.90, "synthesis_parse_share": 0.95, "equal_parse_share": 0.99}
VARIANTS = (" Explain each step of your answer.", " Answer in one short sentence.")
ANSWER_STEPS = ["Read the numbers in the question.", "Add them together to get the total.",
                "Check the total against the question."]


def share(k: int, n: int) -> float | None:
    return round(k / n, 4) if n else None


def has_structured() -> bool:
    return importlib.util.find_spec("evolforge.tasks.core.structured") is not None


def kw_schema(model) -> dict:
    return {"schema": model} if has_structured() and model is not None else {}


def bench_modules(gw, settings, seeds, questions: int) -> dict:
    from evolforge.tasks.modules.run import solve_item

    rows = [{"id": s["id"], "question": s["instruction"]} for s in seeds if s["domain"] == "math"][:questions]
    with ThreadPoolExecutor(2) as pool:
        items = list(pool.map(lambda r: solve_item(r, gw, settings), rows))
    mods = [m for it in items for m in it["modules"]]
    ok = [m for m in mods if m["status"] == "ok"]
    first = [m for m in ok if m.get("reasks", 0) == 0 and m.get("truncations", 0) == 0]
    statuses: dict = {}
    for m in mods:
        statuses[m["status"]] = statuses.get(m["status"], 0) + 1
    judged = sum(it["judge_calls"] for it in items)
    judge_failed = sum(len(it["judge_errors"]) for it in items)
    reasons = [m["reason"] for m in mods if m["status"] != "ok"][:6]
    return {"questions": len(items), "outputs": len(mods), "valid": len(ok), "valid_share": share(len(ok), len(mods)),
            "valid_first_call": len(first), "by_status": statuses,
            "items_by_status": {s: sum(it["status"] == s for it in items) for s in {it["status"] for it in items}},
            "judge_calls": judged, "judge_scores_parsed": judged - judge_failed,
            "judge_parse_share": share(judged - judge_failed, judged), "example_failures": reasons}


def bench_equal(gw, settings, seeds, n: int) -> dict:
    from evolforge.tasks.evolve.evolution import evolve_record

    cfg = settings.evol_instruct.model_copy(update={"answer": False, "equal_check": True})
    pool_rows = [{"id": f"{s['id']}-r{r}", "instruction": s["instruction"], "seed_id": s["id"],
                  "domain": s["domain"], "generation": 0} for r in range(n // len(seeds) + 1) for s in seeds][:n]
    with ThreadPoolExecutor(8) as pool:
        evos = list(pool.map(lambda row: evolve_record(row, 1, gw, cfg), pool_rows))
    judged = [e for e in evos if e.judge_verdict is not None]
    parsed = [e for e in judged if e.judge_verdict != "unparseable"]
    return {"evolutions": len(evos), "judged": len(judged), "parsed": len(parsed),
            "parse_share": share(len(parsed), len(judged)),
            "verdicts": {v: sum(e.judge_verdict == v for e in judged) for v in ("equal", "not_equal", "unparseable")}}


def bench_equal_direct(gw, settings, seeds, n: int) -> dict:
    """The Equal judge alone on `n` fixed pairs (a seed and itself, or with one of two sentences added), so its
    parse rate is measured on more calls than the rewrites that survive the cheap rules give."""
    from evolforge.tasks.evolve import elimination as rules
    from evolforge.tasks.evolve import prompts

    new = hasattr(rules, "parse_equal_reply")

    def one(i):
        parent = seeds[i % len(seeds)]["instruction"]
        child = parent + ("", *VARIANTS)[(i // len(seeds)) % 3]
        if new:  # the call of tasks/evolve/evolution.py after structured outputs
            res = gw.chat("judge", prompts.equal_messages(parent, child), task_id=f"bench-eq-{i}", purpose="equal",
                          max_tokens=rules.EQUAL_JUDGE_MAX_TOKENS, temperature=0.0, schema=rules.EqualVerdict)
            return rules.parse_equal_reply(res.text)
        res = gw.chat("judge", prompts.equal_messages(parent, child), task_id=f"bench-eq-{i}", purpose="equal",
                      max_tokens=8, temperature=0.0)  # the call before
        return rules.parse_equal_verdict(res.text)

    with ThreadPoolExecutor(8) as pool:
        verdicts = list(pool.map(one, range(n)))
    parsed = sum(v is not None for v in verdicts)
    return {"calls": n, "parsed": parsed, "parse_share": share(parsed, n),
            "verdicts": {str(v): verdicts.count(v) for v in ("equal", "not_equal", None)}}


def bench_synthesis(gw, settings, seeds, n: int) -> dict:
    from evolforge.tasks.synthesis import prompts as P

    schemas = {}
    if has_structured():
        from evolforge.tasks.synthesis.schemas import code_proposal_model, math_proposal_model

        budget = gw.max_tokens_for(settings.synthesis.max_new_tokens)  # as synthesize.py sizes them
        schemas = {"code": code_proposal_model(budget), "math": math_proposal_model(budget)}
    cfg = settings.synthesis
    out = {}
    for kind, template, keys in (("code", P.PROPOSE_CODE, ("statement", "entry_point", "solution", "tests")),
                                 ("math", P.PROPOSE_MATH, ("problem",))):
        pool_seeds = [s for s in seeds if s["domain"] == kind]
        jobs = [(i, pool_seeds[i % len(pool_seeds)]) for i in range(n)]

        def one(job, template=template, kind=kind):
            i, seed = job
            parsed, res = gw.chat_json("synthesize", P.msg(template.format(instruction=seed["instruction"])),
                                       task_id=f"bench-{kind}-{i}", purpose="propose", temperature=cfg.temperature,
                                       max_tokens=cfg.max_new_tokens, **kw_schema(schemas.get(kind)))
            return parsed, res.finish_reason

        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(one, jobs))
        ok = [p for p, _ in replies if isinstance(p, dict) and all(isinstance(p.get(k), str) and p[k].strip()
                                                                  for k in keys)]
        valid = None
        if kind in schemas:
            from pydantic import ValidationError

            valid = 0
            for p, _ in replies:
                try:
                    schemas[kind].model_validate(p)
                    valid += 1
                except ValidationError:
                    pass
        out[kind] = {"calls": len(replies), "parsed": len(ok), "parse_share": share(len(ok), len(replies)),
                     "schema_valid": valid, "cut_at_max_tokens": sum(f == "length" for _, f in replies)}
    total, parsed = sum(v["calls"] for v in out.values()), sum(v["parsed"] for v in out.values())
    out["all"] = {"calls": total, "parsed": parsed, "parse_share": share(parsed, total)}
    return out


def bench_irm(gw, settings, seeds, n: int) -> dict:
    from evolforge.tasks.reward.irm import parse_ranking
    from evolforge.tasks.reward.prompts import labels_for, rank_messages

    schema = None
    if has_structured():
        from evolforge.tasks.reward.schemas import ranking_model

        schema = ranking_model(tuple(labels_for(3)), settings.reward.ask_scores)

    def one(i):
        seed = seeds[i % len(seeds)]["instruction"]
        labels = labels_for(3)
        versions = [seed] + [seed + v for v in VARIANTS]
        versions = versions[i % 3:] + versions[:i % 3]  # the original in every position
        parsed, _ = gw.chat_json("judge", rank_messages(list(zip(labels, versions)), settings.reward.ask_scores),
                                 expect=(dict, list), task_id=f"bench-irm-{i}", purpose="irm-rank",
                                 temperature=settings.reward.judge_temperature,
                                 max_tokens=settings.reward.judge_max_tokens, **kw_schema(schema))
        return parsed is not None and parse_ranking(parsed, labels)[2] is None

    with ThreadPoolExecutor(8) as pool:
        ok = sum(pool.map(one, range(n)))
    return {"calls": n, "valid_rankings": ok, "valid_share": share(ok, n)}


def bench_prm(gw, settings, seeds, n: int) -> dict:
    from evolforge.tasks.reward.prm import parse_step_labels
    from evolforge.tasks.reward.prompts import score_messages, step_label_messages
    from evolforge.tasks.text.scores import parse_score

    labels_schema = score_schema = None
    if has_structured():
        from evolforge.tasks.reward.schemas import JudgeScore, step_labels_model

        labels_schema, score_schema = step_labels_model(len(ANSWER_STEPS)), JudgeScore
    math = [s for s in seeds if s["domain"] == "math"]
    cfg = settings.reward

    def labels(i):
        parsed, _ = gw.chat_json("judge", step_label_messages(math[i % len(math)]["instruction"], ANSWER_STEPS),
                                 expect=(dict, list), task_id=f"bench-prm-{i}", purpose="prm-labels",
                                 temperature=cfg.judge_temperature, max_tokens=cfg.judge_max_tokens,
                                 **kw_schema(labels_schema))
        return parsed is not None and parse_step_labels(parsed, len(ANSWER_STEPS))[0] is not None

    def score(i):
        parsed, _ = gw.chat_json("judge", score_messages(math[i % len(math)]["instruction"], ANSWER_STEPS),
                                 expect=(dict, int, float, str), task_id=f"bench-score-{i}", purpose="prm-score",
                                 temperature=cfg.judge_temperature, max_tokens=cfg.judge_max_tokens,
                                 **kw_schema(score_schema))
        return parse_score(parsed) is not None

    with ThreadPoolExecutor(8) as pool:
        ok_labels = sum(pool.map(labels, range(n)))
        ok_scores = sum(pool.map(score, range(n)))
    return {"label_calls": n, "valid_labels": ok_labels, "labels_share": share(ok_labels, n),
            "score_calls": n, "valid_scores": ok_scores, "scores_share": share(ok_scores, n)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="after", help="names the results file (before / after)")
    ap.add_argument("--questions", type=int, default=6, help="module-DAG questions (nine modules each)")
    ap.add_argument("--n", type=int, default=40, help="calls per other kind")
    ap.add_argument("--equal-n", type=int, default=90, help="Equal-judge calls on fixed pairs (equal_direct)")
    ap.add_argument("--kinds", default="modules,equal,equal_direct,synthesis,irm,prm")
    a = ap.parse_args()

    import evolforge
    from evolforge.config.settings import SAMPLE_SEEDS, load_settings
    from evolforge.tasks.core.embedded_model import embedded_server
    from evolforge.tasks.core.gateway import Gateway
    from evolforge.tasks.core.llama_server import chosen_server

    tree = Path(evolforge.__file__).resolve().parent
    rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    settings = load_settings(overrides={"modules": {"max_reasks": 1, "max_tokens": 128}}, environ={})
    seeds = [json.loads(line) for line in open(SAMPLE_SEEDS)]
    result: dict = {"label": a.label, "tree": str(tree), "rev": rev, "structured_outputs": has_structured(),
                    "server": chosen_server(settings.embedded), "max_new_tokens": settings.embedded.max_new_tokens,
                    "load_average": {"start": [round(x, 2) for x in os.getloadavg()]}, "goals": GOALS}
    t0 = time.perf_counter()
    with embedded_server(settings.embedded, Path(tempfile.mkdtemp())) as url:
        gw = Gateway(settings, base_url=url, run_id=f"bench-structured-{a.label}",
                     embedded_models={settings.embedded.alias})
        benches = {"modules": lambda: bench_modules(gw, settings, seeds, a.questions),
                   "equal": lambda: bench_equal(gw, settings, seeds, a.n),
                   "equal_direct": lambda: bench_equal_direct(gw, settings, seeds, a.equal_n),
                   "synthesis": lambda: bench_synthesis(gw, settings, seeds, a.n),
                   "irm": lambda: bench_irm(gw, settings, seeds, a.n),
                   "prm": lambda: bench_prm(gw, settings, seeds, a.n)}
        for kind in a.kinds.split(","):
            start = time.perf_counter()
            result[kind] = benches[kind]()
            result[kind]["seconds"] = round(time.perf_counter() - start, 1)
            print(kind, json.dumps(result[kind]), f"(load {os.getloadavg()[0]:.2f})", flush=True)
        result["gateway"] = gw.stats.as_dict()
        if hasattr(gw, "structured_mode"):
            result["mode_in_use"] = gw.structured_mode()
        gw.close()
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["load_average"]["end"] = [round(x, 2) for x in os.getloadavg()]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"structured_outputs_{a.label}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
