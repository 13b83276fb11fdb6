"""Sandbox uids are the machine's, not a process's (tasks/sandbox/host.py take_uid / release_uid): a uid that another
process on the machine holds (another run, another test process) is never handed out, and a process that ends,
however it ends, holds none. Two test processes once drew the same uid, and one's end-of-check census killed the
other's solution ("the solution process ended before the tests were done")."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from evolforge.tasks.sandbox import host

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids are handed out only when running as root")

BASE, SPAN = 2_900_000_000, 8  # a span of its own, far from the default uid_base

HOLDER = f"""
import sys, time
from evolforge.tasks.sandbox.host import take_uid
held = [take_uid({BASE}, {SPAN}) for _ in range({SPAN})]
print(' '.join(map(str, sorted(held))), flush=True)
time.sleep(float(sys.argv[1]))
"""


def _holder(seconds: float) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(seconds)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip(), f"the holder took no uids (exit {proc.poll()})"
    return proc, [int(x) for x in line.split()]


def test_a_uid_another_process_holds_is_never_handed_out():
    proc, held = _holder(60)
    try:
        assert held == list(range(BASE, BASE + SPAN))
        with pytest.raises(RuntimeError, match="no free sandbox uid"):
            host.take_uid(BASE, SPAN)  # every uid of the span is the other process's
    finally:
        proc.kill()
        proc.wait()


def test_the_uids_of_a_killed_process_are_free_again_and_release_frees_one():
    proc, _ = _holder(60)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while True:  # the kernel drops a dead process's locks at once; allow for its exit to be reaped
        try:
            uid = host.take_uid(BASE, SPAN)
            break
        except RuntimeError:
            assert time.monotonic() < deadline, "a killed process's uids stayed taken"
            time.sleep(0.05)
    others = [host.take_uid(BASE, SPAN) for _ in range(SPAN - 1)]
    try:
        assert sorted([uid, *others]) == list(range(BASE, BASE + SPAN))
        with pytest.raises(RuntimeError):
            host.take_uid(BASE, SPAN)
        host.release_uid(uid)
        proc2 = subprocess.run([sys.executable, "-c", f"from evolforge.tasks.sandbox.host import take_uid; "
                                f"print(take_uid({BASE}, {SPAN}))"], capture_output=True, text=True, timeout=60)
        assert proc2.stdout.strip() == str(uid), proc2.stderr[-2000:]  # the one released uid, in another process
    finally:
        for u in [uid, *others]:
            host.release_uid(u)
