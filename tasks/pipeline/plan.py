"""Which stages a pipeline run runs, in which order, and each one's parameters: the stage registry's declarations
composed (tasks/core/stages.py), so the pipeline names no stage's inputs of its own. The nightly chain composes the
same declarations into its deployment triggers (deployments/deploy.py).

    STAGES                              the pipeline's stages and the switch (a parameter) that runs each
    stages_of(params)                   the stages switched on, with every stage one of them needs (a required
                                        parameter fed by it), in registry order
    params_of(stage, params, lay, ran)  the stage's parameters: the pipeline's own fields of the same name (seeds,
                                        rounds, the endpoint, the config), then what its feeds (Stage.feeds) take
                                        from the stages that ran before it, then its output folder OUT/<stage>
"""

from __future__ import annotations

from typing import Any, Collection

from pydantic import BaseModel

from evolforge.storage.fs import exists
from evolforge.storage.pipeline_sets import PipelineLayout
from evolforge.tasks.core.stages import Stage, fed, get, stages

# the stages of a pipeline run, each with the switch (a PipelineParams field, tasks/pipeline/stage.py) that runs it
# (None: always), in registry order; what each one is given comes from the registry
STAGES = {"evolve": None, "synthesize": "synthesize", "reward-data": "reward", "train-reward": "reward", "sft": "sft",
          "ppo": "ppo", "eval": "eval"}


def stages_of(params: BaseModel) -> list[Stage]:
    """The stages the run runs: those whose switch is on (or that have none), and those a stage among them needs."""
    on = {name for name, switch in STAGES.items() if switch is None or getattr(params, switch)}
    pending = list(on)
    while pending:
        stage = get(pending.pop())
        for param, feed in stage.feeds.items():
            sources = [name for name, _ in feed.sources]
            if stage.params.model_fields[param].is_required() and not on.intersection(sources):
                on.add(sources[0])
                pending.append(sources[0])
    return [stage for stage in stages() if stage.name in on]


def passed_on(params: BaseModel) -> dict[str, Any]:
    """The pipeline's own fields that its stages take under the same name (not the switches, not its folder)."""
    switches = {s for s in STAGES.values() if s}
    return {k: getattr(params, k) for k in type(params).model_fields if k not in switches and k != "out"}


def params_of(stage: Stage, params: BaseModel, lay: PipelineLayout, ran: Collection[str]) -> BaseModel:
    """`stage`'s parameters in the run whose folder is `lay`, after the stages `ran`: a feed takes a path in the
    folder of a stage that ran, when the path is there."""
    def folder_of(name: str, path: str) -> str | None:
        if name not in ran:
            return None
        found = lay.stage(name) / path if path else lay.stage(name)
        return str(found) if not path or exists(found) else None

    fields = stage.params.model_fields
    values = {k: v for k, v in passed_on(params).items() if k in fields}
    filled = fed(stage, folder_of)
    for param in filled:
        for replaced in stage.feeds[param].instead_of:
            values.pop(replaced, None)
    values.update(filled)
    if stage.out_field in fields:
        values[stage.out_field] = str(lay.stage(stage.name))
    return stage.params(**values)
