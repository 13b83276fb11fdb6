"""Where the test suite's time goes, and the quick tier's per-test budget: a pytest plugin (tests/conftest.py loads
it; `-p evolforge.testing.durations` loads it into any pytest run).

Every test is measured from the start of its setup to the end of its teardown, in wall seconds and in CPU seconds
of the test process's whole process tree: the process itself (all threads), the child processes it has reaped,
and its live descendants (a Prefect server, a llama-server, a sandbox worker it started; each with the children
they reaped). Session-scoped fixtures (one per xdist worker, shared by every later test: the Prefect test
harness's server) are charged to no test: neither their setup, nor the work their processes do later (a server's
background loops run for as long as a test takes, so charging them would make a test's CPU grow with the load),
nor the session's last teardown.

The budget (ini option `test_cpu_budget_seconds`; 0 turns it off): in `make test`, a test of the quick tier (not
marked `slow`) whose CPU seconds exceed it fails, unless it is marked `long` with a reason
(`@pytest.mark.long("why")`); `make test-all` (EVOLFORGE_SLOW=1) lists such tests at the end without failing. CPU
seconds and not wall seconds: on a shared machine a test waits for the CPU as long as others hold it, so its wall
time measures the load as much as the test, and a wall-time bound would fail at random on a busy machine. The
CPU seconds a test's processes use are what the test costs wherever it runs (within a few percent). Wall seconds
are recorded and reported beside them, with the load average, and judged by no test.

`--durations-json PATH` writes every test's record (nodeid, wall, cpu, outcome, tier) for bench scripts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")
_KEY = pytest.StashKey[dict]()
_SESSION_SETUP_CPU = [0.0]  # CPU seconds of session-fixture setups during the running test
SHARED_PIDS: set[int] = set()  # processes started by session fixtures (and their descendants): charged to no test


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue
    return out


def _process_cpu(pid: int) -> tuple[int, float]:
    """(start time, utime + stime + cutime + cstime in seconds) of one process: fields 22 and 14-17 of its stat."""
    with open(f"/proc/{pid}/stat") as fh:
        stat = fh.read()
    fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on
    return int(fields[19]), sum(int(v) for v in fields[11:15]) / _TICKS


def snapshot() -> tuple[float, dict[tuple[int, int], tuple[float, bool]]]:
    """(CPU seconds of this process, every thread, and of the children it reaped; {(pid, start time): (CPU seconds
    with its own reaped children, whether it is a child of this process)} of its live descendants)."""
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    me = os.getpid()
    stack, tree = [(c, True) for c in _children(me) if c not in SHARED_PIDS], {}
    while stack:
        pid, direct = stack.pop()
        try:
            start, cpu = _process_cpu(pid)
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
        if (pid, start) in tree:
            continue
        tree[(pid, start)] = (cpu, direct)
        stack += [(c, False) for c in _children(pid) if c not in SHARED_PIDS]
    return own, tree


def cpu_between(before, after) -> float:
    """CPU seconds this process and its descendants used between two snapshots. A child of this process that ended
    in between was reaped by it (its whole life is in the reaped children's time): its earlier share is taken
    off. A deeper descendant that ended is left out: its parent reaped it (and counts it) or it was killed with its
    parent (its share since `before` is lost: a sandbox worker or a Ray process stopped in that interval)."""
    (own0, tree0), (own1, tree1) = before, after
    total = own1 - own0
    for key, (cpu, _) in tree1.items():
        total += cpu - tree0[key][0] if key in tree0 else cpu
    total -= sum(cpu for key, (cpu, direct) in tree0.items() if direct and key not in tree1)
    return max(0.0, total)


CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1's CPU accounting (where the v2 unified tree has no cpu.stat)


class CpuMeter:
    """CPU seconds of this process and everything it starts. Exact in a cpuacct control group of its own (made when
    this process may: root, cgroup v1 cpuacct mounted), which counts a process wherever it ends up (killed with
    its parent, reparented to init); otherwise from /proc over the process tree (`snapshot`, `cpu_between`)."""

    def __init__(self) -> None:
        self.group: Path | None = None
        try:
            own = open("/proc/self/cgroup").read().split("cpuacct:", 1)[1].split("\n")[0]
            parent = CPUACCT / Path(own).relative_to("/")
            group = parent / f"evolforge-tests-{os.getpid()}"
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
            self.group, self.parent = group, parent
        except (OSError, IndexError, ValueError):
            self.group = None

    def share(self, pids: set[int]) -> None:
        """Charge the processes `pids` (and what they start later) to no test: the servers of session fixtures."""
        if self.group is None:
            return
        shared = self.group.parent / f"{self.group.name}-shared"
        try:
            shared.mkdir(exist_ok=True)
            for pid in pids:
                (shared / "cgroup.procs").write_text(str(pid))
            self.shared = shared
        except OSError:
            pass

    def mark(self):
        if self.group is not None:
            return int((self.group / "cpuacct.usage").read_text()) / 1e9
        return snapshot()

    def since(self, mark) -> float:
        if self.group is not None:
            return self.mark() - mark
        return cpu_between(mark, snapshot())

    def close(self) -> None:
        """Back into the parent group; the group is removed once empty (a process left running keeps it)."""
        if self.group is None:
            return
        for group in (self.group, getattr(self, "shared", None)):
            try:
                for pid in (group / "cgroup.procs").read_text().split():
                    (self.parent / "cgroup.procs").write_text(pid)
                group.rmdir()
            except (OSError, TypeError):
                pass


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process (every thread), the children it reaped, and its live descendants
    (with the children they reaped); for an interval, prefer cpu_between (descendants that end in it)."""
    own, tree = snapshot()
    return own + sum(cpu for cpu, _ in tree.values())


def _descendants(pids: set[int]) -> set[int]:
    out, stack = set(), list(pids)
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.add(pid)
            stack += _children(pid)
    return out


def _tier(item: pytest.Item) -> str:
    return "full" if "slow" in item.keywords else "quick"


def pytest_addoption(parser):
    parser.addini("test_cpu_budget_seconds", "CPU seconds a quick-tier test may take unless marked long (0: no "
                  "budget); see evolforge.testing.durations", default="0")
    parser.addoption("--durations-json", default=None, metavar="PATH",
                     help="write every test's wall and CPU seconds to PATH (JSON)")


_METER: list[CpuMeter] = []


def pytest_configure(config):
    config.addinivalue_line("markers", "long(reason): a quick-tier test allowed past the CPU budget, with the reason")
    _METER[:] = [CpuMeter()]


def pytest_unconfigure(config):
    for meter in _METER:
        meter.close()


def share_processes(pids: set[int]) -> None:
    """Charge the processes `pids` (and what they start later) to no test: a server that a test process starts
    for all its tests outside a session fixture (the Prefect test server, started after collection)."""
    SHARED_PIDS.update(pids)
    if _METER:
        _METER[0].share(pids)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """The setup of a session-scoped fixture is charged to no test (it serves every later test of the worker)."""
    if fixturedef.scope != "session":
        return (yield)
    before, kids = _METER[0].mark(), set(_children(os.getpid()))
    try:
        return (yield)
    finally:
        _SESSION_SETUP_CPU[0] += _METER[0].since(before)
        share_processes(_descendants(set(_children(os.getpid())) - kids))  # its servers: their later work is shared


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _SESSION_SETUP_CPU[0] = 0.0
    item.stash[_KEY] = {"mark": _METER[0].mark(), "wall0": time.monotonic(), "last": nextitem is None}
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    finally:
        rec = item.stash.get(_KEY, None)
        if rec is not None:
            rec["cpu_to_call"] = _METER[0].since(rec["mark"]) - _SESSION_SETUP_CPU[0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        rec = item.stash.get(_KEY, None)
        if rec is not None and "cpu" not in rec:
            rec["cpu"] = max(0.0, _METER[0].since(rec["mark"]) - _SESSION_SETUP_CPU[0])
            rec["wall"] = time.monotonic() - rec["wall0"]


def _enforced() -> bool:
    """The budget fails tests in the quick tier's own run (`make test`); in the full run (`make test-all`, CI:
    EVOLFORGE_SLOW=1) the tests over it are listed at the end, so that a test that got slower on CI's machine
    does not fail the whole run."""
    return os.environ.get("EVOLFORGE_SLOW") != "1"


def _reason(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("long")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("reason", "")).strip() or None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    rec = item.stash.get(_KEY, None)
    if call.when != "teardown" or rec is None or "cpu" not in rec:
        return report
    tier, cpu = _tier(item), rec["cpu"]
    if rec["last"]:  # the session's fixtures were torn down in this teardown: its CPU is theirs, not the test's
        cpu = max(0.0, rec.get("cpu_to_call", 0.0))
    report.user_properties.append(("durations", {"cpu": cpu, "wall": rec["wall"], "tier": tier,
                                                 "load": os.getloadavg()[0], "long": _reason(item)}))
    budget = float(item.config.getini("test_cpu_budget_seconds") or 0)
    if budget and tier == "quick" and cpu is not None and cpu > budget and report.passed and _enforced():
        if item.get_closest_marker("long") is None:
            report.outcome = "failed"
            report.longrepr = (
                f"durations guard: {item.nodeid} took {cpu:.1f} s of CPU (its process tree, setup to teardown; "
                f"{rec['wall']:.1f} s wall), over the quick tier's budget of {budget:g} s. Make it cheaper, mark it "
                f"@pytest.mark.long(\"why\"), or move it to the full tier (FULL_TIER in tests/conftest.py).")
        elif _reason(item) is None:
            report.outcome = "failed"
            report.longrepr = f"durations guard: {item.nodeid} is marked long without a reason"
    return report


def pytest_runtest_logreport(report):
    """On the controller (or the one process), collect the records the workers attached to their reports. A test's
    outcome is the worst of its phases (a test that failed in its call and tore down cleanly failed)."""
    rank = _OUTCOME_RANK.get(report.outcome, 0)
    if rank > _OUTCOME_RANK.get(_OUTCOMES.get(report.nodeid, "passed"), 0):
        _OUTCOMES[report.nodeid] = report.outcome
    for name, value in getattr(report, "user_properties", ()):
        if name == "durations":
            worst = _OUTCOMES.pop(report.nodeid, "passed")
            outcome = worst if _OUTCOME_RANK[worst] > rank else report.outcome
            _RECORDS[report.nodeid] = {**value, "outcome": outcome}


_RECORDS: dict[str, dict] = {}
_OUTCOMES: dict[str, str] = {}  # the worst outcome so far of each test's phases
_OUTCOME_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def module_totals(records: dict[str, dict]) -> dict[str, dict]:
    """{test module: {"tests", "wall", "cpu"}} from the per-test records."""
    out: dict[str, dict] = {}
    for nodeid, rec in records.items():
        mod = out.setdefault(nodeid.split("::", 1)[0], {"tests": 0, "wall": 0.0, "cpu": 0.0})
        mod["tests"] += 1
        mod["wall"] += rec["wall"]
        mod["cpu"] += rec["cpu"] or 0.0
    return out


def pytest_terminal_summary(terminalreporter, config):
    if not _RECORDS or hasattr(config, "workerinput"):
        return
    budget = float(config.getini("test_cpu_budget_seconds") or 0)
    quick = {k: r for k, r in _RECORDS.items() if r["tier"] == "quick" and r["cpu"] is not None}
    cpu = sum(r["cpu"] for r in _RECORDS.values() if r["cpu"] is not None)
    tr = terminalreporter
    tr.write_sep("-", "durations (wall and CPU seconds of each test's process tree)")
    tr.write_line(f"{len(_RECORDS)} tests measured: {cpu:.0f} s of CPU in tests; load average now "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if budget:
        over = sorted((r["cpu"], k) for k, r in quick.items() if r["cpu"] > budget)
        for c, k in over:
            tr.write_line(f"  over {budget:g} s CPU: {c:5.1f} s  {k}  (long: {_quick_reason(k)})")
    path = config.getoption("--durations-json")
    if path:
        with open(path, "w") as fh:
            json.dump({"records": _RECORDS, "modules": module_totals(_RECORDS)}, fh, indent=1, sort_keys=True)
        tr.write_line(f"durations written to {path}")


def _quick_reason(nodeid: str) -> str:
    return _RECORDS[nodeid].get("long") or "not marked"
