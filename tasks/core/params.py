"""Flow parameters shared by every stage, and the one way they become settings.

`StageParams` (config file + nested overrides) and `EndpointParams` (plus base_url and model) are the base
of every stage's parameter model (declared in its `tasks/<stage>/stage.py`), so the Prefect UI shows the same
documented fields for every stage, and the CLI builds each command's flags from the same fields
(cli/stage_args.py). Every stage merges them the same way:

    defaults < TOML file (config) < EVOLFORGE__SECTION__KEY environment < overrides < the stage's own fields

A stage adds its own fields to the merge with `stage_overrides()` (e.g. the evolve stage's `rounds`).
Prefect-free and light to import: the CLI builds its parsers and runs its fail-fast checks with it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolforge.config.settings import Settings, deep_merge, load_settings


class StageParams(BaseModel):
    """A config file and nested overrides: the parameters every stage takes."""

    # the validator is built when first used: the CLI's flags and --help read only the fields
    model_config = ConfigDict(defer_build=True)

    config: str | None = Field(None, description="TOML config file (default: config/default.toml).")
    overrides: dict[str, Any] = Field(default_factory=dict, description='Nested config overrides, e.g. '
                                      '{"evol_instruct": {"batch_size": 64}}.')

    def stage_overrides(self) -> dict[str, Any]:
        """The settings this stage's own fields set (none by default)."""
        return {}

    def settings(self) -> Settings:
        own = self.stage_overrides()
        return load_settings(self.config, deep_merge(self.overrides, own), flags=flags_of(self, own))


class EndpointParams(StageParams):
    """A stage that calls models: the endpoint and the default model may be given per run."""

    base_url: str | None = Field(None, description="OpenAI-compatible endpoint; empty uses the embedded model.")
    model: str | None = Field(None, description="Model for every stage without its own model in the config.")

    def settings(self) -> Settings:
        endpoint: dict[str, Any] = {}
        if self.base_url is not None:
            endpoint["gateway"] = {"base_url": self.base_url}
        if self.model:
            endpoint["models"] = {"default": self.model}
        own = deep_merge(endpoint, self.stage_overrides())
        return load_settings(self.config, deep_merge(self.overrides, own), flags=flags_of(self, own))


def leaves(tree: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, v in tree.items():
        out += leaves(v, (*prefix, k)) if isinstance(v, dict) and v else [(*prefix, k)]
    return out


FIELD_OF = {"gateway.base_url": "base_url", "models.default": "model"}  # settings keys a differently named field sets


def flags_of(params: BaseModel, own: dict[str, Any]) -> dict[str, str]:
    """Dotted settings key -> "--flag (flow parameter name)" for the keys a stage's own fields set (`own`): what
    an invalid value of one of them is blamed on (config/settings.py)."""
    out = {}
    for path in leaves(own):
        dotted = ".".join(path)
        name = FIELD_OF.get(dotted, path[-1])
        if name in type(params).model_fields:
            out[dotted] = f"--{name.replace('_', '-')} (flow parameter {name})"
    return out


def overrides_from(params: BaseModel, section: str, fields: tuple[str, ...]) -> dict[str, Any]:
    """{section: {field: value}} for the given fields of `params` that are set (not None): how a stage's own
    fields that mirror config keys of the same name reach the settings."""
    values = {k: getattr(params, k) for k in fields if getattr(params, k) is not None}
    return {section: values} if values else {}
