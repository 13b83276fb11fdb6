"""One question through the module graph (DeCoRL): modules, aggregation Φ, contribution reward.

`solve_item(row, gw, settings, journal)` (a plain function a test calls with any gateway):
  1. forward pass (`run_graph`): every module starts as soon as its own dependencies have finished (a future per
     module on a thread pool of the item; no lock-step levels). Calls are bounded across items and modules by the
     gateway's own semaphore. Each call goes through `gw.chat` with the batch journal and the task id
     `<task>-<module>`, so a killed batch resumes without repeating a finished call.
  2. one module (`run_module`): a JSON-mode call; the reply is checked against the module's output schema
     (tasks/modules/schema.py). A reply that fails is re-asked with the validation error in the conversation, at
     most `modules.max_reasks` times; a reply cut by the budget (finish_reason 'length') is asked again with the
     budget doubled (up to `modules.max_tokens_cap`), never re-sent as is. Every failed attempt keeps its reason
     (`errors`); a module that never gets a valid output is `invalid` / `truncated` (or `error` when the endpoint
     rejected the request) and its dependants see `[module X failed: REASON]` in its place.
  3. aggregation Φ(trace) -> the answer the judge scores (`aggregate`):
     - integrate: "Final answer: <exit module's content>" + "Module trace:" + one line per other module;
     - concat: one line per module in dependency order, the exit's last.
  4. contribution of every non-exit module i: judge(Φ(full)) - judge(Φ(without i)), the judge model fixed by
     `modules.judge_model`; exactly 1 + k judge calls per question (k = non-exit modules), journaled.
     "Without i" (`modules.ablation`):
     - mask (default): i's trace line becomes `[i] [module i removed]`; its dependants are NOT re-run, so their
       lines (and the exit's final answer) stay as they were. The judge sees Φ of that trace: with integrate, the
       same final answer over a trace where only i's line changed. No extra module calls.
     - recompute: every descendant of i is re-run (same scheduling) seeing `[i] [module i removed]` in i's
       place, then Φ of the new trace (a new final answer when the exit descends from i). Extra module calls:
       the sum over i of i's descendant count (17 for the default nine, more with re-asks), task ids
       `<task>-<module>-without-<i>`.
A question whose exit module has no valid output is `failed` (not judged: 0 judge calls); one whose judge reply
holds no score is `judge_failed`; both keep the reason. Only an endpoint that is down, a refused key or retries
running out raise (the batch is retried; finished calls replay from the journal).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from evolforge.config.sections.modules import resolve_model
from evolforge.config.settings import Settings
from evolforge.storage.journal import CallJournal
from evolforge.tasks.core.batch import is_fatal, is_rejected_record
from evolforge.tasks.core.gateway import Gateway, GatewayError
from evolforge.tasks.modules.graph import ModuleGraph
from evolforge.tasks.modules.local_reward import local_reward
from evolforge.tasks.modules.prompts import (
    MARKER_MODULE_TRACE,
    content_text,
    failed_line,
    judge_messages,
    module_messages,
    reask_messages,
    removed_line,
    trace_line,
)
from evolforge.tasks.modules.schema import reply_model, validate_reply
from evolforge.tasks.text.scores import JudgeScore, parse_score

STAGE = "modules"              # ledger stage of the module calls
JUDGE_STAGE = "modules-judge"  # ledger stage of the contribution judge


@dataclass
class ModuleRun:
    id: str
    output_type: str
    model: str
    status: str = "ok"
    reason: str | None = None
    output: dict | None = None
    calls: int = 0
    reasks: int = 0
    truncations: int = 0
    max_tokens: int = 0
    errors: list[str] = field(default_factory=list)
    latency_s: float = 0.0
    started_s: float = 0.0
    finished_s: float = 0.0

    @property
    def line(self) -> str:
        """How dependants and the judge see this module."""
        if self.status == "ok" and self.output is not None:
            return trace_line(self.id, self.output_type, self.output["content"])
        return failed_line(self.id, self.reason)

    @property
    def text(self) -> str:
        """The content alone (the exit's final answer), or the failure marker."""
        if self.status == "ok" and self.output is not None:
            return content_text(self.output["content"])
        return failed_line(self.id, self.reason).split("] ", 1)[1]


@dataclass
class Item:
    """One question's context: everything its module and judge calls need."""

    gw: Gateway
    settings: Settings
    graph: ModuleGraph
    journal: CallJournal | None
    task: str
    question: str
    t0: float
    models: dict[str, str]
    judge_model: str

    @property
    def cfg(self):
        return self.settings.modules


def module_graph(settings: Settings) -> ModuleGraph:
    return ModuleGraph.from_settings(settings.modules)


def module_models(settings: Settings) -> dict[str, str]:
    """The model of every module, resolved (empty: the judge stage's; a stage name: that stage's)."""
    return {m.id: resolve_model(settings.models, m.model) for m in settings.modules.graph}


def judge_model(settings: Settings) -> str:
    return resolve_model(settings.models, settings.modules.judge_model)


# ---------------------------------------------------------------------------------------------- one module
def run_module(item: Item, module_id: str, inputs: dict[str, str], tag: str = "") -> ModuleRun:
    """One module: its call, schema re-asks, larger budgets for truncated replies. Never raises for a bad reply
    or a rejected request (the run keeps the reason); raises for a down endpoint or exhausted retries."""
    gw, cfg, spec = item.gw, item.cfg, item.graph.specs[module_id]
    started = time.perf_counter()
    run = ModuleRun(module_id, spec.output, item.models[module_id], started_s=round(started - item.t0, 4))
    messages = module_messages(module_id, spec.role, spec.output, item.question, spec.dependencies, inputs)
    budget = spec.max_tokens or cfg.max_tokens
    task_id = f"{item.task}-{module_id}" + (f"-without-{tag}" if tag else "")
    try:
        while True:
            res = gw.chat(STAGE, messages, task_id=task_id, purpose=f"module-{module_id}", model=run.model,
                          temperature=spec.temperature, max_tokens=budget, journal=item.journal,
                          schema=reply_model(spec.output, tuple(spec.dependencies), gw.max_tokens_for(budget)))
            run.calls += 1
            run.max_tokens = gw.max_tokens_for(budget)
            if res.finish_reason == "length":
                bigger = min(budget * 2, cfg.max_tokens_cap)
                if gw.max_tokens_for(bigger) <= run.max_tokens:
                    why = (f"reply cut at max_tokens {run.max_tokens} (finish_reason length); the budget cannot grow "
                           f"(modules.max_tokens_cap {cfg.max_tokens_cap}"
                           + (", embedded.max_new_tokens" if gw.max_tokens_for(bigger) < bigger else "") + ")")
                    run.errors.append(why)
                    return _finish(run, started, "truncated", why)
                run.errors.append(f"reply cut at max_tokens {run.max_tokens} (finish_reason length): "
                                  f"asked again with {gw.max_tokens_for(bigger)}")
                run.truncations += 1
                budget = bigger
                continue
            output, error = validate_reply(res.text, spec.output, spec.dependencies)
            if output is not None:
                run.output = output
                return _finish(run, started, "ok", None)
            run.errors.append(error)
            if run.reasks >= cfg.max_reasks:
                return _finish(run, started, "invalid", f"no valid output after {run.reasks} re-asks: {error}")
            run.reasks += 1
            messages = reask_messages(messages, res.text, module_id, spec.output, spec.dependencies, error)
    except GatewayError as e:
        if not is_rejected_record(e):
            raise
        why = f"the endpoint rejected the call: {e}"[:300]
        run.errors.append(why)
        return _finish(run, started, "error", why)


def _finish(run: ModuleRun, started: float, status: str, reason: str | None) -> ModuleRun:
    end = time.perf_counter()
    run.status, run.reason = status, (reason[:300] if reason else None)
    run.latency_s = round(end - started, 4)
    run.finished_s = round(run.started_s + run.latency_s, 4)
    return run


# --------------------------------------------------------------------------------------------- the schedule
def run_graph(item: Item, pool: ThreadPoolExecutor, fixed: dict[str, str] | None = None,
              tag: str = "") -> dict[str, ModuleRun]:
    """Run every module not in `fixed` (id -> the line its dependants see), each as soon as its own dependencies
    have finished. On an error that must fail the batch, no new module starts, the running ones finish (their
    calls are journaled), and the error is raised (a fatal one first)."""
    graph = item.graph
    lines = dict(fixed or {})
    todo = [m for m in graph.order if m not in lines]
    runs: dict[str, ModuleRun] = {}
    pending: dict[Future, str] = {}
    launched: set[str] = set()
    error: BaseException | None = None

    def launch_ready() -> None:
        for m in todo:
            if m not in launched and all(d in lines for d in graph.deps(m)):
                launched.add(m)
                pending[pool.submit(run_module, item, m, {d: lines[d] for d in graph.deps(m)}, tag)] = m

    launch_ready()
    while pending:
        done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
        for fut in done:
            m = pending.pop(fut)
            try:
                runs[m] = fut.result()
                lines[m] = runs[m].line
            except BaseException as e:  # noqa: BLE001 - raised below, once every running module has finished
                if error is None or (is_fatal(e) and not is_fatal(error)):
                    error = e
        if error is None:
            launch_ready()
    if error is not None:
        raise error
    return runs


# -------------------------------------------------------------------------------------------- aggregation Φ
def aggregate(graph: ModuleGraph, lines: dict[str, str], final_text: str, aggregation: str) -> tuple[str, str]:
    """(final answer, the answer text the judge scores) from the trace lines of every module."""
    if aggregation == "concat":
        joined = "\n".join(lines[m] for m in (*graph.non_exit, graph.exit))
        return joined, joined
    trace = "\n".join(lines[m] for m in graph.non_exit)
    return final_text, f"Final answer: {final_text}\n\n{MARKER_MODULE_TRACE}\n{trace}"


def judge(item: Item, answer: str, purpose: str) -> tuple[float | None, str | None]:
    """The judge's 0-10 score of one answer, or (None, why)."""
    cfg = item.cfg
    try:
        parsed, res = item.gw.chat_json(
            JUDGE_STAGE, judge_messages(item.question, answer, cfg.aggregation), expect=(dict, int, float, str),
            schema=JudgeScore, task_id=f"{item.task}-{purpose}", purpose=purpose, model=item.judge_model,
            temperature=cfg.judge_temperature, max_tokens=cfg.judge_max_tokens, journal=item.journal)
    except GatewayError as e:
        if not is_rejected_record(e):
            raise
        return None, f"{purpose}: the endpoint rejected the call: {e}"[:300]
    score = parse_score(parsed)
    if score is None:
        return None, f"{purpose}: no score from 0 to 10 in the judge's reply {res.text[:80]!r}"
    return score, None


# ----------------------------------------------------------------------------------------------- a question
def solve_item(row: dict, gw: Gateway, settings: Settings, journal: CallJournal | None = None,
               task: str | None = None) -> dict:
    """One question (`row`: id, question) -> its row of storage/module_sets.ITEM_SCHEMA."""
    cfg = settings.modules
    graph = module_graph(settings)
    item = Item(gw, settings, graph, journal, task or f"mod-{row['id']}", row["question"], time.perf_counter(),
                module_models(settings), judge_model(settings))
    with ThreadPoolExecutor(len(graph.order), thread_name_prefix="module") as pool:
        runs = run_graph(item, pool)
    forward_s = time.perf_counter() - item.t0
    lines = {m: r.line for m, r in runs.items()}
    final, answer = aggregate(graph, lines, runs[graph.exit].text, cfg.aggregation)
    out = {"id": row["id"], "question": row["question"], "status": "ok", "reason": None, "final_answer": final,
           "answer": answer, "aggregation": cfg.aggregation, "ablation": cfg.ablation, "judge_model": item.judge_model,
           "judge_full": None, "judge_errors": [], "module_calls": sum(r.calls for r in runs.values()),
           "judge_calls": 0}
    without: dict[str, float | None] = {}
    exit_run = runs[graph.exit]
    if exit_run.status != "ok":
        out.update(status="failed", reason=f"exit module {graph.exit} {exit_run.status}: {exit_run.reason}"[:500])
    else:
        full, without, errors, extra_calls = _contributions(item, runs, answer)
        out.update(judge_full=full, judge_errors=errors, judge_calls=1 + len(graph.non_exit))
        out["module_calls"] += extra_calls
        if errors:
            out.update(status="judge_failed", reason="; ".join(errors)[:500])
    latencies = {m: r.latency_s for m, r in runs.items()}
    full_score = out["judge_full"]
    out["modules"] = [_module_record(runs[m], without.get(m), full_score, m == graph.exit, cfg.local_reward_weight)
                      for m in graph.order]
    out.update(wall_s=round(time.perf_counter() - item.t0, 4), forward_s=round(forward_s, 4),
               chain_s=round(graph.longest_chain(latencies), 4), levels_s=round(graph.levels_sum(latencies), 4))
    return out


def _contributions(item: Item, runs: dict[str, ModuleRun], answer: str):
    """Judge the full answer and each answer without one non-exit module, all at once (1 + k calls)."""
    graph, cfg = item.graph, item.cfg
    lines = {m: r.line for m, r in runs.items()}

    def ablated(i: str) -> tuple[str, int]:
        if cfg.ablation == "mask":
            masked = {**lines, i: removed_line(i)}
            return aggregate(graph, masked, runs[graph.exit].text, cfg.aggregation)[1], 0
        below = graph.descendants(i)
        fixed = {m: lines[m] for m in graph.order if m != i and m not in below}
        fixed[i] = removed_line(i)
        with ThreadPoolExecutor(max(1, len(below)), thread_name_prefix="module") as pool:
            reruns = run_graph(item, pool, fixed, tag=i)
        new_lines = {**fixed, **{m: r.line for m, r in reruns.items()}}
        exit_text = (reruns.get(graph.exit) or runs[graph.exit]).text
        return aggregate(graph, new_lines, exit_text, cfg.aggregation)[1], sum(r.calls for r in reruns.values())

    def without(i: str) -> tuple[float | None, str | None, int]:
        text, calls = ablated(i)
        score, why = judge(item, text, f"judge-without-{i}")
        return score, why, calls

    with ThreadPoolExecutor(1 + len(graph.non_exit), thread_name_prefix="judge") as pool:
        full_fut = pool.submit(judge, item, answer, "judge-full")
        futs = {i: pool.submit(without, i) for i in graph.non_exit}
        results, error = {}, None
        for key, fut in [("", full_fut), *futs.items()]:
            try:
                results[key] = fut.result()
            except BaseException as e:  # noqa: BLE001 - raised once every judge call has finished
                if error is None or (is_fatal(e) and not is_fatal(error)):
                    error = e
    if error is not None:
        raise error
    full, full_why = results[""]
    errors = [full_why] if full_why else []
    scores: dict[str, float | None] = {}
    extra = 0
    for i in graph.non_exit:
        score, why, calls = results[i]
        scores[i] = score
        extra += calls
        if why:
            errors.append(why)
    return full, scores, errors, extra


def _module_record(run: ModuleRun, judge_without: float | None, full: float | None, is_exit: bool,
                   weight: float = 0.5) -> dict:
    """A module's stored row: its output, counts, contribution and, beside it, its local reward with the parts it is
    recomputed from (tasks/modules/local_reward.py; no ground truth in a modules run: a verdict's own check is
    null)."""
    contribution = None if is_exit or full is None or judge_without is None else round(full - judge_without, 6)
    rec = {"id": run.id, "output_type": run.output_type, "status": run.status, "reason": run.reason,
            "output": json.dumps(run.output, ensure_ascii=False) if run.output is not None else None,
            "confidence": run.output["confidence"] if run.output is not None else None, "model": run.model,
            "calls": run.calls, "reasks": run.reasks, "truncations": run.truncations, "max_tokens": run.max_tokens,
            "errors": run.errors, "latency_s": run.latency_s, "started_s": run.started_s,
            "finished_s": run.finished_s, "contribution": contribution,
            "judge_without": None if is_exit else judge_without}
    return {**rec, **local_reward(rec, None, weight)}


def error_item(row: dict, err: Exception, settings: Settings) -> dict:
    """The row kept when the endpoint rejects a question's request outright (HTTP 400/422)."""
    cfg = settings.modules
    return {"id": row["id"], "question": row["question"], "status": "error", "reason": str(err)[:500],
            "final_answer": None, "answer": None, "aggregation": cfg.aggregation, "ablation": cfg.ablation,
            "judge_model": judge_model(settings), "judge_full": None, "judge_errors": [], "modules": [],
            "module_calls": 0, "judge_calls": 0, "wall_s": None, "forward_s": None, "chain_s": None, "levels_s": None}


# ------------------------------------------------------------------------------------------------ PRM rows
def record_line(module: dict) -> str:
    """A stored module record as its trace line (the PRM step text)."""
    if module["status"] == "ok" and module["output"]:
        return trace_line(module["id"], module["output_type"], json.loads(module["output"])["content"])
    return failed_line(module["id"], module["reason"])


def step_row(item: dict, margin: float) -> dict:
    """A question as one PRM row in the reward stage's step-row form (storage/reward_sets.STEP_ROW_SCHEMA): one
    step per non-exit module in dependency order (its trace line), label = contribution > margin, raw_scores the
    contributions, scores (contribution + 10) / 20 clipped to 0..1."""
    modules = item.get("modules") or []
    out = {"id": item["id"], "status": "ok", "reason": None, "method": "modules", "prompt": item["question"],
           "completions": None, "labels": None, "raw_scores": None, "scores": None,
           "reasked": any(m["reasks"] or m["truncations"] for m in modules),
           "calls": (item.get("module_calls") or 0) + (item.get("judge_calls") or 0)}
    if item["status"] != "ok":
        return {**out, "status": "error" if item["status"] == "error" else "label_failed",
                "reason": (item.get("reason") or item["status"])[:300]}
    steps = [m for m in modules if m["contribution"] is not None]
    contributions = [float(m["contribution"]) for m in steps]
    return {**out, "completions": [record_line(m) for m in steps], "labels": [c > margin for c in contributions],
            "raw_scores": contributions, "scores": [min(1.0, max(0.0, (c + 10.0) / 20.0)) for c in contributions]}


def label_with_modules(row: dict, gw: Gateway, settings: Settings, journal: CallJournal | None = None) -> dict:
    """The reward stage's `step_label_method = "modules"`: the instruction reasoned through the module graph,
    one PRM step per module (the answer in the row is not used). Calls are charged to task ids prm-<id>-..."""
    item = solve_item({"id": row["id"], "question": row["instruction"]}, gw, settings, journal, task=f"prm-{row['id']}")
    return step_row(item, settings.modules.margin)
