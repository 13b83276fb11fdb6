"""The PPO reward of RLEIF: r = rI * rA, as one importable module.

    rI  the instruction reward: the trained IRM's score of the instruction (the prompt's question).
    rA  the answer reward: the trained PRM's per-step scores of the response, aggregated
        (`aggregation`: "min" = the weakest step, "product" = every step right, "last" = the final step),
        blended with a rule-based answer check when the prompt has a ground truth:
            rA = (1 - answer_weight) * aggregate(PRM step scores) + answer_weight * correct
        where correct is 1.0 when the response's final answer matches the ground truth, else 0.0.
        Without a ground truth (reward_model.style "model", or an empty ground_truth) rA is the PRM part alone.
        Code rows (data_source "evolforge/code", ground truth JSON {"entry_point", "tests"}: a synthesized task's
        own pytest tests, tasks/ppo/data.py): correct is whether the tests pass against the code extracted from
        the response (tasks/text/checks.py extract_code), run in the project's sandbox (tasks/sandbox/run.py
        run_many, one call per batch; SandboxSettings from reward_kwargs["sandbox"], else the config's [sandbox]).
        Those modules are imported only when a code row is scored; where evolforge is not importable a code row
        scores with the PRM alone, and a warning says so once.
    Scores are probabilities in [0, 1], so r is in [0, 1]. An empty response has no steps: rA = 0.

One module, three callers (each scores a batch with ONE forward pass per reward model):
  * TRL GRPOTrainer:  `PPOReward(irm, prm)(prompts, completions, **dataset_columns) -> list[float]`
  * verl, one sample: `compute_score(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs)`
  * verl, batched:    `compute_score_async(...)` (what the generated config names): verl's reward loop (verl >= 0.7;
    tests/tasks/ppo/test_verl_real.py runs verl 0.9.1's RewardLoopWorker on it) calls the function once per sample,
    concurrently; calls arriving within `batch_window_s` are coalesced into one batch.
    `compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **reward_kwargs)` has the
    signature of verl's legacy BatchRewardManager (not wired into verl 0.9's trainer).
verl loads this file by path (`custom_reward_function.path`, or `pkg://evolforge.tasks.ppo.reward`). Where evolforge cannot be imported, this file loads
the modules it needs by their file locations in the same source tree (tasks/text/steps.py, tasks/text/answers.py,
tasks/text/encoding.py, then tasks/ppo/scorers.py); none of them imports evolforge. The model folders come from
`reward_kwargs` (irm_dir, prm_dir, aggregation, answer_weight) or the environment variables
EVOLFORGE_PPO_IRM_DIR, EVOLFORGE_PPO_PRM_DIR, EVOLFORGE_PPO_AGGREGATION, EVOLFORGE_PPO_ANSWER_WEIGHT.

A response's steps come from tasks/text/steps.py `split_steps`, the splitter whose rules also made the PRM's
training steps (tasks/reward/prm.py), so the PRM scores the steps it was trained on; the answer check is
tasks/text/answers.py `answer_correct`. Reward-model folder conventions: tasks/ppo/scorers.py; the encoding of
an instruction and of a list of steps: tasks/text/encoding.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import sys
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any, Protocol, Sequence

try:
    from evolforge.tasks.ppo.scorers import HFInstructionScorer, HFStepScorer
    from evolforge.tasks.text.answers import answer_correct
    from evolforge.tasks.text.steps import split_steps
except ImportError:  # loaded by file path (verl's custom_reward_function) where evolforge is not installed
    def _load_file(name: str, path: Path):
        """Import the module at `path` as `name` (registered in sys.modules: dataclasses look their module up)."""
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    _TASKS = Path(__file__).resolve().parents[1]  # tasks/: ppo/ and text/ are its sub-folders
    split_steps = _load_file("evolforge_text_steps", _TASKS / "text" / "steps.py").split_steps
    answer_correct = _load_file("evolforge_text_answers", _TASKS / "text" / "answers.py").answer_correct
    _load_file("evolforge_text_encoding", _TASKS / "text" / "encoding.py")  # scorers.py imports it by this name
    _scorers = _load_file("evolforge_ppo_scorers", _TASKS / "ppo" / "scorers.py")
    HFInstructionScorer, HFStepScorer = _scorers.HFInstructionScorer, _scorers.HFStepScorer

AGGREGATIONS = ("min", "product", "last")
CODE_SOURCE = "evolforge/code"  # data_source of synthesized code tasks: checked by running their tests


class InstructionScorer(Protocol):
    """Scores instructions in one batch: len(result) == len(instructions), values in [0, 1]."""

    def __call__(self, instructions: Sequence[str]) -> list[float]: ...


class StepScorer(Protocol):
    """Scores every step of every response in one batch: result[i][j] is step j of response i, in [0, 1]."""

    def __call__(self, prompts: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]: ...


# ---------------------------------------------------------------- the reward itself

def aggregate(step_scores: Sequence[float], how: str = "min") -> float:
    if how not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {how!r}")
    if not step_scores:
        return 0.0
    if how == "min":
        return float(min(step_scores))
    if how == "last":
        return float(step_scores[-1])
    return float(math.prod(step_scores))


def combine(r_i: float, step_scores: Sequence[float], correct: bool | None, aggregation: str = "min",
            answer_weight: float = 0.5) -> float:
    """r = rI * rA with rA = (1 - answer_weight) * aggregate(steps) + answer_weight * correct (see module doc)."""
    r_a = aggregate(step_scores, aggregation)
    if correct is not None and step_scores:
        r_a = (1.0 - answer_weight) * r_a + answer_weight * (1.0 if correct else 0.0)
    return float(r_i) * r_a


def _text_of(x: Any) -> str:
    """A prompt or completion as text: a string, or the content of the last message of a conversation."""
    if isinstance(x, str):
        return x
    if isinstance(x, dict):
        return str(x.get("content", ""))
    if isinstance(x, (list, tuple)) and x:
        users = [m for m in x if isinstance(m, dict) and m.get("role") == "user"]
        return _text_of((users or list(x))[-1])
    return ""


def _ground_truth(reward_model: Any) -> str | None:
    if isinstance(reward_model, dict):
        if reward_model.get("style", "rule") != "rule":
            return None
        return reward_model.get("ground_truth") or None
    return reward_model or None


def _code_truth(ground_truth: Any) -> dict | None:
    """A code row's ground truth {"entry_point", "tests"} (JSON), or None when it is not one."""
    if not isinstance(ground_truth, str) or not ground_truth.strip().startswith("{"):
        return None
    try:
        truth = json.loads(ground_truth)
    except ValueError:
        return None
    return truth if isinstance(truth, dict) and isinstance(truth.get("tests"), str) and truth["tests"].strip() else None


