"""Stopping a run on a signal: the first SIGINT (Ctrl-C) or SIGTERM stops it within seconds, a second one at once.

    stop_on_signals(grace)     while the block runs (main thread only), SIGINT and SIGTERM stop the run: the first
                               one calls `request_stop`; a second one exits at once (`hard_exit`). A SIGINT that
                               the process inherited as ignored (a background job of a non-interactive shell)
                               stays ignored, as in every Unix program.
    request_stop(signum)       no new model call is sent (`check` raises `RunStopped` in every worker that is about
                               to send one), the calls in flight are cancelled (the gateways' `abort` callbacks
                               shut their connections down: the gateway writes each cancelled call's ledger row),
                               and a watchdog ends the process after `grace` seconds with 128 + signum (130 for
                               SIGINT, 143 for SIGTERM) if the run has not unwound by then.
    hard_exit(code)            flush what was written (ledgers, journals: the `on_exit` callbacks), then end the
                               process without waiting for threads stuck in a call.

A finished call is in its batch's journal (replayed on resume, never sent again) and in the ledger; a call cut
off in flight is in the ledger as `cancelled` (the endpoint may bill it). Prefect-free, stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Iterator

NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}
GRACE_SECONDS = 4.0  # from the first signal to the forced exit, when the run has not ended by then

_STOP = threading.Event()
_state: dict = {"signum": None, "grace": GRACE_SECONDS, "depth": 0}
_lock = threading.Lock()
_abort: list[Callable[[], None]] = []  # cancel the calls in flight (one per live gateway)
_flush: list[Callable[[], None]] = []  # make what was written durable (ledgers, journals)


class RunStopped(BaseException):
    """The run was stopped by a signal (not an error of the run: a batch stopped by it stays pending).
    A BaseException, like KeyboardInterrupt, so that no `except Exception` of a stage swallows it."""

    def __init__(self, signum: int | None = None):
        self.signum = signum if signum is not None else _state["signum"] or signal.SIGINT
        super().__init__(f"stopped by {NAMES.get(self.signum, f'signal {self.signum}')}")

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)


def requested() -> int | None:
    """The signal that stopped the run, or None while it goes on."""
    return _state["signum"] if _STOP.is_set() else None


def check() -> None:
    """Raise RunStopped when the run is stopping (before a model call or a record's work starts)."""
    if _STOP.is_set():
        raise RunStopped()


def sleep(seconds: float) -> None:
    """time.sleep that ends (with RunStopped) as soon as the run is stopping."""
    if _STOP.wait(max(0.0, seconds)):
        raise RunStopped()


def on_abort(fn: Callable[[], None]) -> Callable[[], None]:
    """Register a callback that cancels calls in flight; returns a function that unregisters it."""
    with _lock:
        _abort.append(fn)
    return lambda: _remove(_abort, fn)


def on_exit(fn: Callable[[], None]) -> Callable[[], None]:
    """Register a flush run before a forced exit; returns a function that unregisters it."""
    with _lock:
        _flush.append(fn)
    return lambda: _remove(_flush, fn)


def _remove(registry: list, fn) -> None:
    with _lock, contextlib.suppress(ValueError):
        registry.remove(fn)


def reset() -> None:
    """Forget an earlier stop (a new command in the same process)."""
    _STOP.clear()
    _state["signum"] = None


def request_stop(signum: int = signal.SIGINT, grace: float | None = None) -> None:
    """Stop the run (see the module docstring); `grace` None: no watchdog (a stop requested in-process)."""
    with _lock:
        if _STOP.is_set():
            return
        _state["signum"] = signum
        _STOP.set()
        aborts = list(_abort)
    for fn in aborts:
        with contextlib.suppress(Exception):
            fn()
    if grace is not None:
        threading.Thread(target=_watchdog, args=(128 + signum, grace), name="evolforge-stop", daemon=True).start()


def _watchdog(code: int, grace: float) -> None:
    threading.Event().wait(grace)
    _say(f"evolforge: the run did not stop within {grace:g} s; exiting now")
    hard_exit(code)


def flush_all() -> None:
    with _lock:
        flushes = list(_flush)
    for fn in flushes:
        with contextlib.suppress(Exception):
            fn()


def _children(pid: int) -> list[int]:
    """The process's descendants (Linux /proc; empty elsewhere), children first."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids = [int(k) for k in fh.read().split()]
        except (OSError, ValueError):
            continue
        for kid in kids:
            found += [kid, *_children(kid)]
    return found


def _end_children(wait: float = 1.0) -> None:
    """SIGTERM the processes this one started (a local Prefect server, the embedded model's server), then
    SIGKILL what is left after `wait` s: a forced exit leaves none behind."""
    import time

    kids = _children(os.getpid())
    for kid in kids:
        with contextlib.suppress(OSError):
            os.kill(kid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while kids and time.monotonic() < deadline:
        kids = [k for k in kids if _alive(k)]
        time.sleep(0.05)
    for kid in kids:
        with contextlib.suppress(OSError):
            os.kill(kid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return False


def hard_exit(code: int) -> None:
    """Flush what was written, end the processes this one started, then end the process at once (threads
    stuck in a call are not waited for)."""
    flush_all()
    with contextlib.suppress(Exception):
        _end_children()
    for stream in (sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _say(line: str) -> None:
    with contextlib.suppress(Exception):
        sys.__stderr__.write(line + "\n")
        sys.__stderr__.flush()


def _handler(signum, frame) -> None:
    if _STOP.is_set():  # the second signal: at once
        _say(f"evolforge: {NAMES.get(signum, signum)} again: exiting now")
        hard_exit(128 + signum)
    again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
    _say(f"\nevolforge: stopping ({NAMES.get(signum, signum)}): no new calls, cancelling the calls in flight, "
         f"keeping what finished; {again} again exits at once")
    request_stop(signum, _state["grace"])


@contextlib.contextmanager
def stop_on_signals(grace: float | None = GRACE_SECONDS) -> Iterator[None]:
    """SIGINT and SIGTERM stop the run while the block runs (see the module docstring); a no-op outside the main
    thread. `grace` None: no watchdog (a command run in-process, by a test or Python: it returns 130 / 143 once
    the run unwound). Re-entrant: an inner block (a flow, over Prefect's own SIGTERM handler) installs the same
    handler and keeps the outer block's grace."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _state["depth"] == 0:
        _state["grace"] = grace
    _state["depth"] += 1
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        current = signal.getsignal(signum)
        if signum == signal.SIGINT and current is signal.SIG_IGN:
            continue  # inherited as ignored (a background job): it stays so
        previous[signum] = signal.signal(signum, _handler)
    try:
        yield
    finally:
        _state["depth"] -= 1
        for signum, handler in previous.items():
            with contextlib.suppress(Exception):
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
