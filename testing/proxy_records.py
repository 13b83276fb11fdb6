"""The recording proxy's records as tests wait for them: a record is written after the reply is sent."""

from __future__ import annotations

import time

from evolforge.storage.proxy_sets import ProxyLayout, iter_records


def wait_for_records(layout: ProxyLayout, n: int, timeout: float = 5.0, poll: float = 0.02,
                     by_time: bool = True) -> list[dict]:
    """The records under `layout` once there are at least `n` (or whatever is there after `timeout` seconds),
    ordered by their `ts` (by_time) or as read."""
    deadline = time.time() + timeout
    while True:
        recs = list(iter_records(layout))
        if by_time:
            recs.sort(key=lambda r: r["ts"])
        if len(recs) >= n or time.time() > deadline:
            return recs
        time.sleep(poll)
