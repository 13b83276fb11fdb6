"""The sandbox behind SandboxFusion's HTTP API, so verl's built-in code reward can use it unchanged.

    evolforge sandbox-serve [--host 127.0.0.1] [--port 8080]
    verl: reward.sandbox_fusion.url=http://HOST:PORT/run_code   (verl 0.5-0.7: reward_model.sandbox_fusion.url)

Routes (SandboxFusion's names and JSON, field for field):
    POST /run_code     RunCodeRequest -> RunCodeResponse
    GET  /v1/ping      "pong"
    the same under /t/{token}/...  (the access token in the path: verl's client sends no headers of its own)

A request's `run_timeout` (wall seconds; also the CPU-seconds limit, rounded up) and `memory_limit_MB`
(RLIMIT_AS per process; <= 0: the server's) can only tighten the server's caps (`[sandbox]`: wall_timeout_seconds,
cpu_seconds, memory_mb; output, processes, file size and isolation as configured). Languages "python" and
"nodejs": the code runs as `python main.py` / `node main.js` with `stdin` on its standard input (tasks/sandbox/run.py
run_program; node's address-space limit is memory_mb + 1024 MiB, its JavaScript heap memory_mb). Every other
language of SandboxFusion is answered as SandboxFusion answers a sandbox-side failure (HTTP 200, status
"SandboxError", a message; verl scores it -1, not as the model's fault), and so are non-empty `files` /
`fetch_files` (not supported yet). A language SandboxFusion does not know, a malformed body or a wrong field
gets FastAPI's 422 `{"detail": [...]}` as SandboxFusion's server would send; 401 / 404 / 413 / 504 carry
`{"detail": "..."}`.

Who may call (tasks/core/request_guard.py, before anything else): `Host` must name this machine (loopback, the
address the connection came in on, the bind address, or `allowed_hosts`), a browser-originated request (`Origin`,
`Sec-Fetch-Site: cross-site`) is refused unless `allowed_origins` lists its page (403 for both), and a `/run_code`
body must be declared JSON (415): a web page, or a DNS-rebinding name, cannot make a loopback service run code.
verl's client (JSON, no Origin) passes. With `allowed_origins` set, Starlette's CORS middleware answers those
pages' preflights.

Status mapping: wall or CPU limit -> run_result.status "TimeLimitExceeded" (return_code null), status "Failed";
exit 0 -> "Finished" / "Success"; any other exit or kill (memory, processes, output cap, signal) ->
"Finished" with its return code / "Failed", the kill reason in `message`.

At most `sandbox.service.max_concurrency` runs at once, each in a worker thread (the event loop only parses and
answers); a call that waits longer than `queue_timeout_seconds` for a slot gets 504, which verl's client retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Literal, Optional

from pydantic import BaseModel, Field, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from evolforge.config.sections.sandbox import SandboxSettings
from evolforge.tasks.core import serving
from evolforge.tasks.core.gateway import is_loopback
from evolforge.tasks.core.keys import token_accepted
from evolforge.tasks.core.request_guard import cors_settings, door_refusal, json_body_refusal
from evolforge.tasks.sandbox.run import SandboxResult, check_sandbox_available, run_program

# SandboxFusion's `Language` (sandbox/runners/types.py), in its order
Language = Literal['python', 'cpp', 'nodejs', 'go', 'go_test', 'java', 'php', 'csharp', 'bash', 'typescript', 'sql',
                   'rust', 'cuda', 'lua', 'R', 'perl', 'D_ut', 'ruby', 'scala', 'julia', 'pytest', 'junit',
                   'kotlin_script', 'jest', 'verilog', 'python_gpu', 'lean', 'swift', 'racket']
SUPPORTED_LANGUAGES = ("python", "nodejs")  # rows of tasks/sandbox/languages.py
MIN_MEMORY_MB = 64  # below this the interpreter cannot start; a smaller request gets this much
TIMEOUT_KILLS = ("wall_timeout", "cpu_limit")


class ServiceConfigError(ValueError):
    """The service cannot start as configured (a public bind address without an access token)."""


class RunCodeRequest(BaseModel):
    """SandboxFusion's request (sandbox/server/sandbox_api.py); timeouts must also be finite, run_timeout > 0, and
    memory_limit_MB may be null."""

    compile_timeout: float = Field(10, ge=0, allow_inf_nan=False, description="compile timeout (no compile step for python)")
    run_timeout: float = Field(10, gt=0, allow_inf_nan=False, description="code run timeout (wall seconds)")
    memory_limit_MB: Optional[int] = Field(-1, description="maximum memory allowed in megabytes (<= 0 or null: the "
                                           "server's cap; verl sends null when its memory_limit_mb is unset)")
    code: str = Field(..., description="the code to run")
    stdin: Optional[str] = Field(None, description="optional string to pass into stdin")
    language: Language = Field(..., description="the language or execution mode to run the code")
    files: dict[str, Optional[str]] = Field({}, description="file path -> base64 content (not supported: must be empty)")
    fetch_files: list[str] = Field([], description="files to fetch after the run (not supported: must be empty)")


def _response(status: str, message: str = "", run_result: dict | None = None) -> dict:
    """SandboxFusion's RunCodeResponse; status is a RunStatus: Success, Failed or SandboxError."""
    return {"status": status, "message": message, "compile_result": None, "run_result": run_result,
            "executor_pod_name": None, "files": {}}