_WARNED: set[str] = set()
_DEFAULT_SANDBOX: list = []  # the config's [sandbox] settings, loaded once per process


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _sandbox_tools():
    """(extract_code, run_many, sandbox settings resolver), imported only when a code row is scored; None where
    evolforge cannot be imported (this file loaded by path without the package)."""
    try:
        from evolforge.config.sections.sandbox import SandboxSettings
        from evolforge.tasks.sandbox.run import run_many
        from evolforge.tasks.text.checks import extract_code
    except ImportError:
        return None

    def settings(given: Any) -> Any:
        if isinstance(given, SandboxSettings):
            return given
        if isinstance(given, dict):
            return SandboxSettings.model_validate(dict(given))
        if not _DEFAULT_SANDBOX:
            from evolforge.config.settings import load_settings

            _DEFAULT_SANDBOX.append(load_settings().sandbox)
        return _DEFAULT_SANDBOX[0]

    return extract_code, run_many, settings


def code_checks(responses: Sequence[str], truths: Sequence[dict | None], sandbox: Any = None) -> list[bool | None]:
    """Per response: whether its code passes the tests of its truth (None where it has no truth, or where the
    sandbox cannot be imported). One sandbox `run_many` for the whole batch; correct = the verdict `passed`."""
    out: list[bool | None] = [None] * len(responses)
    jobs = [(i, t) for i, t in enumerate(truths) if t]
    if not jobs:
        return out
    tools = _sandbox_tools()
    if tools is None:
        _warn_once("no-sandbox", "evolforge is not importable here: evolforge/code rows are scored by the PRM alone "
                   "(their tests need the evolforge sandbox; install evolforge where verl's reward workers run)")
        return out
    extract_code, run_many, settings = tools
    results = run_many([(extract_code(responses[i]), t["tests"]) for i, t in jobs], settings(sandbox),
                       reward=True)  # a pass is confirmed under another hash seed (sandbox.confirm_runs)
    for (i, _), res in zip(jobs, results):
        out[i] = bool(res.passed)
    return out


