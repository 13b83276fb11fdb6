"""The sandbox as a service: `evolforge sandbox-serve`, SandboxFusion's HTTP API for verl's code reward."""

from __future__ import annotations

import sys

from evolforge.cli.common import port_in_use, settings_or_exit


def cmd_sandbox_serve(args) -> int:
    """Serve tasks/sandbox behind SandboxFusion's `POST /run_code` (foreground, until interrupted)."""
    from evolforge.tasks.sandbox.run import SandboxUnavailable
    from evolforge.tasks.sandbox.service import ServiceConfigError, make_state, serve

    service = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = settings_or_exit(args, {"sandbox": {"service": service}})
    sandbox = settings.sandbox
    cfg = sandbox.service
    try:
        state = make_state(sandbox, cfg.host)  # refuse early, with the fix, before printing a URL
    except (ServiceConfigError, SandboxUnavailable) as e:
        print(f"evolforge: {e}", file=sys.stderr)
        return 2
    if busy := port_in_use(cfg.host, cfg.port):
        print(f"evolforge sandbox-serve: {busy}", file=sys.stderr)  # before the banner: nothing listens
        return 2
    where = f"http://{cfg.host}:{cfg.port}" + (f"/t/${cfg.token_env}" if state.token else "")
    print(f"sandbox service (SandboxFusion API, python only) on {where}/run_code  mode={sandbox.mode} "
          f"max_concurrency={cfg.max_concurrency} caps: {sandbox.wall_timeout_seconds:g}s wall, "
          f"{sandbox.cpu_seconds}s cpu, {sandbox.memory_mb} MiB\n"
          f"  verl: reward.sandbox_fusion.url={where}/run_code  (verl 0.5-0.7: reward_model.sandbox_fusion.url)", flush=True)
    try:
        serve(sandbox, state)
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has stopped; nothing more to say
        pass
    return 0


def register(sub) -> None:
    p = sub.add_parser("sandbox-serve", help="serve the code sandbox behind SandboxFusion's HTTP API (verl's code reward)")
    p.add_argument("--host", help="bind address (default: sandbox.service.host, loopback; others need a token)")
    p.add_argument("--port", type=int, help="port (default: sandbox.service.port)")
    p.add_argument("--config", help="TOML config file (default: config/default.toml)")
    p.set_defaults(fn=cmd_sandbox_serve)
