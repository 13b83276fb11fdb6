"""Verified task synthesis: propose -> test in the sandbox -> repair with the failing output -> ... -> solver check.

`synthesize_task` is a plain function over one seed record. Code tasks: the
proposal (statement, reference solution, pytest tests, entry point) is pruned
when it nearly duplicates an earlier proposal of the batch, its tests are run
against a do-nothing stub (tests that pass without a solution check nothing:
rejected as trivial) and against a stub whose result equals anything (tests
that only compare the result with ==, <, > or truthiness would reward an object
that fakes them: rejected as trivial too), then the reference is tested and
repaired up to `max_repairs` times within the per-task budget; an
independent solver model then attempts it `solver_attempts` times without the
reference, and its pass rate gives the difficulty. Math tasks: the proposal's
final answer (a number or an arithmetic expression, evaluated safely) must agree
with the majority of `solver_attempts` independent solutions; a task whose
solvers have no majority, or whose majority disagrees with the reference, is sent
back for repair (the problem or the answer) and solved again, within the same
`max_repairs`. Every model call is charged to the task id and every sandbox
second is added to the task's record. Untrusted code runs only through
tasks/sandbox/run.py.

Who does what ([models]): the proposal is the `synthesize` model's (ledger stage
`synthesize`); the repairs are the validator's (`models.validator`, empty: the
proposer) and the final check's solver attempts run on `models.solver` (empty: the
validator when one is set); repairs and the final check are charged to the ledger
stage `validate`. `roles(settings)` says which model took each part.

The per-task budget: `budget_seconds_per_task` is checked before every model
call and every sandbox run; `budget_usd_per_task` before every model call. A
call whose model has no known price (PriceBook cost None; the embedded model
is free, never unknown) cannot be counted, so with a USD budget set it puts the
task over budget at once (one warning per model names the fix: a
`[pricing.overrides."MODEL"]` entry, or budget_usd_per_task = 0).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from evolforge.config.settings import Settings
from evolforge.storage.journal import CallJournal
from evolforge.tasks.core.gateway import Gateway
from evolforge.tasks.sandbox.run import run_python_tests
from evolforge.tasks.synthesis import checks as chk
from evolforge.tasks.synthesis import prompts as P
from evolforge.tasks.synthesis.schemas import (
    code_proposal_model,
    code_repair_model,
    math_proposal_model,
    math_repair_model,
)

_SANDBOX_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()
_UNPRICED_WARNED: set[str] = set()
log = logging.getLogger("evolforge.synthesis")


@dataclass
class SynthTask:
    task_id: str
    seed_id: str
    kind: str  # code | math
    status: str = "rejected"  # kept | rejected
    reject_reason: str | None = None
    statement: str = ""
    entry_point: str | None = None
    solution: str | None = None
    tests: str | None = None
    answer: str | None = None
    difficulty: str | None = None
    pass_rate: float | None = None
    solver_passes: int = 0
    solver_attempts: int = 0
    repairs: int = 0
    sandbox_seconds: float = 0.0
    wall_seconds: float = 0.0
    attempts: list[dict] = field(default_factory=list)  # every test run: phase, passed, failure, what changed

    def to_row(self) -> dict:
        row = asdict(self)
        row["attempts"] = json.dumps(self.attempts, ensure_ascii=False)
        return row


class Budget(Exception):
    pass


VALIDATE = "validate"  # the ledger stage of repairs and the final check


def roles(settings: Settings) -> dict:
    """Which model proposed, which validated (repairs) and which solved in the final check, and whether the
    proposer validated its own tasks (no `models.validator` different from it): the summary's and card's `models`."""
    m = settings.models
    proposer, validator = m.for_stage("synthesize"), m.for_stage("validator")
    return {"proposer": proposer, "validator": validator, "solver": m.for_stage("solver"),
            "same_model": proposer == validator}


def same_model_warning(settings: Settings) -> str | None:
    """The one line a run prints when the proposer is also the validator; None when they differ."""
    r = roles(settings)
    if not r["same_model"]:
        return None
    return f"proposer and validator are the same model ({r['proposer']}); set --validator"  # models.validator


def _over_time(settings: Settings, t0: float) -> None:
    if time.monotonic() - t0 > settings.synthesis.budget_seconds_per_task:
        raise Budget(f"over the time budget ({settings.synthesis.budget_seconds_per_task:g}s)")


def _unpriced(model: str, budget: float) -> Budget:
    fix = f'add [pricing.overrides."{model}"] (input_per_mtok, output_per_mtok) to the config, or set synthesis.budget_usd_per_task = 0'
    with _SLOTS_LOCK:
        first = model not in _UNPRICED_WARNED
        _UNPRICED_WARNED.add(model)
    if first:
        log.warning("no price known for model %r: the synthesis cost budget ($%s per task) cannot be kept, so every "
                    "task that calls it is rejected as over budget; %s", model, budget, fix)
    return Budget(f"over the cost budget: model {model!r} has no known price ({fix})")


def _sandbox(settings: Settings, solution: str, tests: str, task: SynthTask, phase: str, t0: float):
    with _SLOTS_LOCK:
        sem = _SANDBOX_SLOTS.setdefault(settings.sandbox.max_parallel,
                                        threading.BoundedSemaphore(settings.sandbox.max_parallel))
    with sem:
        _over_time(settings, t0)  # a sandbox run spends the task's seconds too (checked once it has a slot)
        res = run_python_tests(solution, tests, settings.sandbox)
    task.sandbox_seconds += res.duration_s
    why = "\n".join(filter(None, [res.killed_reason, res.verdict_error]))
    failure = None if res.passed else why + "\n" + (res.stdout + res.stderr)[-1500:]
    task.attempts.append({"phase": phase, "passed": res.passed, "sandbox_s": round(res.duration_s, 3),
                          "killed_reason": res.killed_reason, "verdict": res.verdict_error,
                          "not_checkable": res.not_checkable, "failure": failure})
    return res


def synthesize_task(seed: dict, kind: str, gateway: Gateway, settings: Settings, journal: CallJournal | None = None,
                    seen: list[set[str]] | None = None, seen_lock: threading.Lock | None = None) -> SynthTask:
    cfg = settings.synthesis
    t0 = time.monotonic()
    task = SynthTask(task_id=f"t-{seed['id']}-{kind}", seed_id=seed.get("seed_id") or seed["id"], kind=kind)
    spent = {"usd": 0.0}

    def call(stage: str, text: str, purpose: str, schema, role: str | None = None, **kw):
        """One model call charged to ledger `stage`, on the model of [models] `role` (default: the stage's);
        `schema` (a factory of pydantic models by token budget) makes it a JSON call of that shape, None a text one."""
        _over_time(settings, t0)
        if cfg.budget_usd_per_task and spent["usd"] > cfg.budget_usd_per_task:
            raise Budget(f"over the cost budget (${cfg.budget_usd_per_task})")
        model = gateway.model_for(role or stage)
        kw.setdefault("max_tokens", cfg.max_new_tokens)
        if schema is not None:
            parsed, res = gateway.chat_json(stage, P.msg(text), task_id=task.task_id, purpose=purpose,
                                            journal=journal, model=model,
                                            schema=schema(gateway.max_tokens_for(kw["max_tokens"])), **kw)
        else:
            parsed, res = None, gateway.chat(stage, P.msg(text), task_id=task.task_id, purpose=purpose,
                                             journal=journal, model=model, **kw)
        cost, _ = gateway.prices.cost(model, res.prompt_tokens, res.completion_tokens)
        if cost is None and cfg.budget_usd_per_task:  # unknown is not free: it cannot be kept under a budget
            raise _unpriced(model, cfg.budget_usd_per_task)
        spent["usd"] += cost or 0.0
        return parsed, res

    try:
        if kind == "math":
            _math(seed, task, call, cfg)
        else:
            _code(seed, task, call, settings, seen, seen_lock, t0)
    except Budget as e:
        task.status, task.reject_reason = "rejected", str(e)
    task.wall_seconds = round(time.monotonic() - t0, 3)
    return task


def _code(seed, task: SynthTask, call, settings: Settings, seen, seen_lock, t0: float) -> None:
    cfg = settings.synthesis
    prop, _ = call("synthesize", P.PROPOSE_CODE.format(instruction=seed["instruction"]), "propose", code_proposal_model,
                   temperature=cfg.temperature)
    keys = ("statement", "entry_point", "solution", "tests")
    if not isinstance(prop, dict) or not all(isinstance(prop.get(k), str) and prop[k].strip() for k in keys):
        task.reject_reason = "proposal is not a JSON object with statement, entry_point, solution and tests"
        return
    task.statement, task.entry_point = prop["statement"].strip(), prop["entry_point"].strip()
    task.solution, task.tests = chk.extract_code(prop["solution"]), chk.extract_code(prop["tests"])
    if not task.entry_point.isidentifier():
        task.reject_reason = f"entry_point {task.entry_point!r} is not a Python identifier"
        return
    sig = chk.shingles(task.statement + task.solution)
    if seen is not None:
        with seen_lock:
            if any(chk.jaccard(sig, other) >= cfg.prune_jaccard for other in seen):
                task.reject_reason = "near-duplicate of an earlier proposal (pruned before testing)"
                return
            seen.append(sig)
    if _sandbox(settings, chk.stub_solution(task.entry_point), task.tests, task, "stub", t0).passed:
        task.reject_reason = "trivial: the tests pass against a do-nothing solution"
        return
    if _sandbox(settings, chk.always_equal_stub(task.entry_point), task.tests, task, "stub-always-equal", t0).passed:
        task.reject_reason = ("trivial: the tests pass against a solution whose result equals anything "
                              "(they only compare it with ==, <, > or truthiness)")
        return
    for attempt in range(cfg.max_repairs + 1):
        res = _sandbox(settings, task.solution, task.tests, task, "reference" if attempt == 0 else f"repair-{attempt}", t0)
        if res.passed:
            break
        if attempt == cfg.max_repairs:
            # a task whose tests the sandbox cannot judge (they pass the solution something its channel cannot
            # carry) is never kept: its verdict would be no reward signal
            task.reject_reason = (f"not checkable after {cfg.max_repairs} repairs: {res.not_checkable}" if res.not_checkable
                                  else f"reference fails its tests after {cfg.max_repairs} repairs: {res.killed_reason or 'failed'}")
            return
        fix, _ = call(VALIDATE, P.REPAIR_CODE.format(statement=task.statement, solution=task.solution,
                                                     tests=task.tests, failure=task.attempts[-1]["failure"]),
                      f"repair-{attempt + 1}", code_repair_model, role="validator", temperature=0.2)
        task.repairs += 1
        if not isinstance(fix, dict):
            task.attempts[-1]["changed"] = "nothing (unparseable repair)"
            continue
        changed = []
        if isinstance(fix.get("solution"), str) and fix["solution"].strip():
            new = chk.extract_code(fix["solution"])
            if new != task.solution:
                task.solution, changed = new, changed + ["solution"]
        if isinstance(fix.get("tests"), str) and fix["tests"].strip():
            new = chk.extract_code(fix["tests"])
            if new != task.tests:
                task.tests, changed = new, changed + ["tests"]
        task.attempts[-1]["changed"] = ",".join(changed) or "nothing"
        task.attempts[-1]["explanation"] = str(fix.get("explanation", ""))[:300]
    solves = []
    for k in range(cfg.solver_attempts):
        _, res = call(VALIDATE, P.SOLVE_CODE.format(entry_point=task.entry_point, statement=task.statement),
                      f"solve-{k}", None, role="solver", temperature=cfg.solver_temperature)
        solves.append(chk.extract_code(res.text))
    passes = sum(_sandbox(settings, code, task.tests, task, f"solver-{k}", t0).passed for k, code in enumerate(solves))
    _label(task, passes, cfg.solver_attempts)


def _math(seed, task: SynthTask, call, cfg) -> None:
    prop, _ = call("synthesize", P.PROPOSE_MATH.format(instruction=seed["instruction"]), "propose", math_proposal_model,
                   temperature=cfg.temperature)
    if not isinstance(prop, dict) or not isinstance(prop.get("problem"), str) or not prop["problem"].strip():
        task.reject_reason = "proposal is not a JSON object with problem, steps and answer"
        return
    task.statement = prop["problem"].strip()
    ref = chk.eval_number(str(prop.get("answer", "")))
    if ref is None:
        task.reject_reason = f"reference answer {prop.get('answer')!r} is not a number or arithmetic expression"
        return
    task.answer = str(prop.get("answer")).strip()
    steps = [str(x) for x in prop.get("steps") or []] if isinstance(prop.get("steps"), list) else []
    for attempt in range(cfg.max_repairs + 1):
        phase = "solver" if attempt == 0 else f"solver-after-repair-{attempt}"
        answers = []
        for k in range(cfg.solver_attempts):
            # the first round keeps the purposes of the calls before the repair loop (a resumed run replays them)
            _, res = call(VALIDATE, P.SOLVE_MATH.format(problem=task.statement),
                          f"solve-{k}" if attempt == 0 else f"solve-{attempt}-{k}", None, role="solver",
                          temperature=cfg.solver_temperature)
            answers.append(chk.final_answer(res.text))
        task.attempts.append({"phase": phase, "answers": answers, "reference": ref})
        counted = Counter(round(a, 6) for a in answers if a is not None)
        majority, votes = counted.most_common(1)[0] if counted else (None, 0)
        passes = sum(chk.same_number(a, ref) for a in answers)
        if majority is not None and votes * 2 > cfg.solver_attempts and chk.same_number(majority, ref):
            break
        failure = (f"the reference answer {ref:g} disagrees with the solvers' majority ({majority:g})"
                   if majority is not None and votes * 2 > cfg.solver_attempts
                   else "the solvers have no majority answer (the problem may be ambiguous)")
        task.attempts[-1]["failure"] = failure
        if attempt == cfg.max_repairs:
            task.solver_attempts, task.solver_passes = cfg.solver_attempts, passes
            task.reject_reason = failure + (f" after {cfg.max_repairs} repairs" if cfg.max_repairs else "")
            return
        fix, _ = call(VALIDATE, P.REPAIR_MATH.format(problem=task.statement, steps="\n".join(steps) or "(none)",
                                                     answer=task.answer, answers=", ".join(
                                                         "none" if a is None else f"{a:g}" for a in answers),
                                                     failure=failure),
                      f"repair-{attempt + 1}", math_repair_model, role="validator", temperature=0.2)
        task.repairs += 1
        changed = []
        if isinstance(fix, dict):
            if isinstance(fix.get("problem"), str) and fix["problem"].strip() and fix["problem"].strip() != task.statement:
                task.statement, changed = fix["problem"].strip(), changed + ["problem"]
            new_ref = chk.eval_number(str(fix.get("answer", "")))
            if new_ref is not None and str(fix["answer"]).strip() != task.answer:
                ref, task.answer, changed = new_ref, str(fix["answer"]).strip(), changed + ["answer"]
            task.attempts[-1]["explanation"] = str(fix.get("explanation", ""))[:300]
        task.attempts[-1]["changed"] = ",".join(changed) or ("nothing" if isinstance(fix, dict)
                                                             else "nothing (unparseable repair)")
    _label(task, passes, cfg.solver_attempts)


def _label(task: SynthTask, passes: int, k: int) -> None:
    task.solver_passes, task.solver_attempts = passes, k
    task.pass_rate = passes / k if k else None
    task.difficulty = chk.difficulty(task.pass_rate or 0.0)
    task.status, task.reject_reason = "kept", None