class PPOReward:
    """r = rI * rA over a batch. Also a TRL GRPOTrainer reward function (see __call__).
    (A plain class, not a dataclass: verl executes this file without registering it in sys.modules.)"""

    def __init__(self, irm: InstructionScorer, prm: StepScorer, aggregation: str = "min", answer_weight: float = 0.5,
                 sandbox: Any = None):
        self.irm, self.prm, self.aggregation, self.answer_weight = irm, prm, aggregation, answer_weight
        self.sandbox = sandbox  # SandboxSettings (or a dict of them) for code rows; None: the config's [sandbox]
        self.__name__ = "ppo_reward"  # TRL names the logged reward column after this
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if not 0.0 <= self.answer_weight <= 1.0:
            raise ValueError(f"answer_weight must be in [0, 1], got {self.answer_weight}")

    def details(self, questions: Sequence[str], responses: Sequence[str],
                ground_truths: Sequence[str | None] | None = None,
                data_sources: Sequence[str | None] | None = None, sandbox: Any = None) -> list[dict]:
        """Per sample: r_i, step_scores, r_a_prm, correct, check ("answer", "tests" or None), reward. One IRM and
        one PRM forward pass, and one sandbox batch for the code rows (data_source "evolforge/code"; without
        data_sources, a row whose ground truth is a code task's JSON). `sandbox`: settings of this call (else
        the reward's own)."""
        if len(questions) != len(responses):
            raise ValueError(f"{len(questions)} questions but {len(responses)} responses")
        n = len(responses)
        gts = list(ground_truths) if ground_truths is not None else [None] * n
        sources = list(data_sources) if data_sources is not None else [None] * n
        is_code = [src == CODE_SOURCE or (src is None and _code_truth(gt) is not None) for src, gt in zip(sources, gts)]
        tests = code_checks(responses, [_code_truth(gt) if c else None for gt, c in zip(gts, is_code)],
                            sandbox if sandbox is not None else self.sandbox)
        steps = [split_steps(r) for r in responses]
        r_i = self.irm(list(questions))
        step_scores = self.prm(list(questions), steps)
        out = []
        for resp, gt, code, passed, ri, ss in zip(responses, gts, is_code, tests, r_i, step_scores):
            correct = passed if code else answer_correct(resp, gt)
            out.append({"r_i": float(ri), "step_scores": [float(s) for s in ss],
                        "r_a_prm": aggregate(ss, self.aggregation), "correct": correct,
                        "check": None if correct is None else ("tests" if code else "answer"),
                        "reward": combine(ri, ss, correct, self.aggregation, self.answer_weight)})
        return out

    def score(self, questions: Sequence[str], responses: Sequence[str],
              ground_truths: Sequence[str | None] | None = None,
              data_sources: Sequence[str | None] | None = None, sandbox: Any = None) -> list[float]:
        return [d["reward"] for d in self.details(questions, responses, ground_truths, data_sources, sandbox)]

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """TRL reward function: `reward(prompts, completions, **kwargs) -> list[float]`.
        The question is `extra_info[i]["question"]` when the dataset has it (the raw instruction the IRM was
        trained on), else the prompt's last user message; the ground truth is `reward_model[i]["ground_truth"]`
        for style "rule" rows (or a `ground_truth` column)."""
        n = len(completions)
        extra = kwargs.get("extra_info") or [None] * n
        questions = [(e or {}).get("question") or _text_of(p) for p, e in zip(prompts, extra)]
        gts = kwargs.get("ground_truth") or [_ground_truth(rm) for rm in (kwargs.get("reward_model") or [None] * n)]
        details = self.details(questions, [_text_of(c) for c in completions], gts, kwargs.get("data_source"))
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and details:
            log_metric("reward/r_i", sum(d["r_i"] for d in details) / n)
            log_metric("reward/r_a_prm", sum(d["r_a_prm"] for d in details) / n)
            checked = [d["correct"] for d in details if d["correct"] is not None]
            if checked:
                log_metric("reward/answer_correct", sum(checked) / len(checked))
        return [d["reward"] for d in details]


_LOADED: dict[tuple, PPOReward] = {}
_LOCK = threading.Lock()


