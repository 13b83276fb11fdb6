"""`evolforge retry --out DIR [--base-url URL] [--dedup-index DIR]`: re-run only the failed or rejected batches of
the run at --out, with the run's own seeds and result-changing settings: the flow of the stage that made the
folder, with `retry=true`. The endpoint (and so where the API key goes), the key's transport and the dedup index
come from the user's config, environment and these flags (the stage's `retry_params`: --config, --base-url,
--dedup-index for the evolve stage), never from the folder: where the folder's record names others, the command
stops with one line naming both (exit 2), before any request or write.

A stage is retried this way when its parameters have a `retry` field (the evolve stage's: tasks/evolve/stage.py;
its flow reopens the failed batches, rolls the run's dedup index entries for the reopened round back, then
resumes); the folder's stage.json names the stage (a folder from before the markers: the first such stage).
The stage's check runs first, before a Prefect server starts: it reads the run's own record and settings and
checks their endpoint (a missing run or a down endpoint is one line, exit 2). What the command prints is the
stage's `present` (what was reopened, then what the stage's own command prints).

`evolforge run` itself is a stage command, its flags built from the stage's parameters (cli/stages.py).
"""

from __future__ import annotations

from evolforge.cli.common import add_wait_arg, run_stage


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


def retry_flags(stage) -> tuple[str, ...]:
    """The parameters a retry of `stage` takes from the command line (its Params' `retry_params`: the user's
    config file, endpoint, ...; the rest comes from the run's record)."""
    return tuple(getattr(stage.params, "retry_params", ()))


def cmd_retry(args) -> int:
    stage = retry_stage(args.out)
    extra = {name: getattr(args, name) for name in retry_flags(stage) if getattr(args, name, None) is not None}
    params = stage.params(**{stage.out_field: args.out, "retry": True}, **extra)
    from evolforge.tasks.core.extras import check_stage

    settings = params.settings()
    check_stage(stage, params, settings)  # its optional extras installed: else one line, exit 2
    stage.check(params, settings)  # a retry's check reads the run's record (before Prefect starts)
    return run_stage(stage, params, args.wait)


def register(sub) -> None:
    from evolforge.tasks.core.stages import stages

    p = sub.add_parser("retry", help="re-run only the failed or rejected batches of the run at --out")
    p.add_argument("--out", required=True)
    add_wait_arg(p)
    seen: set[str] = set()
    for stage in stages():
        for name in retry_flags(stage):
            if name not in seen:
                seen.add(name)
                p.add_argument("--" + name.replace("_", "-"), dest=name,
                               help=stage.params.model_fields[name].description)
    p.set_defaults(fn=cmd_retry, fast_exit=True)
