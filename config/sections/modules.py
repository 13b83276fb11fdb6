"""Module-DAG reasoning (DeCoRL): the module graph, its schema checks, aggregation and contribution reward.

The graph is a list of modules, each a role with its own model, temperature, output type and dependencies.
The default is the published nine (`DEFAULT_GRAPH`); `[[modules.graph]]` tables in the config, or a TOML / JSON
file named by `modules.file`, replace it. The graph is checked at load: an unknown dependency, a cycle, a
duplicate id, or not exactly one exit module (`exit = true`, output type `final`, nothing depending on it) is a
`ConfigError` naming the modules.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from evolforge.config.sections._base import Section
from evolforge.config.sections.gateway import ModelMap

OutputType = Literal["steps", "concepts", "entities", "verdict", "result", "alternatives", "final"]
OUTPUT_TYPES: tuple[str, ...] = ("steps", "concepts", "entities", "verdict", "result", "alternatives", "final")
_ID = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class ModuleSpec(Section):
    """One module of the graph: a role with its own model, temperature, output type and dependencies."""

    id: str = Field(..., description="Module id: lower case letters, digits and _ (it names the module in prompts, "
                    "task ids, the trace and the Mermaid graph).")
    role: str = Field(..., min_length=1, description="The role prompt: what this module does (the question and its "
                      "dependencies' outputs are added to it).")
    model: str = Field("", description="A stage name of [models] (judge, answer, evolve, ...) or a model name; empty: "
                       "the judge stage's model.")
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature of this module's calls.")
    output: OutputType = Field(..., description="Output type, which fixes the type of `content`: steps / concepts / "
                               "alternatives: list of strings; entities: {name: description}; verdict: {ok, issues}; "
                               "result: string or number; final: string (the exit module's).")
    dependencies: list[str] = Field(default_factory=list, description="Ids of the modules whose outputs this module "
                                    "reads; it starts as soon as they have all finished.")
    exit: bool = Field(False, description="The exit module: its `final` output is the answer (exactly one).")
    max_tokens: int = Field(0, ge=0, le=32768, description="Completion budget of this module's first call; 0: "
                            "modules.max_tokens.")

    @field_validator("id")
    @classmethod
    def _id_form(cls, v: str) -> str:
        if not _ID.match(v):
            raise ValueError(f"module id {v!r} must match {_ID.pattern}")
        return v


def _m(id: str, role: str, output: str, deps: list[str], temperature: float, exit: bool = False) -> dict:
    return {"id": id, "role": role, "output": output, "dependencies": deps, "temperature": temperature, "exit": exit}


# The published nine: parse and semantic read the question, entity and factcheck follow the semantic branch,
# compute follows parse, verify joins the two, style and quality stand alone, integrate is the exit.
DEFAULT_GRAPH: list[dict] = [
    _m("parse", "Break the question down into the ordered sub-steps needed to answer it.", "steps", [], 0.0),
    _m("semantic", "Name the key concepts of the question and what it is really asking for.", "concepts", [], 0.3),
    _m("entity", "List the entities of the question (objects, people, quantities with units) and what each one is, "
       "using the semantic analysis.", "entities", ["semantic"], 0.0),
    _m("factcheck", "Check the entities and stated facts for errors, missing information or unsupported "
       "assumptions.", "verdict", ["entity"], 0.0),
    _m("compute", "Carry out the calculation or derivation the parsed steps call for and give the result.",
       "result", ["parse"], 0.0),
    _m("verify", "Check the computed result against the fact check: is it consistent, complete and correct?",
       "verdict", ["compute", "factcheck"], 0.0),
    _m("style", "Propose clear, direct ways to phrase the final answer for this question.", "alternatives", [], 0.7),
    _m("quality", "Check what a good answer to this question must contain (precision, completeness, units) and "
       "the pitfalls to avoid.", "verdict", [], 0.3),
    _m("integrate", "Combine the verified result, the phrasing proposals and the quality check into the final "
       "answer.", "final", ["verify", "style", "quality"], 0.2, exit=True),
]


def read_graph_file(path: str) -> list[dict]:
    """The modules of a TOML (`[[modules]]` tables) or JSON (a list, or {"modules": [...]}) file."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"modules.file {path!r} not found")
    try:
        data: Any = tomllib.loads(p.read_text(encoding="utf-8")) if p.suffix.lower() == ".toml" \
            else json.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"modules.file {path!r} is not valid {p.suffix.lstrip('.').upper() or 'JSON'}: {e}") from None
    if isinstance(data, dict):
        data = data.get("modules", data.get("graph"))
    if not isinstance(data, list) or not data:
        raise ValueError(f"modules.file {path!r} holds no list of modules (TOML: [[modules]] tables; JSON: a list "
                         "or {\"modules\": [...]})")
    return data


