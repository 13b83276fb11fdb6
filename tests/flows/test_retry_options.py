"""A batch's retries come from `runner.batch_retries` and `runner.retry_delay_seconds` (flows/_fanout.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

from evolforge.config.sections.runtime import RunnerSettings
from evolforge.config.settings import load_settings
from evolforge.flows._fanout import BATCH_TASK_OPTIONS, BatchesFailed, retry_options, run_batches


@task(**BATCH_TASK_OPTIONS)
def _flaky(counter: str, fail_times: int, batch: int) -> dict:
    """Fails with a dropped connection (transient) the first `fail_times` attempts of each batch."""
    f = Path(counter) / f"b{batch}"
    n = int(f.read_text()) + 1 if f.exists() else 1
    f.write_text(str(n))
    if n <= fail_times:
        raise ConnectionResetError("the endpoint dropped the connection")
    return {"batch": batch, "attempts": n}


def _run(tmp_path: Path, fail_times: int, retries: int, delay: float) -> list[dict]:
    @flow(name="retry-options")
    def f() -> list[dict]:
        with ThreadPoolTaskRunner(max_workers=2) as runner:
            return run_batches(runner, _flaky, [(f"b-{b}", dict(counter=str(tmp_path), fail_times=fail_times, batch=b))
                                                 for b in range(2)],
                               what="test", checkpoints=tmp_path, retry=retry_options(retries, delay))
    return f()


def test_the_defaults_wait_5_then_10_seconds():
    cfg = load_settings(None, environ={}).runner
    assert (cfg.batch_retries, cfg.retry_delay_seconds) == (2, 5.0) == (RunnerSettings().batch_retries,
                                                                         RunnerSettings().retry_delay_seconds)
    opts = retry_options(cfg.batch_retries, cfg.retry_delay_seconds)
    assert opts["retries"] == 2 and opts["retry_delay_seconds"](2) == [5, 10]
    assert retry_options(3, 0.5)["retry_delay_seconds"](3) == [0.5, 1.0, 2.0]
    assert retry_options(0, 5) == {"retries": 0, "retry_delay_seconds": 0}


def test_a_transient_failure_is_retried_as_often_as_configured(tmp_path):
    got = _run(tmp_path, fail_times=1, retries=1, delay=0.05)
    assert [r["attempts"] for r in got] == [2, 2]


def test_no_retries_means_the_first_transient_failure_fails_the_batch(tmp_path):
    with pytest.raises(BatchesFailed):
        _run(tmp_path, fail_times=1, retries=0, delay=0.05)
    assert sorted(p.read_text() for p in tmp_path.glob("b*")) == ["1", "1"]  # one attempt each, none retried


def test_settings_reject_a_negative_delay():
    with pytest.raises(Exception, match="retry_delay_seconds"):
        load_settings(None, {"runner": {"retry_delay_seconds": -1}}, environ={})
