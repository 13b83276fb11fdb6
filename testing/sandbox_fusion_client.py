"""verl's own SandboxFusion client, for driving `evolforge sandbox-serve` as verl does.

    client = load_client()              # verl/utils/reward_score/sandbox_fusion/utils.py as a module
    results, meta = client.check_correctness(url, {"inputs": [...], "outputs": [...]}, code, timeout=5)
    # VerlEnvUnavailable (.offline: the package index was unreachable) when neither source can be had
    response, error = client.call_sandbox_api(url, code, stdin, compile_timeout, run_timeout, memory_mb, "python")

verl pins an older transformers than this project, so it is never installed into the project's venv. That one
module needs only `requests`, so it is imported by path, unchanged, on its own (not through verl's package):
from verl's own environment (testing/verl_env.py, built once per machine and shared with the other verl tests),
or, when that cannot be built, from verl's wheel alone (`pip download verl==VERL_VERSION --no-deps`, cached in
$EVOLFORGE_VERL_CACHE or ~/.cache/evolforge/verl).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType

from evolforge.testing.verl_env import _OFFLINE, VERL_VERSION, VerlEnvUnavailable, ensure_verl_env

CLIENT_MODULE = "verl/utils/reward_score/sandbox_fusion/utils.py"


def cache_dir() -> Path:
    root = os.environ.get("EVOLFORGE_VERL_CACHE") or os.path.join(Path.home(), ".cache", "evolforge", "verl")
    return Path(root) / VERL_VERSION


def client_path() -> Path:
    """The client module's file: from verl's environment, else extracted from verl's wheel (downloaded once)."""
    try:
        return ensure_verl_env().source(CLIENT_MODULE.removeprefix("verl/"))
    except VerlEnvUnavailable:
        return wheel_client_path()


def wheel_client_path() -> Path:
    """The client module's file, extracted from verl's wheel alone (downloaded once)."""
    target = cache_dir() / CLIENT_MODULE
    if target.is_file():
        return target
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        out = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"verl=={VERL_VERSION}",
                              "-d", tmp], capture_output=True, text=True, timeout=600)
        wheels = list(Path(tmp).glob("verl-*.whl"))
        if out.returncode != 0 or not wheels:
            err = out.stderr.strip()[-800:]
            raise VerlEnvUnavailable(f"could not download verl=={VERL_VERSION}: {err}", offline=bool(_OFFLINE.search(err)))
        with zipfile.ZipFile(wheels[0]) as whl:
            source = whl.read(CLIENT_MODULE)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tmp) / "utils.py"
        partial.write_bytes(source)
        os.replace(partial, target)  # atomic: a concurrent loader sees the whole file or none
    return target


def load_client() -> ModuleType:
    """verl's sandbox_fusion client module (check_correctness, call_sandbox_api), imported by path."""
    name = "verl_sandbox_fusion_client"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, client_path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module
