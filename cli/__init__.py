"""The `evolforge` command line.

    evolforge run --seeds PATH --out DIR [--rounds N] [--base-url URL] [--model NAME] [--config FILE]
                  [--force-settings]
    evolforge serve-model [--port N]          # the embedded model in the foreground
    evolforge preflight [--base-url URL]      # one minimal request per configured model
    evolforge costs --out DIR [--by stage]    # totals from the cost ledger

The API key comes from EVOLFORGE_API_KEY, falling back to OPENAI_API_KEY.
Running `run` again over the same --out resumes it, with the run's own seed file and result-changing
settings (a change is an error naming it; --force-settings accepts it, or use a new --out).
"""

from __future__ import annotations

import argparse

from evolforge.cli import costs, publish, run, sandbox, services, stages

# Each command module registers its sub-commands; a new stage adds its module here.
COMMANDS = (run, stages, services, costs, sandbox, publish)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="evolforge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for module in COMMANDS:
        module.register(sub)
    args = ap.parse_args(argv)
    return args.fn(args)