def command_result(r: SandboxResult) -> dict:
    """SandboxFusion's CommandRunResult of one run; status is a CommandRunStatus."""
    timed_out = r.killed_reason in TIMEOUT_KILLS
    return {"status": "TimeLimitExceeded" if timed_out else "Finished", "execution_time": r.duration_s,
            "return_code": None if timed_out else r.exit_code, "stdout": r.stdout, "stderr": r.stderr}


def run_code_response(r: SandboxResult) -> dict:
    run = command_result(r)
    ok = run["status"] == "Finished" and run["return_code"] == 0 and r.killed_reason is None
    return _response("Success" if ok else "Failed", f"killed: {r.killed_reason}" if r.killed_reason else "", run)


def run_limits(req: RunCodeRequest, caps: SandboxSettings) -> SandboxSettings:
    """The server's sandbox settings, tightened by the request's run_timeout and memory_limit_MB (never loosened)."""
    wall = min(caps.wall_timeout_seconds, req.run_timeout)
    asked = req.memory_limit_MB or 0
    memory = caps.memory_mb if asked <= 0 else min(caps.memory_mb, max(MIN_MEMORY_MB, asked))
    cpu = min(caps.cpu_seconds, max(1, math.ceil(wall)))
    return caps.model_copy(update={"wall_timeout_seconds": wall, "memory_mb": memory, "cpu_seconds": cpu})


def check_bind(host: str, token: str | None) -> None:
    if not is_loopback(host) and not token:
        raise ServiceConfigError(
            f"refusing to serve the sandbox on {host} without an access token: set the environment variable named by "
            "sandbox.service.token_env (default EVOLFORGE_SANDBOX_TOKEN); clients then call http://HOST:PORT/t/TOKEN/"
            "run_code or send `Authorization: Bearer TOKEN`. Loopback (127.0.0.1) needs none.")


class ServiceState:
    def __init__(self, sandbox: SandboxSettings, token: str | None):
        self.sandbox = sandbox
        self.token = token
        cfg = sandbox.service
        self.slots = asyncio.Semaphore(cfg.max_concurrency)
        self.pool = ThreadPoolExecutor(max_workers=cfg.max_concurrency, thread_name_prefix="sandbox-service")


