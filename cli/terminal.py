"""What a stage command shows while its flow runs: progress, the flow run's link and, at the end, a short summary
and one line per error. Everything else (Prefect's INFO lines, per-batch lines, library load reports, tqdm bars,
warnings, the traceback of a failed task) goes to the run's log file, OUT/evolforge.log (`--verbose` shows it all
on the terminal as before).

The log file is written once the run's output folder has its stage.json marker (a run whose pre-flight fails
leaves no folder: its log goes to PREFECT_HOME/evolforge-last.log instead); what came before is kept in memory
and written first. The Prefect UI keeps every log line of the run too.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator

LOG_NAME = "evolforge.log"
SHOWN = ("View at ", "gateway: ")  # lines that stay on the terminal: the flow run's link in the UI, the calls in flight
_CHECK_EVERY = 0.5  # seconds between looks for the output folder's marker


class RunLog(io.TextIOBase):
    """A text stream into OUT/evolforge.log, held in memory until OUT/stage.json exists (see the module)."""

    def __init__(self, out: str | None):
        self.out = Path(out).expanduser().absolute() if out and "://" not in str(out) else None
        self.path: Path | None = None
        self._fh = None
        self._buffer: list[str] = []
        self._closed = False
        self._last_look = 0.0
        self._lock = threading.Lock()

    def _open(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")
        self.path = path
        self._fh.write("".join(self._buffer))
        self._buffer = []

    def _look(self) -> None:
        now = time.monotonic()
        if self._fh is None and self.out is not None and now - self._last_look >= _CHECK_EVERY:
            self._last_look = now
            if (self.out / "stage.json").exists():
                self._open(self.out / LOG_NAME)

    def write(self, text: str) -> int:
        with self._lock:
            if self._closed:
                return len(text)  # a handler that outlived the run (a library's, bound to this stream): dropped
            self._look()
            if self._fh is not None:
                self._fh.write(text)
            else:
                self._buffer.append(text)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.flush()

    def isatty(self) -> bool:
        return False

    def finish(self) -> Path | None:
        """Write what is held (to the folder's log, else PREFECT_HOME/evolforge-last.log) and stop; its path."""
        with self._lock:
            self._last_look = 0.0
            self._look()
            if self._fh is None and self._buffer:
                from evolforge.cli.prefect_server import prefect_home

                last = prefect_home() / "evolforge-last.log"
                with contextlib.suppress(OSError):
                    last.unlink()
                self._open(last)
            if self._fh is not None:
                self._fh.close()
            self._closed = True
            return self.path


class _OnlyShown(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return str(record.msg).startswith(SHOWN)


def _loggers() -> list[logging.Logger]:
    return [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                   if isinstance(lg, logging.Logger))]


@contextlib.contextmanager
def quiet_terminal(out: str | None, verbose: bool = False) -> Iterator[RunLog | None]:
    """While the block runs, the terminal gets only progress, the flow run's link and what the command prints
    itself after the block; the rest goes to the run's log (see the module docstring). `verbose`: no change."""
    if verbose:
        yield None
        return
    import prefect.main  # noqa: F401 - Prefect configures its logging (its console on this terminal) first

    log = RunLog(out)
    file_handler = logging.StreamHandler(log)
    file_handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"))
    only_shown = _OnlyShown()
    terminal = (sys.__stderr__, sys.__stdout__)
    consoles, swapped, file_on = [], [], []
    for lg in _loggers():
        if lg is logging.getLogger() or not lg.propagate:
            lg.addHandler(file_handler)
            file_on.append(lg)
        for h in lg.handlers:
            if h is file_handler:
                continue
            if type(h).__name__ == "PrefectConsoleHandler":
                if only_shown not in h.filters:
                    h.addFilter(only_shown)
                    consoles.append(h)
            elif isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) in terminal:
                swapped.append((h, h.setStream(log)))  # a library's own handler (transformers): into the log
    old_stderr, old_showwarning = sys.stderr, warnings.showwarning
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: log.write(
        warnings.formatwarning(message, category, filename, lineno, line))
    sys.stderr = log  # tqdm bars, prints to stderr, handlers created while the run goes on
    os.environ.setdefault("TQDM_MININTERVAL", "5")
    try:
        yield log
    finally:
        sys.stderr, warnings.showwarning = old_stderr, old_showwarning
        for h in consoles:
            h.removeFilter(only_shown)
        for h, stream in swapped:
            if stream is not None:
                h.setStream(stream)
        for lg in file_on:
            lg.removeHandler(file_handler)
        log.finish()