def graph_problems(graph: list[ModuleSpec]) -> list[str]:
    """Every problem of a module graph, each naming its modules (empty: the graph is usable)."""
    ids = [m.id for m in graph]
    problems = []
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        problems.append(f"duplicate module ids: {', '.join(dupes)}")
    known = set(ids)
    unknown = [f"{m.id} -> {d}" for m in graph for d in m.dependencies if d not in known]
    if unknown:
        problems.append(f"unknown dependencies: {', '.join(unknown)} (modules: {', '.join(ids)})")
    repeated = [m.id for m in graph if len(set(m.dependencies)) != len(m.dependencies)]
    if repeated:
        problems.append(f"a dependency listed twice in: {', '.join(repeated)}")
    cycle = find_cycle({m.id: [d for d in m.dependencies if d in known] for m in graph})
    if cycle:
        problems.append(f"dependency cycle: {' -> '.join(cycle)}")
    exits = [m.id for m in graph if m.exit]
    if not exits:
        sinks = [i for i in ids if not any(i in m.dependencies for m in graph)]
        problems.append(f"no exit module: mark the one module that gives the final answer with exit = true "
                        f"(modules nothing depends on: {', '.join(sinks) or 'none'})")
    elif len(exits) > 1:
        problems.append(f"multiple exit modules: {', '.join(exits)} (exactly one may have exit = true)")
    else:
        ex = next(m for m in graph if m.exit)
        if ex.output != "final":
            problems.append(f"exit module {ex.id} has output {ex.output!r}; the exit's output must be 'final'")
        users = [m.id for m in graph if ex.id in m.dependencies]
        if users:
            problems.append(f"exit module {ex.id} is a dependency of {', '.join(users)}; nothing may depend on the exit")
    finals = [m.id for m in graph if m.output == "final" and not m.exit]
    if finals:
        problems.append(f"output 'final' is the exit's alone: {', '.join(finals)}")
    return problems


def find_cycle(deps: dict[str, list[str]]) -> list[str] | None:
    """One dependency cycle as [a, b, ..., a], or None (iterative DFS: a cycle never loops forever)."""
    state: dict[str, int] = {}
    for root in deps:
        if root in state:
            continue
        stack = [(root, iter(deps[root]))]
        path = [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(deps.get(nxt, []))))
                path.append(nxt)
    return None


def resolve_model(models: ModelMap, name: str) -> str:
    """A module's (or the judge's) `model` setting as a model name: empty -> the judge stage's model; a stage name
    of [models] -> that stage's model; anything else is a model name."""
    if not name:
        return models.for_stage("judge")
    if name == "default":
        return models.default
    if name in type(models).model_fields:
        return models.for_stage(name)
    return name


