"""Long-running and set-up commands: deploy, serve-model, preflight, proxy."""

from __future__ import annotations

import os
import sys

from evolforge.cli.common import add_endpoint_args, port_in_use, settings_or_exit


def cmd_deploy(args) -> int:
    if args.write_yaml:
        from evolforge.deployments.deploy import write_yaml

        print(f"wrote {write_yaml()}")
        return 0
    settings = settings_or_exit(args)
    from evolforge.deployments.deploy import deploy

    return deploy(settings, pool=args.pool, schedule_active=False if args.no_schedule else None)


def cmd_serve_model(args) -> int:
    if args.build:
        from evolforge.tasks.core.llama_server import LlamaServerBuildError, build

        try:
            build(jobs=args.jobs, log=lambda m: print(m, flush=True))
        except LlamaServerBuildError as e:
            print(f"evolforge: could not build llama-server: {e}", file=sys.stderr)
            return 1
        return 0
    settings = settings_or_exit(args)
    from evolforge.tasks.core.embedded_model import EmbeddedModelError, server_command

    cfg = settings.embedded
    port = args.port or cfg.port or 8080
    try:
        cmd = server_command(cfg, port)
    except EmbeddedModelError as e:
        print(f"evolforge: {e}", file=sys.stderr)
        return 2
    from evolforge.tasks.core.llama_server import chosen_server

    print(f"serving {cfg.alias} ({chosen_server(cfg)}) on http://{cfg.host}:{port}/v1  "
          f"(use: EVOLFORGE__GATEWAY__BASE_URL=http://{cfg.host}:{port}/v1)", flush=True)
    os.execv(cmd[0], cmd)
    return 0  # pragma: no cover


def preflight(settings, base_url: str, embedded: bool) -> list[dict]:
    """One minimal completion per distinct model of every [models] role and of every model a registered stage
    calls beyond them (its descriptor's `models`: variant writers, the module graph's models and judge)."""
    from evolforge.tasks.core.gateway import Gateway, model_roles
    from evolforge.tasks.core.stages import stages

    gw = Gateway(settings.model_copy(update={"gateway": settings.gateway.model_copy(update={"max_retries": 0})}),
                 base_url=base_url, run_id="preflight",
                 embedded_models={settings.embedded.alias} if embedded else set())
    extra = tuple(dict.fromkeys(m for st in stages() if st.models for m in st.models(settings)))
    try:
        return gw.check_models(model_roles(), extra)
    finally:
        gw.close()


def cmd_preflight(args) -> int:
    settings = settings_or_exit(args)
    import contextlib

    if not settings.uses_embedded_model:  # the check `run` makes first (GET /models lists every model named)
        from evolforge.tasks.core.checks import check_endpoint

        check_endpoint(settings)  # a user error: one line, exit 2

    from evolforge.tasks.core.embedded_model import embedded_server
    from evolforge.tasks.core.gateway import InsecureKeyTransport, mask_secret, read_api_key

    ctx = embedded_server(settings.embedded) if settings.uses_embedded_model else contextlib.nullcontext(
        settings.gateway.base_url)
    with ctx as base_url:
        print(f"endpoint: {base_url}  key: {mask_secret(read_api_key())}")
        try:
            report = preflight(settings, base_url, settings.uses_embedded_model)
        except InsecureKeyTransport as e:
            print(f"evolforge: {e}", file=sys.stderr)
            return 2
    ok = True
    for r in report:
        if r["ok"]:
            print(f"  OK    {r['model']:<40} {r['latency_s']:.2f}s  stages={','.join(r['stages'])}")
        else:
            ok = False
            print(f"  FAIL  {r['model']:<40} stages={','.join(r['stages'])}\n        {r['error']}")
    return 0 if ok else 1


