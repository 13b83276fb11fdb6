"""verl's own SandboxFusion client, for driving `evolforge sandbox-serve` as verl does.

    client = load_client()              # verl/utils/reward_score/sandbox_fusion/utils.py as a module
    results, meta = client.check_correctness(url, {"inputs": [...], "outputs": [...]}, code, timeout=5)
    response, error = client.call_sandbox_api(url, code, stdin, compile_timeout, run_timeout, memory_mb, "python")

verl pins an older transformers than this project, so it is never installed into the project's venv. That one
module needs only `requests`: it is taken from verl's wheel (`pip download verl==VERL_VERSION --no-deps`, cached in
$EVOLFORGE_VERL_CACHE or ~/.cache/evolforge/verl) and imported by path, unchanged.
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

VERL_VERSION = "0.9.1"
CLIENT_MODULE = "verl/utils/reward_score/sandbox_fusion/utils.py"


def cache_dir() -> Path:
    root = os.environ.get("EVOLFORGE_VERL_CACHE") or os.path.join(Path.home(), ".cache", "evolforge", "verl")
    return Path(root) / VERL_VERSION


def client_path() -> Path:
    """The client module's file, extracted from verl's wheel (downloaded once)."""
    target = cache_dir() / CLIENT_MODULE
    if target.is_file():
        return target
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        out = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"verl=={VERL_VERSION}",
                              "-d", tmp], capture_output=True, text=True, timeout=600)
        wheels = list(Path(tmp).glob("verl-*.whl"))
        if out.returncode != 0 or not wheels:
            raise RuntimeError(f"could not download verl=={VERL_VERSION}: {out.stderr.strip()[-800:]}")
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
