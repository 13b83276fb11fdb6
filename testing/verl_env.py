"""verl in an environment of its own, for tests that check evolforge's output with verl's own code.

verl pins packages older than evolforge's (transformers < 5.11, tokenizers <= 0.23.0, huggingface-hub < 2,
omegaconf < 2.4 with antlr4 4.9), so it cannot live in the project's virtualenv. Instead it is installed once,
`pip install --target <dir> --no-deps` of verl and only the packages its config (Hydra), reward loader and
dataset import (REQUIREMENTS), into a cache folder outside the repository:

    $EVOLFORGE_VERL_ENV, else ~/.cache/evolforge/verl-env/<key>   (key: python version + REQUIREMENTS)

Code then runs in a subprocess of the project's python with that folder first on PYTHONPATH: verl and its
pinned packages shadow the project's, everything else (torch, numpy, pandas, pyarrow, datasets, requests,
evolforge itself) comes from the project's virtualenv. The first build takes about 1.5 minutes and about
390 MB of disk (ray and transformers are most of it); later calls find the folder and return at once.
Concurrent builders wait on a lock; a half-built folder is never used (built aside, then renamed).

Usage (the names are stable):

    from evolforge.testing.verl_env import ensure_verl_env, VerlEnvUnavailable

    env = ensure_verl_env()                 # builds on first use; VerlEnvUnavailable if pip cannot install
    env.run("import verl; print(verl.__version__)")          # -> subprocess.CompletedProcess (text; input=stdin)
    env.run_json("import json, verl; print(json.dumps(verl.__version__))")   # the last stdout line as JSON
    env.source("utils/reward_score/sandbox_fusion/utils.py")  # a file of the installed verl package (Path)
    env.environ()                            # the environment to start your own subprocess with
    env.python, env.site, env.version        # interpreter, the --target folder, verl's version

`VerlEnvUnavailable.offline` is True when pip failed because the package index is unreachable (tests skip
then, with the reason); any other failure is a real error. Nothing here needs a GPU; verl's trainer does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolforge.storage.locks import lock_file
from evolforge.testing import cached_env
from evolforge.testing.cached_env import OFFLINE, CachedEnvUnavailable

VERL_VERSION = "0.9.1"
# verl itself (--no-deps) and what `import verl`, its Hydra config, reward loader and RLHFDataset need beyond the
# project's virtualenv, at the versions verl's own requirements allow.
REQUIREMENTS = (
    f"verl=={VERL_VERSION}",
    "hydra-core==1.3.*",
    "omegaconf>=2.2,<2.4",
    "antlr4-python3-runtime==4.9.*",  # omegaconf 2.3's generated grammar needs the 4.9 runtime
    "ray>=2.41",  # verl.protocol imports ray at module level
    "codetiming",  # verl.utils.profiler (imported by verl.trainer.main_ppo's chain)
    "tensordict==0.10.0",
    "pyvers>=0.1,<0.2",  # tensordict's
    "transformers>=5.5.3,<5.11,!=5.6.0",
    "tokenizers>=0.22,<=0.23.0",  # transformers 5.10's
    "huggingface-hub>=1.5,<2",  # transformers 5.10's
)
_OFFLINE = OFFLINE
BUILD_TIMEOUT_S = 1800.0


class VerlEnvUnavailable(CachedEnvUnavailable):
    """verl's environment could not be built. `offline`: the package index was unreachable."""


def env_key(requirements: tuple[str, ...] = REQUIREMENTS) -> str:
    return cached_env.env_key(requirements)


def env_dir(requirements: tuple[str, ...] = REQUIREMENTS) -> Path:
    """Where the environment lives: $EVOLFORGE_VERL_ENV, else ~/.cache/evolforge/verl-env/<key>."""
    return cached_env.env_dir("EVOLFORGE_VERL_ENV", "verl-env", requirements)


MARKER = ".evolforge-verl-env.json"
# Packages of the project's virtualenv that must not be seen by verl's pinned ones (each raises ImportError).
SHADOW = Path(__file__).resolve().parent / "verl_shadow"