def cmd_proxy(args) -> int:
    """Serve the recording proxy (foreground, no Prefect needed), or --check it once."""
    import contextlib

    from evolforge.tasks.core.embedded_model import embedded_server
    from evolforge.tasks.core.keys import InsecureKeyTransport
    from evolforge.tasks.proxy.banner import banner
    from evolforge.tasks.proxy.server import check, check_settings, serve
    from evolforge.tasks.proxy.upstream import ProxyConfigError, redact_url

    proxy_overrides = {k: v for k, v in (("upstream", args.upstream), ("host", args.host), ("port", args.port),
                                         ("translate", args.translate)) if v is not None}
    settings = settings_or_exit(args, {"proxy": proxy_overrides})
    if settings.proxy.upstream and not args.check:
        try:  # a settings error is itself, whatever listens on the port
            check_settings(settings, settings.proxy.upstream)
        except (ProxyConfigError, InsecureKeyTransport) as e:
            print(f"evolforge: {e}", file=sys.stderr)
            return 2
    if not args.check and (busy := port_in_use(settings.proxy.host, settings.proxy.port)):
        print(f"evolforge proxy: {busy}", file=sys.stderr)  # before the banner: nothing listens
        return 2
    upstream = settings.proxy.upstream
    embedded = not upstream
    ctx = embedded_server(settings.embedded) if embedded else contextlib.nullcontext(upstream)
    try:
        with ctx as url:
            models = {settings.embedded.alias} if embedded else set()
            if args.check:
                model = args.model or (settings.embedded.alias if embedded else settings.models.default)
                res = check(settings, url, args.out, model, models)
                if res["ok"]:
                    price = (f"cost $0: {res['price_source']}" if res["cost_usd"] == 0 else
                             f"cost ${res['cost_usd']:.6f} ({res['price_source']})" if res["cost_usd"] is not None
                             else f"no price known for {res['model']!r} (add [pricing.overrides] to price it)")
                    print(f"OK  {res['latency_s']:.3f}s through the proxy to {redact_url(url)}; {price}")
                    return 0
                print(f"FAIL HTTP {res.get('status', '-')}: {res['error']}\n     fix: {res['fix']}", file=sys.stderr)
                return 1
            token_set = bool(os.environ.get(settings.proxy.token_env))
            print(banner(settings, redact_url(url), args.out, token_set, embedded), flush=True)
            serve(settings, url, args.out, models)
    except (ProxyConfigError, InsecureKeyTransport) as e:
        print(f"evolforge: {e}", file=sys.stderr)
        return 2
    return 0


def register(sub) -> None:
    p = sub.add_parser("deploy", help="deploy every flow to a Prefect process work pool (schedule from config)")
    p.add_argument("--config")
    p.add_argument("--pool", help="work pool name (default: schedule.work_pool)")
    p.add_argument("--no-schedule", action="store_true", help="deploy the nightly schedule switched off")
    p.add_argument("--write-yaml", action="store_true", help="regenerate deployments/prefect.yaml from the stage "
                   "registry (every stage's descriptor) and exit")
    p.set_defaults(fn=cmd_deploy)

    p = sub.add_parser("serve-model", help="serve the embedded model (foreground) for the UI and deployments")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--config")
    p.add_argument("--build", action="store_true", help="build llama.cpp's llama-server once per machine (from the "
                   "llama.cpp source of the pinned llama-cpp-python sdist, cached under ~/.cache/evolforge) and exit")
    p.add_argument("--jobs", type=int, default=0, help="compile jobs for --build (default: one per CPU)")
    p.set_defaults(fn=cmd_serve_model)

    p = sub.add_parser("preflight", help="send one minimal request per configured model")
    add_endpoint_args(p)
    p.set_defaults(fn=cmd_preflight)

    p = sub.add_parser("proxy", help="the recording proxy: an OpenAI-compatible endpoint that records agent traffic")
    p.add_argument("--upstream", help="model endpoint to forward to (default: proxy.upstream; empty: embedded model)")
    p.add_argument("--host", help="bind address (default: proxy.host, loopback)")
    p.add_argument("--port", type=int, help="port (default: proxy.port)")
    p.add_argument("--out", default="runs/proxy", help="folder the records, session events and ledger go to")
    p.add_argument("--check", action="store_true", help="send one call through the proxy to the upstream and exit")
    p.add_argument("--translate", help="which client APIs to translate to chat completions for a chat-only "
                   "upstream: off, messages (Claude Code), responses (Codex) or both (default: proxy.translate)")
    p.add_argument("--config")
    p.add_argument("--model", help="model for --check (default: models.default)")
    p.set_defaults(fn=cmd_proxy)
