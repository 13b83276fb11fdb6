"""The stage registry: one descriptor per stage, declared beside its stage, and iterated over by the code that
used to name every stage (the CLI, `evolforge status`, the deployments, the pipeline).

Modelled on verl's reward-manager registry (`@register("name")`): a descriptor is data, not a base class with
override hooks, and a stage's flow stays a plain Prefect flow, named here by its import path ("module:attr") and
loaded only when it runs, so the CLI's flags, its fail-fast checks and `status` never import Prefect.

    STAGE_PACKAGES (evolforge/tasks/__init__.py)  the one line per stage: the sub-package whose `stage` module
                                                   registers its descriptor(s)
    register(stage)                                add a descriptor (a stage module calls it at import)
    stages() / get(name)                           every registered stage in STAGE_PACKAGES order / one by name
    Table                                          an input or output table: name, file, columns (distilabel's
                                                   "Input columns / Output columns"), what it is
    Feed / fed(stage, folder_of)                   a parameter filled from the output of stages that ran before it,
                                                   when stages run composed: the one declaration of how the stages
                                                   connect, read by both compositions, the pipeline flow
                                                   (tasks/pipeline/stage.py) and the nightly chain's triggers
                                                   (deployments/deploy.py over storage/chain.py's folders)

A stage's descriptor holds: its name (the CLI command, the Prefect flow and deployment name, the `kind` in its
folder's stage.json), its parameter model (one declaration: the Prefect UI form and the CLI flags), its flow,
its config section, its output folder class (storage/), its fail-fast input check, its input and output tables, the
parameters earlier stages feed, and its deployment.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import BaseModel


@dataclass(frozen=True)
class Table:
    """One table a stage reads or writes: `path` relative to the stage's folder (or how it is given)."""

    name: str
    path: str
    columns: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True, init=False)
class Feed:
    """A parameter filled, when stages run composed, from the output of stages that ran before: "stage" is that
    stage's output folder, "stage/path" a path inside it. Given several, the first of them that ran (and left that
    path); with `every`, a list of every one that ran. `instead_of`: parameters left out when this one is filled
    (a policy folder replaces the endpoint's model)."""

    sources: tuple[tuple[str, str], ...]  # (stage, path inside its folder, "" for the folder)
    every: bool
    instead_of: tuple[str, ...]

    def __init__(self, *sources: str, every: bool = False, instead_of: tuple[str, ...] = ()):
        object.__setattr__(self, "sources", tuple((src.partition("/")[0], src.partition("/")[2]) for src in sources))
        object.__setattr__(self, "every", every)
        object.__setattr__(self, "instead_of", tuple(instead_of))


def fed(stage: "Stage", folder_of: Callable[[str, str], Any]) -> dict[str, Any]:
    """The parameters `stage`'s feeds fill: `folder_of(name, path)` is the value for that path in stage `name`'s
    folder, or None when that stage did not run (or left no such path). Parameters no source fills are left out."""
    out: dict[str, Any] = {}
    for param, feed in stage.feeds.items():
        found = [v for name, path in feed.sources if (v := folder_of(name, path)) is not None]
        if found:
            out[param] = found if feed.every else found[0]
    return out


@dataclass(frozen=True)
class Trigger:
    """A chain link: the deployment runs when a flow run of the `after` stage's deployment completes (a Prefect
    deployment trigger on `prefect.flow-run.Completed`, rendered into deployments/prefect.yaml). Its flow parameters
    are the stage's feeds (Stage.feeds) and output folder, as Jinja the Prefect server renders over the upstream run
    (deployments/deploy.py, storage/chain.py). The link is on when its stage is in the config's `[schedule] chain`."""

    after: str  # the upstream stage (its flow and deployment have this name)


@dataclass(frozen=True)
class Deployment:
    """How the stage is deployed on the project's Prefect work pool (deployments/prefect.yaml)."""

    description: str
    tags: tuple[str, ...] = ()
    schedule: bool = False  # on the cron schedule of [schedule] (cron, timezone, active)
    concurrency_limit: int | None = None  # at most this many runs of the deployment at once
    parameters: dict[str, Any] = field(default_factory=dict)  # default flow parameters (template variables allowed)
    trigger: Trigger | None = None  # run when the upstream stage's run completes (the nightly chain)


