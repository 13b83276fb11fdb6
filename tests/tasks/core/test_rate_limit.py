"""Model calls respect a Prefect global concurrency limit with slot decay (a rate limit)."""

from __future__ import annotations

import time

import pytest

from evolforge.tasks.core.gateway import Gateway, GatewayError
from evolforge.testing.settings import make_settings

pytestmark = pytest.mark.usefixtures("prefect_harness")
MSG = [{"role": "user", "content": "hi"}]


def _create_limit(name: str, limit: int, decay: float) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=name, limit=limit, slot_decay_per_second=decay))


def test_calls_are_paced_by_the_global_limit(server):
    _create_limit("evolforge-test-rate", limit=1, decay=4.0)  # at most ~4 calls per second
    settings = make_settings(server.base_url, gateway={"global_concurrency_limit": "evolforge-test-rate"})
    gw = Gateway(settings, base_url=server.base_url, run_id="r")
    t0 = time.perf_counter()
    for i in range(6):
        gw.chat("evolve", MSG, task_id=f"t{i}")
    elapsed = time.perf_counter() - t0
    assert elapsed >= 5 / 4 * 0.8  # 6 calls at 4/s need at least ~1.25 s
    assert len(server.posts()) == 6


def test_missing_limit_is_a_clear_fatal_error(server):
    settings = make_settings(server.base_url, gateway={"global_concurrency_limit": "no-such-limit"})
    gw = Gateway(settings, base_url=server.base_url, run_id="r")
    with pytest.raises(GatewayError) as ei:
        gw.chat("evolve", MSG, task_id="t")
    assert ei.value.fatal and "prefect gcl create no-such-limit" in str(ei.value)
    assert len(server.posts()) == 0
