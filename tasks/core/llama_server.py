"""llama.cpp's own `llama-server` for the embedded model: where its binary lives, its command, its one-time build.

The binary is built from the llama.cpp source vendored in the llama-cpp-python sdist of version
`LLAMA_CPP_PYTHON_VERSION` (pinned here; llama-cpp-python itself need not be installed), with the same portable
CPU flags as the Makefile's LLAMA_CMAKE_ARGS, once per machine, into
`$EVOLFORGE_CACHE or ~/.cache/evolforge` / `llama-server/<version>/llama-server`, so every clone, venv and CI run
of the project on the machine reuses it. The build downloads the sdist from the package index once (`pip download
--no-binary :all: --no-deps`) and compiles only the `llama-server` target (Release, no tests, examples or web UI
assets) with one compile job per CPU; running the server is offline.

llama-cpp-python's own server is only the fallback (`embedded.server = "auto"` when no binary is built): the
`embedded-fallback` extra installs it, which compiles llama.cpp a second time inside pip.

`make setup` runs this file as a script (`python -P tasks/core/llama_server.py --build`) while pip installs the
rest, so it imports nothing beyond the standard library at module level.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evolforge.config.settings import EmbeddedModelSettings

# The llama-cpp-python release whose vendored llama.cpp llama-server is built from (its sdist from the package
# index). Changing it builds a new binary next to the old one: llama-server/<version>/.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

# Same portable CPU build as the Makefile's LLAMA_CMAKE_ARGS (AVX2, no AVX-512/AMX: SIGILL on some VMs).
PORTABLE_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_AVX512=OFF",
    "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
)
# A self-contained binary without network features: no curl / OpenSSL, no shared libraries to keep next to it.
SERVER_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    # the web UI's assets are neither built (npm) nor fetched: the server runs with --no-webui
    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
)
# Compile time: the serving speed of llama-server is ggml's kernels (and llama.cpp's sampler and grammar, run for
# every token); the rest (the model graph builders, the chat parsers, the HTTP server, JSON) runs at -O1, which
# compiles in about two thirds of -O3's time. A CMake hook, called once the whole tree is configured.
FAST_COMPILE_HOOK = """\
function(_evolforge_fast_compile)
  foreach(t llama llama-common llama-common-base mtmd server-context llama-server-impl llama-server cpp-httplib)
    if(TARGET ${t})
      target_compile_options(${t} PRIVATE -O1)
    endif()
  endforeach()
  set_source_files_properties(
    "${CMAKE_SOURCE_DIR}/src/llama-sampler.cpp" "${CMAKE_SOURCE_DIR}/src/llama-grammar.cpp"
    DIRECTORY "${CMAKE_SOURCE_DIR}/src" PROPERTIES COMPILE_OPTIONS -O3)
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _evolforge_fast_compile)
"""
FALLBACK_HINT = "pip install 'evolforge[embedded-fallback]' for llama-cpp-python's server (compiles llama.cpp)"


class LlamaServerBuildError(RuntimeError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("EVOLFORGE_CACHE") or Path.home() / ".cache" / "evolforge") / "llama-server"


def cached_binary(version: str | None = None) -> Path:
    return cache_root() / (version or LLAMA_CPP_PYTHON_VERSION) / "llama-server"


def find_binary(cfg: EmbeddedModelSettings) -> Path | None:
    """The llama-server executable to use, or None when there is none."""
    if cfg.server_binary:
        path = Path(cfg.server_binary).expanduser()
        return path if path.is_file() and os.access(path, os.X_OK) else None
    path = cached_binary()
    return path if path.is_file() and os.access(path, os.X_OK) else None


def chosen_server(cfg: EmbeddedModelSettings) -> str:
    """'llama-server' or 'llama-cpp-python', following `embedded.server` (auto: llama-server when built, else
    llama-cpp-python; with neither the start fails naming both ways: embedded_model.server_command)."""
    if cfg.server != "auto":
        return cfg.server
    return "llama-server" if find_binary(cfg) else "llama-cpp-python"


def default_jobs() -> int:
    """Compile jobs: one per CPU this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))


def concurrency_cap(cfg: EmbeddedModelSettings, root_url: str | None = None) -> tuple[int, str]:
    """Calls in flight the embedded model takes, and where that number comes from: embedded.max_concurrent_calls
    when set; else one per llama-server slot, read from the running server's /props (`root_url`, its address
    without /v1) or, when it does not answer, `embedded.parallel` (what it was started with); 2 for
    llama-cpp-python's one-at-a-time server.

    One call per slot is the measured optimum: with 8 slots, 8 calls in flight gave the most completion tokens/s
    of 2, 4 and 8 (1 and 2 threads, BENCHMARKS.md), so the default 8 slots take 8 calls."""
    if cfg.max_concurrent_calls:
        return cfg.max_concurrent_calls, "embedded.max_concurrent_calls"
    if chosen_server(cfg) != "llama-server":
        return 2, "llama-cpp-python's server, one call at a time"
    slots = server_slots(root_url) if root_url else None
    if slots:
        return slots, f"the embedded llama-server's /props: {slots} slots"
    return cfg.parallel, f"embedded.parallel: {cfg.parallel} llama-server slots"


