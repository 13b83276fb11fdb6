"""llama.cpp's own `llama-server` for the embedded model: where its binary lives, its command, its one-time build.

The binary is built from the llama.cpp source vendored in the installed llama-cpp-python (same version, same
portable CPU flags as the Makefile's LLAMA_CMAKE_ARGS), once per machine, into
`$EVOLFORGE_CACHE or ~/.cache/evolforge` / `llama-server/<llama-cpp-python version>/llama-server`, so every clone
and venv of the project on the machine reuses it. The build downloads the llama-cpp-python sdist from the package
index once (pip); running the server is offline.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

from evolforge.config.settings import EmbeddedModelSettings

# Same portable CPU build as the Makefile's LLAMA_CMAKE_ARGS (AVX2, no AVX-512/AMX: SIGILL on some VMs).
PORTABLE_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_AVX512=OFF",
    "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
)
# A self-contained binary without network features: no curl / OpenSSL, no shared libraries to keep next to it.
SERVER_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
)


class LlamaServerBuildError(RuntimeError):
    pass


def llama_cpp_version() -> str | None:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return None


def cache_root() -> Path:
    return Path(os.environ.get("EVOLFORGE_CACHE") or Path.home() / ".cache" / "evolforge") / "llama-server"


def cached_binary(version: str | None = None) -> Path | None:
    version = version or llama_cpp_version()
    return cache_root() / version / "llama-server" if version else None


def find_binary(cfg: EmbeddedModelSettings) -> Path | None:
    """The llama-server executable to use, or None when there is none."""
    if cfg.server_binary:
        path = Path(cfg.server_binary).expanduser()
        return path if path.is_file() and os.access(path, os.X_OK) else None
    path = cached_binary()
    return path if path and path.is_file() and os.access(path, os.X_OK) else None


def chosen_server(cfg: EmbeddedModelSettings) -> str:
    """'llama-server' or 'llama-cpp-python', following `embedded.server` (auto: llama-server when built)."""
    if cfg.server != "auto":
        return cfg.server
    return "llama-server" if find_binary(cfg) else "llama-cpp-python"


def concurrency_cap(cfg: EmbeddedModelSettings) -> int:
    """Calls in flight the gateway allows against the embedded model (embedded.max_concurrent_calls, 0: follow the
    server: one per llama-server slot, 2 for llama-cpp-python's one-at-a-time server).

    One call per slot is the measured optimum: with 8 slots, 8 calls in flight gave the most completion tokens/s
    of 2, 4 and 8 (1 and 2 threads, BENCHMARKS.md), so the default 8 slots take 8 calls."""
    if cfg.max_concurrent_calls:
        return cfg.max_concurrent_calls
    return cfg.parallel if chosen_server(cfg) == "llama-server" else 2


def thread_count(cfg: EmbeddedModelSettings) -> int:
    """llama.cpp threads: `n_threads`, or for 0 half the CPUs this process may run on (at least 1)."""
    if cfg.n_threads > 0:
        return cfg.n_threads
    return max(1, len(os.sched_getaffinity(0)) // 2)


def command(binary: Path, cfg: EmbeddedModelSettings, model: str, port: int) -> list[str]:
    threads = str(thread_count(cfg))
    return [
        str(binary), "--model", model, "--alias", cfg.alias, "--host", cfg.host, "--port", str(port),
        "--threads", threads, "--threads-batch", threads,
        # every slot gets the configured context: the server's KV cache is split evenly between slots
        "--ctx-size", str(cfg.n_ctx * cfg.parallel), "--parallel", str(cfg.parallel), "--cont-batching",
        "--no-webui", "--jinja",
    ]


def build(version: str | None = None, jobs: int = 2, log=print) -> Path:
    """Build llama-server from the installed llama-cpp-python's vendored llama.cpp; return the cached binary.

    Skipped when the binary is already cached. Needs cmake and a C++ compiler, and the package index once.
    $CMAKE_ARGS (as for pip installing llama-cpp-python; the Makefile passes its LLAMA_CMAKE_ARGS) replaces the
    portable CPU flags."""
    version = version or llama_cpp_version()
    if not version:
        raise LlamaServerBuildError("llama-cpp-python is not installed: pip install 'evolforge[embedded]'")
    target = cached_binary(version)
    if target.is_file():
        log(f"llama-server {version}: already built at {target}")
        return target
    if not shutil.which("cmake"):
        raise LlamaServerBuildError("cmake is not installed (apt-get install cmake)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix="build-") as tmp:
        work = Path(tmp)
        log(f"llama-server {version}: downloading the llama-cpp-python sdist")
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
              f"llama-cpp-python=={version}", "-d", str(work)])
        sdists = sorted(work.glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            raise LlamaServerBuildError(f"pip downloaded no llama-cpp-python {version} sdist")
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"), None)
        if source is None or not (source / "tools" / "server").is_dir():
            raise LlamaServerBuildError("the sdist has no vendor/llama.cpp/tools/server")
        log(f"llama-server {version}: compiling (a few minutes per core; once per machine)")
        cpu_args = shlex.split(os.environ.get("CMAKE_ARGS", "")) or list(PORTABLE_CMAKE_ARGS)
        _run(["cmake", "-S", str(source), "-B", str(work / "build"), *SERVER_CMAKE_ARGS, *cpu_args])
        _run(["cmake", "--build", str(work / "build"), "--target", "llama-server", f"-j{jobs}"])
        built = work / "build" / "bin" / "llama-server"
        if not built.is_file():
            raise LlamaServerBuildError(f"the build produced no {built}")
        partial = target.with_suffix(".partial")
        shutil.copy2(built, partial)
        os.replace(partial, target)  # atomic: a concurrent reader sees no binary or the whole one
    log(f"llama-server {version}: built {target}")
    return target


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise LlamaServerBuildError(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}):\n{tail}")
