"""Flow parameters shared by every stage, and the one way they become settings.

`StageParams` (config file + nested overrides) and `EndpointParams` (plus base_url and model) are the base
of every flow's parameter model, so the Prefect UI shows the same documented fields for every stage and
the CLI, the flows and the deployments merge them the same way:

    defaults < TOML file (config) < EVOLFORGE__SECTION__KEY environment < overrides < the flow's own fields

A stage adds its own fields to the merge with `stage_overrides()` (e.g. the evolve flow's `rounds`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from evolforge.config.settings import Settings, deep_merge, load_settings

if TYPE_CHECKING:  # light to import: the CLI merges settings with it before its fail-fast checks
    from evolforge.storage.layout import RunLayout


class StageParams(BaseModel):
    """A config file and nested overrides: the parameters every stage takes."""

    config: str | None = Field(None, description="TOML config file (default: config/default.toml).")
    overrides: dict[str, Any] = Field(default_factory=dict, description='Nested config overrides, e.g. '
                                      '{"evol_instruct": {"batch_size": 64}}.')

    def stage_overrides(self) -> dict[str, Any]:
        """The settings this stage's own fields set (none by default)."""
        return {}

    def settings(self) -> Settings:
        return load_settings(self.config, deep_merge(self.overrides, self.stage_overrides()))


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
        return load_settings(self.config, deep_merge(deep_merge(self.overrides, endpoint), self.stage_overrides()))


@contextlib.contextmanager
def model_endpoint(settings: Settings, layout: RunLayout):
    """The configured endpoint, or the embedded model for the length of the run."""
    from evolforge.tasks.core.embedded_model import embedded_server

    if settings.uses_embedded_model:
        with embedded_server(settings.embedded, layout.logs_dir) as url:
            yield url
    else:
        yield settings.gateway.base_url


def endpoint_label(settings: Settings, base_url: str) -> str:
    """The endpoint as summaries show it."""
    return f"embedded {settings.embedded.alias}" if settings.uses_embedded_model else base_url
