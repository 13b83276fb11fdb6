"""The agent CLIs (OpenAI's Codex, Anthropic's Claude Code) run against the recording proxy, for slow tests.

They are npm packages, installed outside the repo into a cache folder (EVOLFORGE_NPM_CACHE, default
~/.cache/evolforge/npm; `make agent-clis` does it):

    npm install --prefix ~/.cache/evolforge/npm @openai/codex @anthropic-ai/claude-code

or anywhere on PATH (`npm install -g ...`): the cache folder's copy is used first, else the one on PATH.
`missing(name)` says why a CLI cannot run here (no node, in neither place, `--version` fails) or None; `codex_exec` and `claude_print`
run one non-interactive session in a fresh home (no user config, no real key: a dummy one the scripted
upstreams ignore) with the model endpoint at the proxy, and return the finished process. Nothing here reaches the
network: every call the CLIs make to a model goes to the given base URL, and their non-essential traffic is off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

PACKAGES = {"codex": "@openai/codex", "claude": "@anthropic-ai/claude-code"}
DUMMY_KEY = "sk-evolforge-dummy"  # what the CLIs send as their key: the scripted upstreams take any


def npm_cache() -> Path:
    return Path(os.environ.get("EVOLFORGE_NPM_CACHE") or Path.home() / ".cache" / "evolforge" / "npm")


def binary(name: str) -> Path:
    """The CLI `name` (codex, claude): the cache folder's, else the one on PATH (else the cache path, missing)."""
    cached = npm_cache() / "node_modules" / ".bin" / name
    if os.access(cached, os.X_OK):
        return cached
    on_path = shutil.which(name)
    return Path(on_path) if on_path else cached


def install_command() -> str:
    return f"npm install --prefix {npm_cache()} {' '.join(PACKAGES.values())}"


def missing(name: str) -> str | None:
    """Why the CLI `name` (codex, claude) cannot run here, or None."""
    if not shutil.which("node"):
        return "node is not installed (the agent CLIs are npm packages)"
    path = binary(name)
    if not os.access(path, os.X_OK):
        return (f"{PACKAGES[name]} is installed neither in {npm_cache()} (EVOLFORGE_NPM_CACHE) nor on PATH "
                f"(no `{name}` command): {install_command()}")
    try:
        subprocess.run([str(path), "--version"], capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{PACKAGES[name]} is installed ({path}) but `{name} --version` fails: {type(e).__name__}"
    return None


def _env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment: PATH and a fresh HOME, no key of the user's (nothing inherited but PATH and locale)."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")}
    home.mkdir(parents=True, exist_ok=True)
    return {**env, "HOME": str(home), **extra}


def codex_config(base_url: str, model: str, env_headers: dict[str, str] | None = None) -> str:
    """CODEX_HOME/config.toml: a custom model provider at `base_url` (the proxy's /v1) speaking the Responses
    API, no retries (a failure shows at once), no update check, no analytics; `env_headers`: header name ->
    the environment variable Codex sends as its value (env_http_headers, e.g. the proxy's access token)."""
    headers = ", ".join(f'"{k}" = "{v}"' for k, v in (env_headers or {}).items())
    return (f'model = "{model}"\nmodel_provider = "evolforge"\ncheck_for_update_on_startup = false\n\n'
            "[analytics]\nenabled = false\n\n"
            "[model_providers.evolforge]\n"
            'name = "evolforge recording proxy"\n'
            f'base_url = "{base_url}"\n'
            'wire_api = "responses"\n'
            'env_key = "EVOLFORGE_CLI_KEY"\n'
            "request_max_retries = 0\nstream_max_retries = 0\n"
            + (f"env_http_headers = {{ {headers} }}\n" if headers else ""))


def codex_exec(base_url: str, workdir: Path, home: Path, prompt: str, model: str = "resp-model",
               timeout: float = 300, env_headers: dict[str, str] | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`codex exec PROMPT` in `workdir` against `base_url` (e.g. http://127.0.0.1:PORT/s/SESSION/v1). Commands
    the model asks for run without Codex's sandbox (it needs kernel features a container may lack) and without
    approval: run it only on scripted upstreams or in a folder you can lose."""
    codex_home = home / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url, model, env_headers))
    env = _env(home, CODEX_HOME=str(codex_home), EVOLFORGE_CLI_KEY=DUMMY_KEY, **(env or {}))
    cmd = [str(binary("codex")), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
           "--color", "never", prompt]
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def claude_print(base_url: str, workdir: Path, home: Path, prompt: str, model: str = "claude-test",
                 allowed_tools: str = "Bash(echo:*)", timeout: float = 300,
                 headers: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`claude -p PROMPT` in `workdir` with ANTHROPIC_BASE_URL at `base_url` (the proxy's root, or
    http://127.0.0.1:PORT/s/SESSION; never .../v1), a dummy ANTHROPIC_API_KEY and
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 (no telemetry, error reports or update checks); `headers` go in
    ANTHROPIC_CUSTOM_HEADERS ("Name: value" lines: the session, the proxy token); `allowed_tools` are allowed
    without asking (print mode cannot ask)."""
    custom = {"ANTHROPIC_CUSTOM_HEADERS": "\n".join(f"{k}: {v}" for k, v in headers.items())} if headers else {}
    env = _env(home, **custom, ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY=DUMMY_KEY,
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1",
               DISABLE_ERROR_REPORTING="1")
    cmd = [str(binary("claude")), "-p", prompt, "--model", model, "--allowedTools", allowed_tools]
    return subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
