"""`evolforge retry --out DIR [--base-url URL]`: re-run only the failed or rejected batches of the run at --out,
with the run's own seeds and settings: the flow of the stage that made the folder, with `retry=true`.

A stage is retried this way when its parameters have a `retry` field (the evolve stage's: tasks/evolve/stage.py;
its flow reopens the failed batches, rolls the run's dedup index entries for the reopened round back, then
resumes); the folder's stage.json names the stage (a folder from before the markers: the first such stage).
The stage's check runs first, before a Prefect server starts: it reads the run's own record and settings and
checks their endpoint (a missing run or a down endpoint is one line, exit 2). What the command prints is the
stage's `present` (what was reopened, then what the stage's own command prints).

`evolforge run` itself is a stage command, its flags built from the stage's parameters (cli/stages.py).
"""

from __future__ import annotations

from evolforge.cli.common import run_stage


def retry_stage(out: str):
    """The registered stage that made the folder at `out` (its stage.json), among those with a `retry` parameter."""
    from evolforge.storage.folder import read_marker
    from evolforge.tasks.core.checks import InputError
    from evolforge.tasks.core.stages import stages

    retryable = [s for s in stages() if "retry" in s.params.model_fields]
    kind = (read_marker(out) or {}).get("kind")
    if kind is None:
        return retryable[0]
    found = next((s for s in retryable if s.name == kind), None)
    if found is None:
        raise InputError(f"{out} holds the output of the {kind} stage, which has no retry: run its command again "
                         "over the same folder to resume it")
    return found


def cmd_retry(args) -> int:
    stage = retry_stage(args.out)
    extra = {"base_url": args.base_url} if args.base_url else {}
    params = stage.params(**{stage.out_field: args.out, "retry": True}, **extra)
    stage.check(params, params.settings())  # a retry's check reads the run's own settings (before Prefect starts)
    return run_stage(stage, params)


def register(sub) -> None:
    p = sub.add_parser("retry", help="re-run only the failed or rejected batches of the run at --out")
    p.add_argument("--out", required=True)
    p.add_argument("--base-url", help="endpoint to use this time (default: the run's own)")
    p.set_defaults(fn=cmd_retry, fast_exit=True)
