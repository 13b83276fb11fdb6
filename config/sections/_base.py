"""The base of every settings section: unknown keys and wrong types fail at load, naming the key.

Also the types shared by the sections of the project's HTTP services (the recording proxy, the sandbox service):
`HostNames` (allowed_hosts) and `WebOrigins` (allowed_origins), normalised as the request checks compare them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


class Section(BaseModel):
    # defer_build: a section's validator is built when first used, not at import (the CLI's --help builds none)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)


def _host_names(v: list[str]) -> list[str]:
    return [h.strip().lower().strip("[]") for h in v if h.strip()]


def _web_origins(v: list[str]) -> list[str]:
    bad = [o for o in v if o != "*" and ("://" not in o or o.rstrip("/").count("/") != 2)]
    if bad:
        raise ValueError(f"an origin is scheme://host[:port] with no path (or \"*\"), got {bad}")
    return [o.rstrip("/").lower() for o in v]


HostNames = Annotated[list[str], AfterValidator(_host_names)]
WebOrigins = Annotated[list[str], AfterValidator(_web_origins)]