@dataclass(frozen=True)
class Stage:
    """A stage, as data (see the module docstring)."""

    name: str
    help: str
    params: type[BaseModel]
    flow: str  # "evolforge.flows.<module>:<flow function>"
    # its own section of the settings (config/settings.py Settings, config/sections/): None for a stage with none
    # (it reads only shared sections, or other stages'); the architecture test checks it exists on Settings
    section: str | None = None
    # the storage class of its output folder (a StageFolder), or its import path "module:Class", loaded when used
    # (folder_class()), so the CLI's flags and --help do not load storage's pyarrow schemas
    folder: type | str | None = None
    check: Callable[[Any, Any], None] | None = None  # check(params, settings): fail fast, creates nothing
    # settings_check(settings): the part of `check` that reads only the settings (a budget, prices): a composition
    # runs it for each stage it will run before the first one starts, when their inputs do not exist yet
    settings_check: Callable[[Any], None] | None = None
    models: Callable[[Any], tuple[str, ...]] | None = None  # models(settings): models it calls beyond [models]
    inputs: tuple[Table, ...] = ()
    outputs: tuple[Table, ...] = ()
    feeds: dict[str, Feed] = field(default_factory=dict)  # parameter -> what earlier stages' outputs fill it with
    out_field: str | None = "out"  # the parameter naming the output folder (None: the stage has none)
    command: str | None = None  # the CLI command when it is not the stage's name
    cli_flags: dict[str, str] = field(default_factory=dict)  # parameter -> its CLI flag, when not --the-name
    cli_hidden: tuple[str, ...] = ()  # parameters the CLI does not offer (set by other commands, or Python only)
    cli_defaults: dict[str, Any] = field(default_factory=dict)  # parameter -> its value when its flag is left out
    fast_exit: bool = False  # the CLI process ends without the interpreter's teardown once done (cli/common.py)
    present: Callable[[dict, Any], str] | None = None  # present(result, params): what the CLI prints at the end
    kept: str | None = None  # the summary key counting what the stage kept: 0 of it makes the command fail (exit 1)
    deployment: Deployment | None = None
    # further CLI commands of the stage that are not its flow ("module:function", function(sub) adds the command,
    # e.g. eval's `compare`); the stage's own package owns them, cli/stages.py registers them
    commands: tuple[str, ...] = ()
    # extras(params, settings): the optional extras (pyproject.toml) a run needs, from tasks/core/extras.py's builders
    # (training(), ...), checked before it starts; None: the base install runs it (a Dask / Ray runner aside)
    extras: Callable[[Any, Any], list] | None = None

    @property
    def cli_name(self) -> str:
        return self.command or self.name

    def load_flow(self) -> Callable:
        module, _, attr = self.flow.partition(":")
        return getattr(importlib.import_module(module), attr)

    def folder_class(self) -> type | None:
        """The output folder's storage class (`folder` itself, or the class its import path names)."""
        if not isinstance(self.folder, str):
            return self.folder
        module, _, attr = self.folder.partition(":")
        return getattr(importlib.import_module(module), attr)

    def out_of(self, params: BaseModel) -> str | None:
        """The output folder the parameters name (None: the stage writes none, or it defaults elsewhere)."""
        return getattr(params, self.out_field) if self.out_field else None


_REGISTRY: dict[str, Stage] = {}


class UnknownStage(KeyError):
    pass


def register(stage: Stage) -> Stage:
    """Add a stage descriptor; registering the same name twice with another descriptor is an error."""
    known = _REGISTRY.get(stage.name)
    if known is not None and known is not stage:
        raise ValueError(f"stage {stage.name!r} is registered twice ({known.flow} and {stage.flow})")
    _REGISTRY[stage.name] = stage
    return stage


def unregister(name: str) -> None:
    """Remove a stage (tests that register a stage of their own)."""
    _REGISTRY.pop(name, None)


def _load() -> None:
    from evolforge.tasks import STAGE_PACKAGES

    for pkg in STAGE_PACKAGES:
        importlib.import_module(f"evolforge.tasks.{pkg}.stage")


def stages() -> list[Stage]:
    """Every registered stage: those of STAGE_PACKAGES in its order (within a package, in the order its stage
    module defines them), then any other registered stage (tests) in the order registered. The order does not
    depend on which module happened to be imported first."""
    _load()
    from evolforge.tasks import STAGE_PACKAGES

    rank: dict[str, int] = {}
    for pkg in STAGE_PACKAGES:
        for value in vars(importlib.import_module(f"evolforge.tasks.{pkg}.stage")).values():
            if isinstance(value, Stage) and _REGISTRY.get(value.name) is value:
                rank.setdefault(value.name, len(rank))
    ordered = sorted(_REGISTRY.values(), key=lambda st: rank.get(st.name, len(rank)))  # stable: the rest keep theirs
    return ordered


def get(name: str) -> Stage:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownStage(f"unknown stage {name!r} (known: {', '.join(_REGISTRY)})") from None