def _detail(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def _validation_error(errors: list[dict]) -> JSONResponse:
    """FastAPI's 422 body: the input is echoed only when it is short (never a whole program back)."""
    out = []
    for e in errors:
        item = {"type": e["type"], "loc": ["body", *e.get("loc", ())], "msg": e["msg"]}
        given = e.get("input")
        if isinstance(given, (str, int, bool)) or (isinstance(given, float) and math.isfinite(given)):
            if len(str(given)) <= 200:
                item["input"] = given
        if e.get("ctx"):
            item["ctx"] = {k: str(v) for k, v in e["ctx"].items()}
        out.append(item)
    return JSONResponse({"detail": out}, status_code=422)


def _door(state: ServiceState, request: Request) -> JSONResponse | None:
    """A 403 for a request from a web page or to a name that is not this machine (request_guard), else None."""
    cfg = state.sandbox.service
    local = (cfg.host, (request.scope.get("server") or ("",))[0])
    headers = {k.lower(): v for k, v in request.headers.items()}
    refusal = door_refusal(headers, local, cfg.allowed_hosts, cfg.allowed_origins, "sandbox.service")
    return _detail(refusal[0], refusal[1]) if refusal else None


def _authorized(state: ServiceState, request: Request) -> bool:
    return token_accepted(state.token, request.path_params.get("token"), request.headers.get("authorization", ""))


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None once it is over `limit` bytes (stops reading there)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_request(raw: bytes) -> RunCodeRequest | JSONResponse:
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        return _validation_error([{"type": "json_invalid", "loc": (getattr(e, "pos", 0),), "msg": "JSON decode error",
                                   "ctx": {"error": str(e)[:200] or type(e).__name__}}])
    try:
        return RunCodeRequest.model_validate(data)
    except ValidationError as e:
        return _validation_error(e.errors(include_url=False))


async def run_code(request: Request) -> JSONResponse:
    state: ServiceState = request.app.state.sandbox
    cfg = state.sandbox.service
    refused = _door(state, request)
    if refused:
        return refused
    if not _authorized(state, request):
        return _detail(401, "missing or wrong sandbox access token (path /t/TOKEN/run_code or Authorization: Bearer)")
    ctype = request.headers.get("content-type")
    refusal = json_body_refusal(ctype, False)
    if refusal:
        return _detail(refusal[0], refusal[1])
    raw = await _read_body(request, cfg.max_body_bytes)
    if raw is None:
        return _detail(413, f"request body over sandbox.service.max_body_bytes ({cfg.max_body_bytes} bytes)")
    refusal = json_body_refusal(ctype, bool(raw))
    if refusal:
        return _detail(refusal[0], refusal[1])
    req = parse_request(raw)
    if isinstance(req, JSONResponse):
        return req
    if req.language not in SUPPORTED_LANGUAGES:
        return JSONResponse(_response("SandboxError", f"language {req.language!r} is not supported by this sandbox "
                                      f"(evolforge sandbox-serve runs {', '.join(SUPPORTED_LANGUAGES)} only)"))
    if req.files or req.fetch_files:
        return JSONResponse(_response("SandboxError", "`files` and `fetch_files` are not supported by this sandbox "
                                      "(evolforge sandbox-serve): send them empty"))
    try:
        await asyncio.wait_for(state.slots.acquire(), cfg.queue_timeout_seconds)
    except asyncio.TimeoutError:
        return _detail(504, f"all {cfg.max_concurrency} sandbox slots stayed busy for {cfg.queue_timeout_seconds} s")
    try:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(state.pool, run_program, req.code, req.stdin,
                                            run_limits(req, state.sandbox), req.language)
    except Exception as e:  # noqa: BLE001 - a sandbox-side failure is an answer, never a dead server
        return JSONResponse(_response("SandboxError", f"sandbox failure: {type(e).__name__}: {e}"[:2000]))
    finally:
        state.slots.release()
    return JSONResponse(run_code_response(result))


async def ping(request: Request) -> JSONResponse:
    refused = _door(request.app.state.sandbox, request)
    if refused:
        return refused
    if not _authorized(request.app.state.sandbox, request):
        return _detail(401, "missing or wrong sandbox access token")
    return JSONResponse("pong")


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return _detail(exc.status_code, exc.detail)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    return _detail(500, f"internal error: {type(exc).__name__}")  # SandboxFusion's form, without the traceback


def build_app(state: ServiceState) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        state.pool.shutdown(wait=False, cancel_futures=True)

    routes = [Route("/run_code", run_code, methods=["POST"]), Route("/t/{token}/run_code", run_code, methods=["POST"]),
              Route("/v1/ping", ping, methods=["GET"]), Route("/t/{token}/v1/ping", ping, methods=["GET"])]
    middleware = []
    if state.sandbox.service.allowed_origins:  # only the configured pages get CORS answers (preflights included)
        from starlette.middleware import Middleware
        from starlette.middleware.cors import CORSMiddleware

        middleware.append(Middleware(CORSMiddleware, **cors_settings(state.sandbox.service.allowed_origins)))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: _http_error, Exception: _internal_error})
    app.state.sandbox = state
    return app


def make_state(sandbox: SandboxSettings, host: str) -> ServiceState:
    """Check the bind address and the sandbox itself (SandboxUnavailable names the fix) before serving."""
    token = os.environ.get(sandbox.service.token_env) or None
    check_bind(host, token)
    check_sandbox_available(sandbox)
    return ServiceState(sandbox, token)


def serve(sandbox: SandboxSettings, state: ServiceState | None = None) -> None:
    """Serve on sandbox.service.host:port until interrupted (`state`: from make_state, else made here); the server
    plumbing is the project's one (tasks/core/serving.py)."""
    cfg = sandbox.service
    serving.serve(serving.server(build_app(state or make_state(sandbox, cfg.host)), cfg.host, cfg.port))


@contextlib.contextmanager
def running_service(sandbox: SandboxSettings, port: int | None = None) -> Iterator[str]:
    """The service on loopback in a background thread; yields its run_code URL (http://127.0.0.1:PORT/run_code)."""
    port = port or serving.free_port()
    srv = serving.server(build_app(make_state(sandbox, "127.0.0.1")), "127.0.0.1", port)
    with serving.in_thread(srv, "evolforge-sandbox-service", "the sandbox service"):
        yield f"http://127.0.0.1:{port}/run_code"
