"""The `evolforge` command line.

    evolforge run --seeds PATH --out DIR [--rounds N] [--base-url URL] [--model NAME] [--config FILE]
                  [--force-settings]
    evolforge serve-model [--port N]          # the embedded model in the foreground
    evolforge preflight [--base-url URL]      # one minimal request per configured model
    evolforge costs --out DIR [--by stage]    # totals from the cost ledger
    evolforge status --out DIR                # batches done / failed / pending, records, calls, cost
    evolforge compare base=E1 sft=E2 rl=E3    # A/B of eval runs: pass@1 and paired changes in points
    (and one command per stage: synthesize, dedup, modules, trajectories, reward-data, train-reward, ppo, pipeline)

The API key comes from EVOLFORGE_API_KEY, falling back to OPENAI_API_KEY.
Running `run` again over the same --out resumes it, with the run's own seed file and result-changing
settings (a change is an error naming it; --force-settings accepts it, or use a new --out).
Inputs are checked before anything starts: a user error is one line and exit status 2 (--debug: traceback).
Output into a closed pipe (`evolforge costs --out DIR | head`) ends the command quietly with exit status 141.
"""

from __future__ import annotations

import argparse

from evolforge.cli import costs, prefect_server, publish, run, sandbox, services, stages, status
from evolforge.cli.common import run_command

# Each command module registers its sub-commands. `stages` adds one command per registered stage
# (tasks/core/stages.py); a new stage needs no line here.
COMMANDS = (stages, run, services, costs, sandbox, status, publish, prefect_server)


class _FirstWins:
    """A sub-parser collection on which a command already added by an earlier module is not added again."""

    def __init__(self, sub):
        self._sub = sub
        self.choices = sub.choices

    def add_parser(self, name, **kw):
        if name in self._sub.choices:
            import argparse

            return argparse.ArgumentParser(add_help=False)  # a throwaway: the first module's command stays
        return self._sub.add_parser(name, **kw)


PIPE_CLOSED = 141  # 128 + SIGPIPE: what a Unix tool killed by a closed pipe exits with


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); a closed stdout pipe ends it quietly (the Python docs'
    recipe: stdout pointed at devnull, so the interpreter's last flush does not complain either)."""
    import sys

    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        import os

        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return PIPE_CLOSED


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="evolforge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    first_wins = _FirstWins(sub)
    for module in COMMANDS:
        module.register(first_wins)
    ap.add_argument("--verbose", action="store_true", help="show every log line, warning and library report on the "
                    "terminal (by default they go to the run's log file, OUT/evolforge.log)")
    for p in sub.choices.values():  # `evolforge CMD ... --debug` works too
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of an error")
        p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="show every log line on the terminal (default: the run's log file)")
    args = ap.parse_args(argv)
    if args.cmd is None:  # `evolforge` alone: the commands, one a line
        print(command_list(sub))
        return 2
    return run_command(args)  # a user error: one line on stderr, exit status 2


def command_list(sub) -> str:
    """What `evolforge` alone prints: every command with its one-line help."""
    helps = {a.dest: (a.help or "").replace("%%", "%") for a in sub._choices_actions}
    width = max(map(len, sub.choices))
    return "\n".join(["usage: evolforge COMMAND [--help] ...", "", "commands:"]
                     + [f"  {name:<{width}}  {helps.get(name, '')}" for name in sub.choices]
                     + ["", "evolforge COMMAND --help shows a command's flags; --debug shows the traceback of an error"])
