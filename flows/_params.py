"""The model endpoint of a run (the configured one, or the embedded model for the length of the run).

The stage parameter models' base classes live in tasks/core/params.py (Prefect-free, so the CLI builds its
flags from them without importing Prefect); they are re-exported here for older imports."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from evolforge.config.settings import Settings
from evolforge.tasks.core.params import EndpointParams, StageParams

if TYPE_CHECKING:
    from evolforge.storage.folder import StageFolder

__all__ = ["EndpointParams", "StageParams", "model_endpoint", "endpoint_label"]


@contextlib.contextmanager
def model_endpoint(settings: Settings, folder: StageFolder):
    """The configured endpoint, or the embedded model for the length of the run (its log in the folder's logs/)."""
    from evolforge.tasks.core.embedded_model import embedded_server

    if settings.uses_embedded_model:
        with embedded_server(settings.embedded, folder.logs_dir) as url:
            yield url
    else:
        yield settings.gateway.base_url


def endpoint_label(settings: Settings, base_url: str) -> str:
    """The endpoint as summaries show it."""
    return f"embedded {settings.embedded.alias}" if settings.uses_embedded_model else base_url