class ModulesSettings(Section):
    """Module-DAG reasoning (DeCoRL): one chain of thought split into modules run along a dependency graph."""

    graph: list[ModuleSpec] = Field(
        default_factory=lambda: [ModuleSpec(**m) for m in DEFAULT_GRAPH],
        description="The modules ([[modules.graph]] tables); default: the published nine (parse, semantic, entity, "
        "factcheck, compute, verify, style, quality -> integrate).",
    )
    file: str = Field("", description="A TOML ([[modules]] tables) or JSON file with the modules; read at load and "
                      "used instead of `graph` (give one of the two). After loading it is empty and `graph_source` "
                      "names it, so a settings dump carries the graph itself.")
    graph_source: str = Field("", description="Set at load: the file the graph came from (informational).")
    aggregation: Literal["integrate", "concat"] = Field(
        "integrate",
        description="The answer Φ(trace) the judge scores: integrate: the exit module's final answer followed by the "
        "trace of every other module's output; concat: every module's content joined in dependency order, the exit's "
        "last (no separate final answer).",
    )
    ablation: Literal["mask", "recompute"] = Field(
        "mask",
        description="The answer without module i: mask: i's output is replaced by '[module i removed]' in the trace "
        "and its dependants are NOT re-run (exactly 1 + k judge calls, no extra module calls); recompute: i's "
        "dependants (all its descendants) are re-run seeing '[module i removed]' in its place (plus the sum over i of "
        "i's descendant count in module calls: 17 for the default nine).",
    )
    judge_model: str = Field("", description="The contribution judge: a stage name of [models] or a model name; "
                             "empty: the judge stage's model. Fixed for every item of a run.")
    judge_temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature of the judge's calls.")
    judge_max_tokens: int = Field(256, ge=8, le=8192, description="Completion cap of the judge's JSON calls.")
    max_reasks: int = Field(2, ge=0, le=5, description="A reply that fails the output schema is re-asked with the "
                            "validation error at most this many times; then the module's output is invalid (kept "
                            "with the reason).")
    max_tokens: int = Field(512, ge=16, le=32768, description="Completion budget of a module's first call.")
    local_reward_weight: float = Field(0.5, ge=0, le=1, description="Weight w of a module's own check in its "
                                       "local reward (tasks/modules/local_reward.py): reward = 0 when its output "
                                       "failed the schema; = schema (1) when its own check does not apply (null, "
                                       "with a reason); else (1 - w) * schema + w * own, own = 1 or 0 (compute: "
                                       "its stated arithmetic re-done safely; verify: its verdict vs the final "
                                       "answer's correctness when the ground truth is known, so null in a "
                                       "modules run). Stored per module beside its contribution (items "
                                       "`local_reward`, `local_parts`: schema, own, their reasons, the weight) "
                                       "and shown in summary.json / graph.md.")
    max_tokens_cap: int = Field(4096, ge=16, le=65536, description="A truncated reply (finish_reason 'length') is "
                                "asked again with the budget doubled, up to this cap; past it the module is truncated.")
    margin: float = Field(0.0, ge=-10, le=10, description="PRM label of a module step: contribution > margin "
                          "(judge scores 0-10).")
    compare: bool = Field(False, description="Also run every question single-shot (one call to `single_shot_model` "
                          "with a plain 'answer step by step' prompt) and judge it with the same judge "
                          "(`judge_model`): per question the single-shot answer, both scores, the winner and the "
                          "difficulty (comparison.parquet); the graph's win rate overall and by difficulty "
                          "(summary.json `comparison`). At most 2 judge calls per question: the single-shot answer, "
                          "and the graph's answer only when its own full-graph judge score is missing.")
    single_shot_model: str = Field("answer", description="The single-shot baseline of `compare`: a stage name of "
                                   "[models] or a model name; empty: the judge stage's model.")
    single_shot_temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature of the single-shot "
                                           "call.")
    single_shot_max_tokens: int = Field(1024, ge=16, le=32768, description="Completion cap of the single-shot call.")
    question_field: str = Field("question", description="Input column with the question; when missing, "
                                "`instruction` is used (an evolve run's evolved.parquet).")
    id_field: str = Field("id", description="Input column with the item id (missing: row numbers).")
    max_items: int = Field(0, ge=0, description="Use at most this many questions of the input (0: all).")
    batch_size: int = Field(16, ge=1, le=100_000, description="Questions per batch; one Prefect task, journal and "
                            "parquet part per batch.")
    concurrency: int = Field(4, ge=1, le=1024, description="Questions in flight inside one batch (their module "
                             "calls share the gateway's concurrency limit).")

    @model_validator(mode="before")
    @classmethod
    def _graph_from_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("file"):
            if "graph" in data:
                raise ValueError("give modules.graph or modules.file, not both")
            data = {**data, "graph": read_graph_file(data["file"]), "graph_source": data["file"], "file": ""}
        return data

    @model_validator(mode="after")
    def _graph_is_a_dag(self) -> "ModulesSettings":
        problems = graph_problems(self.graph)
        if problems:
            raise ValueError("; ".join(problems))
        if self.max_tokens > self.max_tokens_cap:
            raise ValueError("max_tokens must not exceed max_tokens_cap")
        return self

    @property
    def exit_module(self) -> ModuleSpec:
        return next(m for m in self.graph if m.exit)