def server_slots(root_url: str, timeout: float = 2.0) -> int | None:
    """A llama-server's slot count (`total_slots` of GET /props), None when it does not say (bounded: 1-1024)."""
    import httpx

    try:
        r = httpx.get(root_url.rstrip("/") + "/props", timeout=timeout)
        slots = r.json().get("total_slots") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return slots if isinstance(slots, int) and not isinstance(slots, bool) and 1 <= slots <= 1024 else None


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


def build(version: str | None = None, jobs: int = 0, log=print) -> Path:
    """Build llama-server from the vendored llama.cpp of llama-cpp-python `version` (default: the pinned one);
    return the cached binary.

    Skipped when the binary is already cached; a second build started meanwhile (another clone, CI) waits for
    the first and reuses its binary. Needs cmake and a C++ compiler (ninja when there), and the package index
    once. `jobs`: compile jobs (0: one per CPU). $CMAKE_ARGS (as for pip installing llama-cpp-python; the
    Makefile passes its LLAMA_CMAKE_ARGS) replaces the portable CPU flags."""
    version = version or LLAMA_CPP_PYTHON_VERSION
    target = cached_binary(version)
    if target.is_file():
        log(f"llama-server {version}: already built at {target}")
        return target
    if not shutil.which("cmake"):
        raise LlamaServerBuildError("cmake is not installed (apt-get install cmake g++)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(target.parent):
        if target.is_file():  # built by the build this one waited for
            log(f"llama-server {version}: built meanwhile at {target}")
            return target
        _compile(version, target, jobs or default_jobs(), log)
    log(f"llama-server {version}: built {target}")
    return target


@contextlib.contextmanager
def _build_lock(folder: Path):
    with open(folder / ".build.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _compile(version: str, target: Path, jobs: int, log) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent, prefix="build-") as tmp:
        work = Path(tmp)
        log(f"llama-server {version}: downloading the llama-cpp-python {version} sdist")
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
              f"llama-cpp-python=={version}", "-d", str(work)])
        sdists = sorted(work.glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            raise LlamaServerBuildError(f"pip downloaded no llama-cpp-python {version} sdist")
        prefix = f"{sdists[0].name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        with tarfile.open(sdists[0]) as tar:  # only the vendored llama.cpp (the sdist is 75 MB)
            tar.extractall(work, members=[m for m in tar.getmembers() if m.name.startswith(prefix)],
                           filter="data")
        source = work / prefix
        if not (source / "tools" / "server").is_dir():
            raise LlamaServerBuildError("the sdist has no vendor/llama.cpp/tools/server")
        log(f"llama-server {version}: compiling with {jobs} job(s) (once per machine)")
        cpu_args = shlex.split(os.environ.get("CMAKE_ARGS", "")) or list(PORTABLE_CMAKE_ARGS)
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        hook = work / "fast-compile.cmake"
        hook.write_text(FAST_COMPILE_HOOK)
        _run(["cmake", "-S", str(source), "-B", str(work / "build"), *generator, *SERVER_CMAKE_ARGS, *cpu_args,
              f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={hook}"])
        _run(["cmake", "--build", str(work / "build"), "--target", "llama-server", "--parallel", str(jobs)])
        built = work / "build" / "bin" / "llama-server"
        if not built.is_file():
            raise LlamaServerBuildError(f"the build produced no {built}")
        partial = target.with_suffix(".partial")
        shutil.copy2(built, partial)
        os.replace(partial, target)  # atomic: a concurrent reader sees no binary or the whole one


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise LlamaServerBuildError(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}):\n{tail}")


def main(argv: list[str] | None = None) -> int:
    """`python -P tasks/core/llama_server.py --build [--jobs N]`: the build without the package installed."""
    import argparse

    p = argparse.ArgumentParser(prog="llama_server.py", description="build llama.cpp's llama-server once")
    p.add_argument("--build", action="store_true", required=True)
    p.add_argument("--jobs", type=int, default=0, help="compile jobs (0: one per CPU)")
    args = p.parse_args(argv)
    try:
        build(jobs=args.jobs, log=lambda m: print(m, flush=True))
    except LlamaServerBuildError as e:
        print(f"could not build llama-server: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
