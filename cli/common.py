"""What every command shares: the settings merge, the endpoint flags, running a flow with one clear error."""

from __future__ import annotations

import json
import os
import sys


def add_endpoint_args(p) -> None:
    """--config, --base-url and --model, as every stage command takes them."""
    p.add_argument("--config", help="TOML config file (default: config/default.toml)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint (default: the embedded model)")
    p.add_argument("--model", help="model for every stage without its own model in the config")


def prefect_defaults() -> None:
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def settings_or_exit(args, extra: dict | None = None):
    """Settings from --config, --base-url, --model and `extra`, merged as every flow merges them."""
    from evolforge.config.settings import ConfigError
    from evolforge.flows._params import EndpointParams

    try:
        return EndpointParams(config=getattr(args, "config", None), base_url=getattr(args, "base_url", None) or None,
                              model=getattr(args, "model", None), overrides=extra or {}).settings()
    except ConfigError as e:
        print(f"evolforge: {e}", file=sys.stderr)
        sys.exit(2)


def run_flow(fn, params) -> int:
    prefect_defaults()
    try:
        result = fn(params)
    except Exception as e:  # one clear line
        print(f"\nevolforge: {fn.name} failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, default=str)[:6000])
    return 0
