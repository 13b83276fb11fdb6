"""distilabel in a virtualenv of its own, for the benchmark that runs its EvolInstruct beside `evolforge run`.

distilabel is never a dependency of the project: it pins its own datasets / openai / pydantic chain, and the
benchmark must measure it as a user installs it. So it lives in a separate virtualenv (`python -m venv` from the
project's interpreter, then `pip install distilabel[openai]==DISTILABEL_VERSION requests`) in a cache folder
outside the repository, built on first use by bench/bench_distilabel.py only:

    $EVOLFORGE_DISTILABEL_ENV, else ~/.cache/evolforge/distilabel-env/<key>   (key: python version + REQUIREMENTS)

The first build takes about a minute and about 630 MB of disk; later calls find the folder (its marker file)
and return at once. Concurrent builders wait on a lock; a folder without its marker (an interrupted build) is
removed and built again.

    from evolforge.testing.distilabel_env import ensure_distilabel_env, DistilabelEnvUnavailable

    env = ensure_distilabel_env()                  # DistilabelEnvUnavailable if pip cannot install
    env.python                                     # the environment's interpreter (run your script with it)
    env.version                                    # distilabel's installed version
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from evolforge.storage.locks import lock_file
from evolforge.testing import cached_env
from evolforge.testing.cached_env import OFFLINE, CachedEnvUnavailable

DISTILABEL_VERSION = "1.5.3"
# distilabel with its OpenAI client; requests is imported by distilabel.models (image generation) but not declared.
REQUIREMENTS = (f"distilabel[openai]=={DISTILABEL_VERSION}", "requests")
MARKER = ".evolforge-distilabel-env.json"
BUILD_TIMEOUT_S = 1800.0
_OFFLINE = OFFLINE


class DistilabelEnvUnavailable(CachedEnvUnavailable):
    """distilabel's environment could not be built. `offline`: the package index was unreachable."""


def env_key(requirements: tuple[str, ...] = REQUIREMENTS) -> str:
    return cached_env.env_key(requirements)


def env_dir(requirements: tuple[str, ...] = REQUIREMENTS) -> Path:
    """Where the environment lives: $EVOLFORGE_DISTILABEL_ENV, else ~/.cache/evolforge/distilabel-env/<key>."""
    return cached_env.env_dir("EVOLFORGE_DISTILABEL_ENV", "distilabel-env", requirements)


@dataclass(frozen=True)
class DistilabelEnv:
    """A built environment."""

    root: Path
    version: str = DISTILABEL_VERSION

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")


def _run(cmd: list[str], timeout: float, what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise DistilabelEnvUnavailable(f"{what} took over {timeout:.0f} s", offline=True) from e
    if proc.returncode != 0:
        err = proc.stderr.strip()[-3000:]
        raise DistilabelEnvUnavailable(f"{what} failed (exit {proc.returncode}): {err}",
                                       offline=bool(_OFFLINE.search(err)))


def ensure_distilabel_env(requirements: tuple[str, ...] = REQUIREMENTS,
                          timeout: float = BUILD_TIMEOUT_S) -> DistilabelEnv:
    """The environment, built on first use (once per machine and REQUIREMENTS; concurrent callers wait)."""
    root = env_dir(requirements)
    if (root / MARKER).is_file():
        return DistilabelEnv(root, json.loads((root / MARKER).read_text()).get("distilabel", DISTILABEL_VERSION))
    root.parent.mkdir(parents=True, exist_ok=True)
    with lock_file(root.parent / f"{root.name}.lock", timeout=timeout, what="distilabel environment build"):
        if (root / MARKER).is_file():
            return DistilabelEnv(root)
        if root.exists():  # an interrupted build: no marker
            shutil.rmtree(root)
        try:
            _run([sys.executable, "-m", "venv", str(root)], 300, "python -m venv")
            _run([str(root / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  "--no-input", "--timeout", "30", "--retries", "2", *requirements], timeout,
                 "pip install of distilabel's environment")
            probe = subprocess.run([str(root / "bin" / "python"), "-c",
                                    "import distilabel, distilabel.models, distilabel.pipeline, "
                                    "distilabel.steps.tasks; print(distilabel.__version__)"],
                                   capture_output=True, text=True, timeout=300)
            if probe.returncode != 0:
                raise DistilabelEnvUnavailable(f"distilabel was installed but does not import:\n{probe.stderr[-3000:]}")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        version = probe.stdout.strip()
        (root / MARKER).write_text(json.dumps({"requirements": list(requirements), "distilabel": version}, indent=1))
    return DistilabelEnv(root, version)