def load_reward(irm_dir: str | None = None, prm_dir: str | None = None, aggregation: str | None = None,
                answer_weight: float | None = None, device: str = "cpu", **_: Any) -> PPOReward:
    """The reward over two model folders (arguments, else EVOLFORGE_PPO_* environment), cached per process."""
    irm_dir = irm_dir or os.environ.get("EVOLFORGE_PPO_IRM_DIR")
    prm_dir = prm_dir or os.environ.get("EVOLFORGE_PPO_PRM_DIR")
    if not irm_dir or not prm_dir:
        raise ValueError("the PPO reward needs irm_dir and prm_dir (reward_kwargs, or EVOLFORGE_PPO_IRM_DIR / "
                         "EVOLFORGE_PPO_PRM_DIR in the environment)")
    aggregation = aggregation or os.environ.get("EVOLFORGE_PPO_AGGREGATION", "min")
    answer_weight = float(answer_weight if answer_weight is not None else os.environ.get("EVOLFORGE_PPO_ANSWER_WEIGHT", 0.5))
    key = (str(irm_dir), str(prm_dir), aggregation, answer_weight, device)
    with _LOCK:
        if key not in _LOADED:
            _LOADED[key] = PPOReward(HFInstructionScorer(str(irm_dir), device=device),
                                     HFStepScorer(str(prm_dir), device=device), aggregation, answer_weight)
        return _LOADED[key]


# ---------------------------------------------------------------- verl entry points

def _question(extra_info: dict | None) -> str:
    q = (extra_info or {}).get("question")
    if not q:
        raise ValueError("verl extra_info must carry the instruction as extra_info['question'] (rI scores it)")
    return str(q)


def compute_score_batch(data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[str],
                        extra_infos: Sequence[dict | None], **reward_kwargs: Any) -> list[float]:
    """verl batched reward function (BatchRewardManager signature): one forward pass per model, one sandbox batch
    for the evolforge/code rows (SandboxSettings from reward_kwargs["sandbox"], else the config's [sandbox])."""
    reward = load_reward(**reward_kwargs)
    questions = [_question(e) for e in extra_infos]
    return reward.score(questions, list(solution_strs), list(ground_truths), list(data_sources),
                        sandbox=reward_kwargs.get("sandbox"))


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **reward_kwargs: Any) -> float:
    """verl custom reward function for one sample (the reward manager calls it per response)."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info], **reward_kwargs)[0]


class _Coalescer:
    """Gathers concurrent per-sample calls of one event loop into one batch (verl >= 0.7 reward loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, window_s: float, reward_kwargs: dict):
        self.loop, self.window_s, self.reward_kwargs = loop, window_s, reward_kwargs
        self.pending: list = []
        self.flushing: set = set()  # strong references to running flush tasks

    def add(self, item: tuple) -> asyncio.Future:
        fut = self.loop.create_future()
        if not self.pending:
            self.loop.call_later(self.window_s, self._start_flush)
        self.pending.append((item, fut))
        return fut

    def _start_flush(self) -> None:
        task = self.loop.create_task(self._flush())
        self.flushing.add(task)
        task.add_done_callback(self.flushing.discard)

    async def _flush(self) -> None:
        batch, self.pending = self.pending, []
        cols = list(zip(*(item for item, _ in batch)))
        try:
            scores = await self.loop.run_in_executor(None, lambda: compute_score_batch(*cols, **self.reward_kwargs))
        except Exception as e:  # noqa: BLE001 - every waiting sample sees the error
            scores, error = None, e
        for i, (_, fut) in enumerate(batch):
            if not fut.done():
                fut.set_result(scores[i]) if scores is not None else fut.set_exception(error)


_COALESCERS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()


async def compute_score_async(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                              batch_window_s: float = 0.05, **reward_kwargs: Any) -> float:
    """verl custom reward function (async): concurrent calls within `batch_window_s` share one forward pass."""
    loop = asyncio.get_running_loop()
    per_loop = _COALESCERS.setdefault(loop, {})
    key = tuple(sorted((k, str(v)) for k, v in reward_kwargs.items()))
    if key not in per_loop:
        per_loop[key] = _Coalescer(loop, batch_window_s, reward_kwargs)
    return await per_loop[key].add((data_source, solution_str, ground_truth, extra_info))
