"""Live progress in the terminal: one bar per round or stage while a command runs.

The numbers come from tasks/core/progress.py (published by flows/_fanout.py `run_batches` for batched stages,
by a StepProgress for the stages without batches: training steps, sessions), the same ones the Prefect progress
artifact shows. On a terminal: rich bars with records done / total, accepted, calls/s, tokens/s, cost so far and
ETA (steps done / total, their rate, the loss or reward and ETA for a stage without batches). When stdout is not
a terminal (a log file, CI, a pipe): plain lines with the same figures, one when a batch ends (at most 50 per
stage without batches) and at least every `every` seconds while batches run.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time

from evolforge.tasks.core.progress import accepted_text, cost_text, duration, listening, progress_line, rate_text

STEP_LINES = 50  # plain lines of a stage without batches (one per 2 % of its steps when it has many)


def _ticks(snap: dict) -> int:
    """What a new plain line waits for: a batch ending, or (no batches) the count passing the next 2 %."""
    if not snap.get("unit"):
        return snap["batches_done"] + snap["batches_failed"]
    done, total = snap["records_done"], snap["records_total"]
    return done if not total or total <= STEP_LINES else done * STEP_LINES // total


class PlainProgress:
    """Lines of text, throttled per round or stage."""

    def __init__(self, file=None, every: float = 10.0):
        self.file = file or sys.stdout
        self.every = every
        self._last: dict[str, tuple[float, int, int]] = {}

    def __call__(self, snap: dict) -> None:
        key = snap["what"]
        ended = _ticks(snap)
        last_t, last_ended, _ = self._last.get(key, (0.0, -1, 0))
        now = time.monotonic()
        if ended == last_ended and not snap["finished"] and now - last_t < self.every:
            return
        if snap["finished"] and self._last.get(key, (0, 0, 0))[2]:
            return  # the finished line was printed already
        self._last[key] = (now, ended, int(snap["finished"]))
        self.file.write(progress_line(snap) + "\n")  # not print(): a flow's log_prints would take it
        self.file.flush()

    def close(self) -> None:
        pass


class RichProgress:
    """One rich progress bar per round or stage."""

    def __init__(self, console=None):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.console = console or Console()
        self.bars = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=28),
            TextColumn("{task.fields[records]}"), TextColumn("{task.fields[accepted]}"),
            TextColumn("{task.fields[calls_per_s]}"), TextColumn("{task.fields[tokens_per_s]}"),
            TextColumn("{task.fields[cost]}"), TextColumn("{task.fields[eta]}"),
            console=self.console, refresh_per_second=4, transient=False)
        self.tasks: dict[str, int] = {}
        self.bars.start()
        self._rerouted = _route_log_consoles(sys.stderr)  # log lines above the bars, not glued to them

    def __call__(self, snap: dict) -> None:
        total = snap["records_total"]
        eta = ("done " + duration(snap["elapsed_s"])) if snap["finished"] else "ETA " + duration(snap["eta_s"])
        done_of = f"{snap['records_done']}/{'?' if total is None else total}"
        if snap.get("unit"):  # a stage without batches: its steps, their rate and the loss / reward
            fields = dict(records=f"{done_of} {snap['unit']}", accepted=rate_text(snap), calls_per_s=snap["detail"],
                          tokens_per_s="", cost="", eta=eta)
        else:
            fields = dict(records=f"{done_of} records", accepted=accepted_text(snap),
                          calls_per_s=f"{snap['calls_per_s']:.2f} calls/s",
                          tokens_per_s=f"{snap['tokens_per_s']:.0f} tok/s", cost=cost_text(snap), eta=eta)
        if snap["batches_failed"]:
            fields["records"] += f" ({snap['batches_failed']} batches failed)"
        key = snap["what"]
        if key not in self.tasks:
            self.tasks[key] = self.bars.add_task(key, total=total or None, **fields)
        self.bars.update(self.tasks[key], completed=snap["records_done"], total=total or None, **fields)

    def close(self) -> None:
        for console, file in self._rerouted:
            console.file = file
        self.bars.stop()


def _route_log_consoles(target) -> list[tuple]:
    """Point the rich consoles of logging handlers (Prefect's console handler keeps its own, bound to the
    stderr of its start) at `target`: while the bars are live, that is rich's proxy, which prints a log
    line above the bars instead of after them on their line. Returns (console, old file) to restore."""
    import logging

    from rich.console import Console

    if type(target).__name__ != "FileProxy":  # the bars do not redirect (not a terminal): nothing to do
        return []
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    rerouted = []
    for handler in {h for lg in loggers for h in lg.handlers}:
        console = getattr(handler, "console", None)
        if isinstance(console, Console) and console.file in (sys.__stderr__, sys.__stdout__):
            rerouted.append((console, console.file))
            console.file = _Forward(target)
    return rerouted


class _Forward(io.TextIOBase):
    """Writes to rich's proxy (a console unwraps the proxy itself and would write past the bars)."""

    def __init__(self, target):
        self.target = target

    def write(self, text: str) -> int:
        return self.target.write(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return True


@contextlib.contextmanager
def live_progress(terminal: bool | None = None, console=None, file=None):
    """Show the progress of every batched stage run inside the block; `terminal` None: rich bars when
    stdout is a terminal, plain lines otherwise."""
    if terminal is None:
        terminal = console is not None or sys.stdout.isatty()
    view = RichProgress(console) if terminal else PlainProgress(file)
    try:
        with listening(view):
            yield view
    finally:
        view.close()
