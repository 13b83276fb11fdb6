"""What the cached third-party environments (verl_env, distilabel_env) share: where one lives, its key,
and how a failed build says whether the package index was unreachable."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

OFFLINE = re.compile(r"NewConnectionError|Network is unreachable|Temporary failure in name resolution|"
                     r"Name or service not known|Connection refused|ConnectTimeout|timed out", re.I)


class CachedEnvUnavailable(RuntimeError):
    """An environment could not be built. `offline`: the package index was unreachable."""

    def __init__(self, message: str, offline: bool = False):
        super().__init__(message)
        self.offline = offline


def env_key(requirements: tuple[str, ...]) -> str:
    """The Python version and the requirements, hashed: a new pin builds a new environment."""
    text = f"py{sys.version_info.major}.{sys.version_info.minor}\n" + "\n".join(requirements)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def env_dir(variable: str, folder: str, requirements: tuple[str, ...]) -> Path:
    """$variable when set, else ~/.cache/evolforge/<folder>/<key> (XDG_CACHE_HOME honoured)."""
    given = os.environ.get(variable)
    if given:
        return Path(given).expanduser().resolve()  # resolved: its lock and files are written without links
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser().resolve()
    return cache / "evolforge" / folder / env_key(requirements)