@dataclass(frozen=True)
class VerlEnv:
    """A built environment: run python with verl importable."""

    site: Path  # the pip --target folder
    python: str = sys.executable
    version: str = VERL_VERSION

    @property
    def verl_dir(self) -> Path:
        return self.site / "verl"

    def source(self, relative: str) -> Path:
        """A file of the installed verl package, e.g. "trainer/config/ppo_trainer.yaml"."""
        path = self.verl_dir / relative
        if not path.exists():
            raise FileNotFoundError(f"verl {self.version} has no {relative} (looked in {self.verl_dir})")
        return path

    def environ(self, base: dict | None = None) -> dict[str, str]:
        """`base` (default os.environ) with the env, then SHADOW, first on PYTHONPATH, hub access off, Ray quiet."""
        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join([str(self.site), str(SHADOW), *filter(None, [env.get("PYTHONPATH")])])
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                    "RAY_USAGE_STATS_ENABLED": "0", "PYTHONNOUSERSITE": "1"})
        return env

    def run(self, code: str, *args: str, timeout: float = 300.0, cwd: str | Path | None = None,
            env: dict | None = None, check: bool = False, input: str | None = None) -> subprocess.CompletedProcess:
        """`python -c code args...` with verl importable; `input` on stdin; stdout/stderr captured as text."""
        return subprocess.run([self.python, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                              cwd=cwd, env=self.environ(env), check=check, input=input)

    def run_json(self, code: str, *args: str, timeout: float = 300.0, cwd: str | Path | None = None,
                 env: dict | None = None, input: str | None = None) -> Any:
        """Run `code` and parse its last stdout line as JSON; RuntimeError with stderr when it fails."""
        proc = self.run(code, *args, timeout=timeout, cwd=cwd, env=env, input=input)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"verl subprocess failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}\n"
                               f"stdout: {proc.stdout[-1000:]}")
        return json.loads(lines[-1])


def _pip_install(target: Path, requirements: tuple[str, ...], timeout: float) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
           "--no-deps", "--target", str(target), "--timeout", "30", "--retries", "2", *requirements]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise VerlEnvUnavailable(f"pip install of verl's environment took over {timeout:.0f} s", offline=True) from e
    if proc.returncode != 0:
        err = proc.stderr.strip()[-3000:]
        raise VerlEnvUnavailable(f"pip install of verl's environment failed (exit {proc.returncode}): {err}",
                                 offline=bool(_OFFLINE.search(err)))


def ensure_verl_env(requirements: tuple[str, ...] = REQUIREMENTS, timeout: float = BUILD_TIMEOUT_S) -> VerlEnv:
    """The environment, built on first use (once per machine and REQUIREMENTS; concurrent callers wait)."""
    root = env_dir(requirements)
    env = VerlEnv(site=root / "site")
    if (root / MARKER).is_file():
        return env
    root.parent.mkdir(parents=True, exist_ok=True)
    with lock_file(root.parent / f"{root.name}.lock", timeout=timeout, what="verl environment build"):
        if (root / MARKER).is_file():
            return env
        build = Path(tempfile.mkdtemp(prefix=f".{root.name}-build-", dir=root.parent))
        try:
            _pip_install(build / "site", requirements, timeout)
            probe = VerlEnv(site=build / "site").run("import verl, hydra, omegaconf; print(verl.__version__)",
                                                     timeout=300)
            if probe.returncode != 0:
                raise VerlEnvUnavailable(f"verl's environment was installed but `import verl` fails:\n"
                                         f"{probe.stderr[-3000:]}")
            (build / MARKER).write_text(json.dumps({"requirements": list(requirements), "python": sys.executable,
                                                    "verl": probe.stdout.strip()}, indent=1))
            if root.exists():  # a folder without its marker: an older, unfinished build
                shutil.rmtree(root)
            build.rename(root)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    return env
