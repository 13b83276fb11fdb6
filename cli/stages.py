"""One command per registered stage (tasks/core/stages.py), its flags built from the stage's parameter model.

    evolforge <stage> --flag ...     e.g. evolforge synthesize --seeds X --out Y

Each command builds the stage's parameters from its flags (cli/stage_args.py), loads the settings they name,
runs the stage's input check (files, output folder, endpoint and key) before any Prefect server starts, then
runs the stage's flow with live progress (cli/progress.py) and prints its result (the stage's own `present`,
else the summary as JSON). Running again over the same --out resumes, and `evolforge status --out DIR` shows
what is done. A command's --help ends with the stage's own config section (Stage.section), when it has one.
"""

from __future__ import annotations

import sys

from evolforge.cli.common import add_wait_arg, run_stage
from evolforge.cli.stage_args import add_param_flags, params_from_args
from evolforge.tasks.core.extras import check_stage
from evolforge.tasks.core.stages import get, stages


def cmd_stage(args) -> int:
    from evolforge.config.settings import ConfigError

    stage = get(args.stage)
    params = params_from_args(stage, args)
    try:
        settings = params.settings()
    except ConfigError as e:
        print(f"evolforge: {e}", file=sys.stderr)
        return 2
    check_stage(stage, params, settings)  # its optional extras installed (pyproject.toml): else one line, exit 2
    if stage.check is not None:
        stage.check(params, settings)  # before any Prefect server starts: a user error is one line, exit 2
    return run_stage(stage, params, getattr(args, "wait", 0.0))


def register(sub) -> None:
    import importlib

    for stage in stages():
        p = sub.add_parser(stage.cli_name, help=stage.help, description=stage.help,
                           epilog=f"Its settings: the [{stage.section}] section of the config file (--config)."
                           if stage.section else None)
        add_param_flags(p, stage)
        if stage.out_field:
            add_wait_arg(p)
        p.set_defaults(fn=cmd_stage, stage=stage.name, fast_exit=stage.fast_exit)
    for stage in stages():  # a stage's further commands (Stage.commands), after every stage's own
        for ref in stage.commands:
            module, _, attr = ref.partition(":")
            getattr(importlib.import_module(module), attr)(sub)
